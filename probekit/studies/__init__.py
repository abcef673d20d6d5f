"""The studies probekit replicates, each defined by a data file under `data/`."""
