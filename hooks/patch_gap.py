"""Trace the intergroup empathy gap inside the model: activation patching and a gap direction.

For a few crowd-enVent events, score every named perceiver x experiencer prompt of one category
exactly (expected intensity from the logits), keeping the experiencer-span states of every layer.
Then patch the clean in-group activation into the out-group run at each (layer, site, span) of
the pairs with the largest gap (patching.parquet, patching.png, the top five printed), and fit
the in-group/out-group direction at the experiencer span, project it out at the best layer and
recompute Δ (directions.parquet, causal_check.json). The same as `probekit patch intergroup`.

    python hooks/patch_gap.py --out runs/patch_gap
"""

import sys

from probekit.cli.main import study_script

if __name__ == "__main__":
    sys.exit(
        study_script("patch", "intergroup", "patch_gap.py", sys.argv[1:], out="runs/patch_gap")
    )
