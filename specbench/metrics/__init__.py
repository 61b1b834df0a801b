"""Pure metric functions (no torch, no I/O)."""

from specbench.metrics.acceptance import (  # noqa: F401
    acceptance_metrics,
    accepted_histogram,
    harmonic_mean,
    position_acceptance,
    position_rates,
    position_reached,
    position_stats,
)
from specbench.metrics.costmodel import cost_terms, eq14_speedup, predicted_speedup  # noqa: F401
from specbench.metrics.steps import StepStats, as_steps  # noqa: F401
