"""The `probekit` command line: one module per command, each a thin wrapper over a function."""

from probekit.cli.main import main, run_script, study_command, study_script

__all__ = ["main", "run_script", "study_command", "study_script"]
