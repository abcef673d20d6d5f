"""Trace the intergroup empathy gap inside the model: activation patching and a gap direction.

For a few crowd-enVent events, take every named perceiver x experiencer prompt of one category
and patch the interaction Δ measures: for every two identities of different groups, the 2x2
sets of their cells (one swapping the experiencer, one the perceiver), the clean activation
patched into the corrupt run at each (layer, site, span), recovery of the
difference-in-differences with intervals over events (patching.parquet,
patching_summary.csv, patching.png, the top five measured components printed); then fit the
in-group/out-group direction at the experiencer span, cross-fitted over events, project it out
and recompute Δ beside random directions (directions.parquet, causal_check.json). The same as
`probekit patch intergroup`.

    python hooks/patch_gap.py --out runs/patch_gap
"""

import sys

from probekit.cli.main import study_script

if __name__ == "__main__":
    sys.exit(
        study_script("patch", "intergroup", "patch_gap.py", sys.argv[1:], out="runs/patch_gap")
    )
