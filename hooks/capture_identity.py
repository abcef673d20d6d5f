"""Capture activations at the identity spans of intergroup-study prompts.

For a few crowd-enVent events and every perceiver x experiencer pair of one category, render the
study's prompts, locate the spans `perceiver`, `experiencer`, `emotion`, `event` and `answer`,
and store `hook_resid_pre`, `hook_attn_out`, `hook_mlp_out` and `hook_resid_post` (TransformerLens
names; `--hooks nnsight` reads the same sites through nnsight) at the chosen layers as fp16
safetensors shards plus an index parquet (see mechanism.capture). Re-running into the same --out
skips prompts already captured. The same as `probekit capture intergroup [options]`.

    python hooks/capture_identity.py --out captures/religion
"""

import sys

from probekit.cli.main import study_script

if __name__ == "__main__":
    sys.exit(
        study_script(
            "capture",
            "intergroup",
            "capture_identity.py",
            sys.argv[1:],
            out="runs/capture_identity",
        )
    )
