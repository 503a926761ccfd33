"""`python -m vriksha` runs the `vriksha` command."""

from vriksha.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
