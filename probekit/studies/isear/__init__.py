"""GenderBench's ISEAR probe (Pikuliak et al., genderbench==1.1.0), exact and generated: see
README.md."""

from probekit.studies.isear.study import STUDY  # registers the study

__all__ = ["STUDY"]
