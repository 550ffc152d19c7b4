"""`python -P -m kernel -f {connection_file}`: what kernel.json's argv runs.

The working directory is checked before anything else is imported (`safe_path`): the
kernel imports lazily from `sys.path`, and the notebook's folder must not be on it."""

from .safe_path import check_or_exit

check_or_exit()

from .app import main  # noqa: E402 (after the check, on purpose)

if __name__ == "__main__":
    main()
