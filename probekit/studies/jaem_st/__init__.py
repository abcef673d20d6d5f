"""JaEm-ST (seed 002): intersectional cognitive empathy from exact A–E choices; see README.md."""

from probekit.studies.jaem_st.study import STUDY  # registers the study

__all__ = ["STUDY"]
