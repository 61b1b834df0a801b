"""SWIFT's on-the-fly layer-set search (Xia et al., ICLR 2025, section 4.1), as the authors' code does it
(github.com/hemingkx/SWIFT, model/swift/utils.py: `swift_optimization`, `layer_random_search`,
`layer_bayes_search`, `get_next_point_to_probe`; evaluation_llama/inference_swift.py).

The search space: the attention and MLP sub-layers of layers 1 .. L-2 (the first and the last layer are
never skipped), 2(L-2) coordinates: coordinate i < L-2 is the attention of layer i+1, coordinate
L-2+i the MLP of layer i+1. A candidate skips exactly m = int(2(L-2) * skip_ratio) of them.

One iteration (`candidate`, then `update` with the candidate's score):
- the candidate is random (m coordinates drawn without replacement) except every `bayes_interval`-th
  iteration ((iteration + 1) % bayes_interval == 0, with `bayes` on), when a Gaussian process over all
  probed points (0/1 vectors, or the continuous point a Bayesian step suggested) suggests a point
  in [0, 1]^(2(L-2)) and the m largest coordinates are skipped;
- its score is the "matchness" the method measures (the share of the generated context the skipped
  model predicts, methods/swift.py); every probed point and score joins the GP's observations;
- a candidate scoring above the best score so far becomes the layer set (the best score starts at 0,
  so the first candidate scoring above 0 replaces the initial set, which is never scored); a score
  above `max_score` ends the search; otherwise the set in use stays and the tolerance count grows;
- the search also ends after more than `max_tolerance_iter` iterations in a row without improvement or
  more than `max_opt_iter` iterations.

The Gaussian process restates what the authors call (bayes_opt's BayesianOptimization, set_gp_params
alpha=1e-2, UtilityFunction ucb kappa=2.5): a Matern-5/2 kernel with one length scale, targets
normalised, noise 1e-2, the upper confidence bound mean + 2.5 std maximised over 10,000 uniform random
points. Deviations: the length scale is the best of two log grids by marginal likelihood (sklearn fits it
with L-BFGS-B and 5 restarts), and the acquisition is not polished by L-BFGS-B from 10 seeds after
the random points (only the ranking of coordinates matters here). Host computation only: nothing of
the search touches the model's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import cho_solve, solve_triangular

from specbench.core.errors import SpecBenchError
from specbench.models import LayerSkip

KAPPA = 2.5  # the authors' UtilityFunction(kind="ucb", kappa=2.5)
NOISE = 1e-2  # optimizer.set_gp_params(alpha=1e-2)
ACQ_POINTS = 10_000  # bayes_opt's acq_max n_warmup
COARSE = np.logspace(-2, 3, 11)  # length scales tried first

SETTINGS = {  # key: (type, lower bound, upper bound), checked when the method is built in-process too
    "skip_ratio": (float, 0.0, 1.0), "context_window": (int, 1, None), "opt_interval": (int, 1, None),
    "bayes_interval": (int, 1, None), "max_opt_iter": (int, 0, None), "max_tolerance_iter": (int, 0, None),
    "max_score": (float, 0.0, 1.0),
}


@dataclass(frozen=True)
class Settings:
    skip_ratio: float
    context_window: int
    opt_interval: int
    bayes_interval: int
    max_opt_iter: int
    max_tolerance_iter: int
    max_score: float
    bayes: bool
    optimize: bool

    @classmethod
    def from_cfg(cls, cfg) -> Settings:
        out = {}
        for key, (kind, lo, hi) in SETTINGS.items():
            v = getattr(cfg, key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
            if not ok or v < lo or (hi is not None and v > hi):
                rule = f"an integer >= {lo}" if kind is int else f"a number in [{lo}, {hi}]"
                raise SpecBenchError(f"method.{key}={v} is not allowed; expected {rule}")
            out[key] = kind(v)
        for key in ("bayes", "optimize"):
            if not isinstance(getattr(cfg, key), bool):
                raise SpecBenchError(f"method.{key}={getattr(cfg, key)} is not allowed; expected true or false")
            out[key] = getattr(cfg, key)
        return cls(**out)


def num_coords(num_layers: int) -> int:
    return 2 * max(0, num_layers - 2)


def num_skipped(num_layers: int, ratio: float) -> int:
    return int(num_coords(num_layers) * ratio)


def skip_of(coords, num_layers: int) -> LayerSkip:
    """The layer set of the skipped coordinates (the authors' index mapping)."""
    half = num_layers - 2
    coords = [int(c) for c in coords]
    return LayerSkip(attn=frozenset(c + 1 for c in coords if c < half),
                     mlp=frozenset(c - half + 1 for c in coords if c >= half))


def point_of(skip: LayerSkip, num_layers: int) -> list[float]:
    """`get_next_point_to_probe`: the 0/1 vector of a layer set."""
    half = num_layers - 2
    return [float(i + 1 in skip.attn) for i in range(half)] + [float(i + 1 in skip.mlp) for i in range(half)]


def unified_init(num_layers: int) -> LayerSkip:
    """The authors' initial set: attention and MLP of every odd layer in 1 .. L-2."""
    odd = frozenset(range(1, num_layers - 1, 2))
    return LayerSkip(attn=odd, mlp=odd)


def top_coords(point, m: int) -> list[int]:
    """`layer_bayes_search`: the m largest coordinates of a suggested point (ties: lower index first)."""
    order = sorted(range(len(point)), key=lambda i: -point[i])
    return sorted(order[:m])


@dataclass
class SearchState:
    """What the search carries from step to step and sample to sample (the authors' `statistics`,
    their optimizer's observations and the model's current layer set)."""

    skip: LayerSkip
    active: bool = True  # statistics["optimization"]
    best: float = 0.0  # statistics["origin_score"]
    iters: int = 0  # statistics["opt_iter"]
    tolerance: int = 0  # statistics["tolerance_iter"]
    stopped: str | None = None  # why the search ended
    points: list[list[float]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    rng: np.random.Generator | None = None  # seeded by the first measured generation


def candidate(state: SearchState, s: Settings, num_layers: int) -> tuple[LayerSkip, list[float], str]:
    """The next candidate: (layer set, the point registered with its score, "random" | "bayes")."""
    m = num_skipped(num_layers, s.skip_ratio)
    n = num_coords(num_layers)
    if s.bayes and (state.iters + 1) % s.bayes_interval == 0 and state.points:
        point = gp_ucb_point(np.array(state.points), np.array(state.scores), state.rng)
        return skip_of(top_coords(point, m), num_layers), [float(x) for x in point], "bayes"
    coords = state.rng.choice(n, m, replace=False) if m else []
    skip = skip_of(coords, num_layers)
    return skip, point_of(skip, num_layers), "random"


def update(state: SearchState, s: Settings, candidate: LayerSkip, point: list[float], score: float) -> bool:
    """The authors' update after scoring a candidate; True when it became the layer set."""
    state.points.append(list(point))
    state.scores.append(float(score))
    adopted = score > state.best
    if adopted:
        state.best, state.tolerance, state.skip = float(score), 0, candidate
        if score > s.max_score:
            state.active, state.stopped = False, "max_score"
    else:
        state.tolerance += 1
    state.iters += 1
    if state.tolerance > s.max_tolerance_iter:
        state.active, state.stopped = False, "max_tolerance_iter"
    if state.iters > s.max_opt_iter:
        state.active, state.stopped = False, "max_opt_iter"
    return adopted


# -- the Gaussian process ----------------------------------------------------------------------
def sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def matern52(sq: np.ndarray, length: float) -> np.ndarray:
    """The Matern nu=5/2 kernel (sklearn's, amplitude 1) of squared distances."""
    d = np.sqrt(5.0 * sq) / length
    return (1.0 + d + d * d / 3.0) * np.exp(-d)


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(length scale, Cholesky factor, K^-1 y) of the length scale with the highest log marginal
    likelihood: a half-decade grid over 1e-2 .. 1e3, then a finer one around its best."""
    sq = sq_dists(x, x)
    best = None
    for grid in (COARSE, None):
        if grid is None:  # the finer grid: +-half a decade around the coarse best
            grid = best[1] * np.logspace(-0.5, 0.5, 9)
        for length in grid:
            try:
                chol = np.linalg.cholesky(matern52(sq, length) + NOISE * np.eye(len(x)))
            except np.linalg.LinAlgError:
                continue
            alpha = cho_solve((chol, True), y)
            lml = -0.5 * y @ alpha - np.log(np.diag(chol)).sum()
            if best is None or lml > best[0]:
                best = (lml, float(length), chol, alpha)
        if best is None:
            raise SpecBenchError("SWIFT's Gaussian process found no positive-definite kernel")
    return best[1], best[2], best[3]


def gp_ucb_point(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The random point (of ACQ_POINTS) with the highest mean + KAPPA * std under the fitted GP."""
    mean, std = y.mean(), y.std() or 1.0
    length, chol, alpha = _fit(x, (y - mean) / std)
    cand = rng.random((ACQ_POINTS, x.shape[1]))
    ucb = np.empty(ACQ_POINTS)
    for lo in range(0, ACQ_POINTS, 1000):  # bounded memory: 1000 x n kernel rows at a time
        ks = matern52(sq_dists(cand[lo:lo + 1000], x), length)
        v = solve_triangular(chol, ks.T, lower=True)
        var = np.maximum(1.0 - (v * v).sum(0), 0.0)
        ucb[lo:lo + 1000] = ks @ alpha + KAPPA * np.sqrt(var)
    return cand[int(ucb.argmax())]
