"""`python -m translate`: see `translate.cli`."""

from translate.cli import main

if __name__ == "__main__":
    main()
