"""`python -P -m kernel -f {connection_file}`: what kernel.json's argv runs.

The working directory is checked before anything else is imported (`safe_path`): the
kernel imports lazily from `sys.path`, and the notebook's folder must not be on it. What
no kernel process uses is left out before anything imports it (`lean_imports`)."""

from .safe_path import check_or_exit

check_or_exit()

from sandbox.common.lean_imports import HTTPX_COMMAND_LINE, leave_out  # noqa: E402 (after the check)

leave_out(HTTPX_COMMAND_LINE)  # before the first import of httpx (sandbox.client's)

from .app import main  # noqa: E402 (after the check and the leaving out, on purpose)

if __name__ == "__main__":
    main()
