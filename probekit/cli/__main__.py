"""`python -m probekit.cli ...` is the `probekit` command."""

from probekit.cli.main import main

raise SystemExit(main())
