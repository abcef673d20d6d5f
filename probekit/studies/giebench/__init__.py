"""GIEBench (group-identity-based empathy verdicts over four answers): see README.md."""

from probekit.studies.giebench.study import STUDY  # registers the study

__all__ = ["STUDY"]
