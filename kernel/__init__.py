"""Jupyter kernel "Python (sandbox)": runs each cell in a stateful sandbox on the
sandbox-kernel server. `python -P -m kernel -f CONNECTION_FILE` starts it; `install` puts
its kernelspec where Jupyter finds it."""

__version__ = "0.1.0"
