"""The `probekit` command line: it parses a command's options and calls the command's runner
(`probekit.run.COMMANDS`)."""

from probekit.cli.main import main, run_script, study_script

__all__ = ["main", "run_script", "study_script"]
