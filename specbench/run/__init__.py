"""A run's lifecycle (`python -m specbench`): the runner, its locked run directory, first-use
training, warm-up, provenance, interference checks, the start-up T(k) profile and the summary.
Imports what it runs (config/, models/, methods/, train/, tasks/, ...); only tools/, report/,
vllm_engine/ and cli.py import it."""
