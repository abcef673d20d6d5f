"""The studies probekit runs, one folder each (probe, metrics, figures, README card), on the
contract of `probekit.studies.base`."""

from probekit.studies.base import Context, Probe, Study, Summary, get_study, list_studies, register

__all__ = ["Context", "Probe", "Study", "Summary", "get_study", "list_studies", "register"]
