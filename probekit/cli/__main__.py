"""`python -m probekit.cli ...` is the `probekit` command."""

from probekit.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
