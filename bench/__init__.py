"""Benchmarks of sandbox-kernel against its baselines; run with `python -m bench` (see bench/README.md)."""
