"""`python -m zonebus` runs the command-line interface."""

from zonebus.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
