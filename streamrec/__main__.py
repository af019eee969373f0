"""`python -m streamrec`: see `streamrec.cli`."""

from streamrec.cli import main

if __name__ == "__main__":
    main()
