"""The intergroup empathy gap (Hou, Daumé III & Rudinger, NAACL 2025), end to end.

    python experiments/intergroup_gap.py                       # default model, religion, P0S0T0
    python experiments/intergroup_gap.py --category all --setting all --events all --out runs/full
    torchrun --nproc_per_node 2 experiments/intergroup_gap.py --out runs/two   # same result, split

Scores every perceiver x experiencer x event prompt (`a person` included), exactly from the
logits (`--view exact`) or by greedy generation + the paper's parse (`--view generate`, which also
records the exact scores), then writes scores.parquet, manifest.json, heatmap.png, summary.csv
and summary.md. Re-running the same command resumes an interrupted run. The same as
`probekit run intergroup [options]`; data: --data ROOT, else $PROBEKIT_DATA, else the user cache,
else a download of crowd-enVent from its pinned source (sha256-checked), else probekit's sample.
"""

import sys

from probekit.cli.main import study_script

if __name__ == "__main__":
    sys.exit(study_script("run", "intergroup", "intergroup_gap.py", sys.argv[1:]))
