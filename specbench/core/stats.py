"""Small statistics helpers for the report: repeat spreads and the paired per-sample test."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np


def mean_std(values) -> tuple[float | None, float | None, int]:
    """Mean and sample standard deviation (ddof=1; None for fewer than two values) of the non-None values."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


@dataclass
class PairedTest:
    n: int                    # number of matched pairs
    statistic: float | None
    p_value: float | None     # None: too few pairs or all differences zero
    median_diff: float | None  # median of (b - a): > 0 means b is faster
    note: str = ""


def wilcoxon_paired(a: dict, b: dict) -> PairedTest:
    """Two-sided Wilcoxon signed-rank test on values matched by key (sample id).

    `a` and `b` map sample id -> per-sample tokens/s. Only ids present in both (with numeric
    values) are used. scipy.stats.wilcoxon with its defaults (zero_method="wilcox", exact
    distribution for small n without ties/zeros, normal approximation otherwise).
    """
    from scipy.stats import wilcoxon

    keys = sorted(k for k in set(a) & set(b) if a[k] is not None and b[k] is not None)
    x = [float(a[k]) for k in keys]
    y = [float(b[k]) for k in keys]
    n = len(keys)
    if n == 0:
        return PairedTest(0, None, None, None, "no matched samples")
    diffs = [yi - xi for xi, yi in zip(x, y)]
    med = statistics.median(diffs)
    if all(d == 0 for d in diffs):
        return PairedTest(n, None, None, med, "all differences zero")
    if n < 2:
        return PairedTest(n, None, None, med, "fewer than 2 pairs")
    try:
        res = wilcoxon(x, y)
    except ValueError as e:  # scipy refuses some degenerate inputs
        return PairedTest(n, None, None, med, str(e))
    p = float(res.pvalue)
    return PairedTest(n, float(res.statistic), None if math.isnan(p) else p, med)


def pooled_speedup_ci(pairs, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the pooled speedup over samples.

    `pairs`: per sample (ar_tokens, ar_wall, method_tokens, method_wall). The statistic is the
    pooled ratio (sum m_tok / sum m_wall) / (sum a_tok / sum a_wall), recomputed on `resamples`
    seeded resamplings of the samples with replacement (samples are the unit: AR and method of
    one sample stay paired). None for fewer than two usable samples.
    """
    data = np.array([p for p in pairs if all(v is not None for v in p) and p[0] > 0 and p[1] > 0 and p[3] > 0], dtype=float)
    if len(data) < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    s = data[idx].sum(axis=1)  # [resamples, 4]
    ratios = (s[:, 2] / s[:, 3]) / (s[:, 0] / s[:, 1])
    alpha = (1 - level) / 2
    lo, hi = np.quantile(ratios, [alpha, 1 - alpha])
    return float(lo), float(hi)
