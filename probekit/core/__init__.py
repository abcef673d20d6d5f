"""The core layer: errors, paths, file I/O, answer sets, items and prompts, option types.

Imports nothing from the rest of probekit, and no model library."""
