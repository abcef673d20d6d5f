"""Oracles for tests and benchmarks, not used by probekit itself: brute-force and
log-likelihood references of the exact scorer, and random-weight models for speed runs."""
