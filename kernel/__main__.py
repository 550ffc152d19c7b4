"""`python -m kernel -f {connection_file}`: what kernel.json's argv runs."""

from .app import main

if __name__ == "__main__":
    main()
