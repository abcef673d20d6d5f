"""The intergroup empathy gap study (Hou, Daumé III & Rudinger, NAACL 2025): see README.md."""

from probekit.studies.intergroup.probe import (
    SETTINGS,
    IntergroupProbe,
    get_category,
    get_setting,
    render_messages,
)
from probekit.studies.intergroup.study import STUDY  # registers the study

__all__ = ["SETTINGS", "STUDY", "IntergroupProbe", "get_category", "get_setting", "render_messages"]
