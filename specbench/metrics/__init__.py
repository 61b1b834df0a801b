"""Pure metric functions (no torch, no I/O)."""

from specbench.metrics.acceptance import acceptance_metrics, harmonic_mean, position_acceptance  # noqa: F401
from specbench.metrics.costmodel import cost_terms, eq14_speedup, predicted_speedup  # noqa: F401
from specbench.metrics.steps import StepStats, as_steps  # noqa: F401
