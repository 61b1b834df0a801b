"""Thompson sampling with calibration (EESD, Liu et al., section 3.3 and Appendix B, Algorithm 3, eqs. 5-10)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from specbench.models.artifacts import PUBLISHED, check_state, file_sha256, load_checkpoint
from specbench.control.base import Controller, DraftInfo, DraftRef, check_round, register_controller
from specbench.control.beta_ts import COUNTS, bernoulli, round_counts
from specbench.core.errors import SpecBenchError, choice_error


RETRAIN = "re-create it with `python -m specbench.train method=eesd`"

class CaliPredictor(nn.Module):
    """EESD eq. 5: theta_M = sigmoid(W_p [W^i H_t^(T); H_{t+i}^(D)]), the probability that the i-th
    draft token equals the target's token.

    H_t^(T) is the target's last hidden state at the last verified token, H_{t+i}^(D) the draft's at
    the i-th draft token; one W^i in R^{d x d} per draft position, shared from i = max_i (10) on. The
    paper's W_p in R^{2 x 2d} with a 2-class softmax equals our W_p in R^{1 x 2d} plus bias with a
    sigmoid (softmax over two logits is the sigmoid of their difference).
    """

    def __init__(self, d: int, max_i: int = 10):
        super().__init__()
        self.d, self.max_i = int(d), int(max_i)
        # Identity W^i and a zero W_p: a deterministic start (p = 0.5) that needs no global seed.
        self.W = nn.Parameter(torch.eye(self.d).repeat(self.max_i, 1, 1))
        self.proj = nn.Linear(2 * self.d, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def logits(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        th, dh = target_hidden.to(w), draft_hidden.to(w)  # methods may hand bf16/fp16 states
        idx = i.to(w.device).long().clamp(1, self.max_i) - 1
        # One matmul per position, each row keeping its own: gathering W[idx] would cost B*d*d
        # memory, and picking the distinct positions (unique) reads values back from the device.
        z = torch.zeros_like(th)
        for k in range(self.max_i):
            z = torch.where((idx == k).unsqueeze(-1), th @ self.W[k].T, z)
        return self._read(z, dh)

    def _read(self, z: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        """W_p [W^i H^(T); H^(D)] (+ bias) from z = W^i H^(T)."""
        return self.proj(torch.cat([z, draft_hidden.to(z)], dim=-1)).squeeze(-1)

    def forward(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        """[B, d], [B, d], [B] (1-based positions) -> acceptance probability [B]."""
        return torch.sigmoid(self.logits(target_hidden, draft_hidden, i))

    def at(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor, i: int) -> torch.Tensor:
        """`forward` for rows that share one position the host knows (a decode step): W^i is picked
        on the host, one d x d matmul instead of max_i, the same values bit for bit. Drafting calls
        this once per draft token, where the ten matmuls cost as much as a decoder layer."""
        z = target_hidden.to(self.proj.weight) @ self.W[min(max(int(i), 1), self.max_i) - 1].T
        return torch.sigmoid(self._read(z, draft_hidden))

    def train_on(self, examples, epochs: int = 3, lr: float = 1e-3, batch_size: int = 64, seed: int = 0) -> list[float]:
        """Fit on (target_hidden [N, d], draft_hidden [N, d], i [N], label [N]) with binary cross-entropy;
        label 1 when the draft token equalled the target's token. Returns the mean loss of each epoch."""
        with torch.enable_grad():  # callers may be inside no_grad (a run, a bench)
            return self._fit(examples, epochs, lr, batch_size, seed)

    def _fit(self, examples, epochs, lr, batch_size, seed) -> list[float]:
        th, dh, pos, label = examples
        dev = self.proj.weight.device
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(int(seed))
        self.train()
        losses = []
        for _ in range(int(epochs)):
            total, order = 0.0, torch.randperm(len(label), generator=gen)
            for b in order.split(int(batch_size)):
                y = label[b].to(dev, torch.float32)
                loss = nn.functional.binary_cross_entropy_with_logits(
                    self.logits(th[b].to(dev), dh[b].to(dev), pos[b]), y.to(self.proj.weight.dtype))
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item() * len(b)
            losses.append(total / len(label))
        self.eval()
        return losses

    def save(self, path: str | Path) -> None:
        torch.save({"state_dict": self.state_dict(), "d": self.d, "max_i": self.max_i}, path)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "CaliPredictor":
        try:  # weights_only: a crafted file cannot run code; a damaged one is a one-line error
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001
            reason = (str(e).splitlines() or [type(e).__name__])[0][:120]
            raise SpecBenchError(f"Cali-TS predictor {path} is damaged or not a CaliPredictor.save file ({reason}); "
                                 f"{RETRAIN}") from None
        if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
            raise SpecBenchError(f"Cali-TS predictor {path} is not a CaliPredictor.save file (no state_dict); {RETRAIN}")
        state = ckpt["state_dict"]
        d, max_i = cls.sizes(state, path)
        if (ckpt.get("d"), ckpt.get("max_i")) != (d, max_i):
            raise SpecBenchError(f"Cali-TS predictor {path} says d={ckpt.get('d')!r}, max_i={ckpt.get('max_i')!r}, "
                                 f"its weights are for d={d}, max_i={max_i}; {RETRAIN}")
        return cls.from_state(state, d, max_i, path).eval()

    @staticmethod
    def sizes(state: dict, path) -> tuple[int, int]:
        """(d, max_i) from the weights' own shapes (W: [max_i, d, d]), read before anything is built:
        a number in a small file must never size a large allocation."""
        w = state.get("W") if isinstance(state, dict) else None
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.shape[1] != w.shape[2] or 0 in w.shape:
            raise SpecBenchError(f"Cali-TS predictor {path}: 'W' must be a [max_i, d, d] tensor; {RETRAIN}")
        return int(w.shape[1]), int(w.shape[0])

    @classmethod
    def from_state(cls, state: dict, d: int, max_i: int, path) -> "CaliPredictor":
        expected = {"W": ((max_i, d, d), torch.float32), "proj.weight": ((1, 2 * d), torch.float32),
                    "proj.bias": ((1,), torch.float32)}
        check_state(state, expected, path, RETRAIN)  # every shape follows from W's: checked before building
        model = cls(d, max_i)
        model.load_state_dict(state)
        return model


def check_pairing(ckpt: dict, draft: DraftRef) -> None:
    """The predictor reads the exit layer's hidden states: one trained with another exit layer (the
    exit layer retrained with train.cali=false, or a local exit layer beside the published predictor)
    predicts for states it never saw. Its settings record the exit layer's hash; a predictor from
    before that key is paired by where both come from (published with published, cache with cache)."""
    if not draft.checkpoint:
        return
    recorded = (ckpt.get("settings") or {}).get("exit_layer_sha256")
    exit_path, pred_path = Path(draft.checkpoint), Path(ckpt["path"])
    if recorded:
        other = recorded != file_sha256(exit_path)
    else:
        other = (PUBLISHED in pred_path.parents) != (PUBLISHED in exit_path.parents)
    if other:
        raise SpecBenchError(f"Cali-TS predictor {pred_path} was trained with another EESD exit layer than {exit_path}; "
                             "train both together (`python -m specbench.train method=eesd`, train.cali=true) "
                             "or run without it (control.predictor=none)")


@register_controller
class CaliTS(Controller):
    """Cali-TS: a Gaussian posterior over theta that mixes a trained predictor with the sample mean.

    Per draft token i (eqs. 6, 7/9):
        theta_M  = predictor(target_hidden, draft_hidden, i), or theta0 without a predictor
        mu       = s_S^2 / (n s_M^2 + s_S^2) * theta_M + n s_M^2 / (n s_M^2 + s_S^2) * theta_hat
        sigma^2  = s_M^2 s_S^2 / (s_S^2 + n s_M^2)
        theta ~ N(mu, sigma^2) clipped to [0, 1];  chi ~ Bernoulli(theta);  stop when chi = 0
    where n counts the verifications so far. Early on mu follows the predictor, later the sample mean.
    Without a predictor theta_M is the constant theta0, so this is the paper's "w/o Model-Prediction"
    ablation: sample mean only, shrunk towards theta0 while n is small.

    sigma_m (s_M, the predictor's error), sigma_s (s_S, the spread of one round's mean chi) and theta0
    (theta_hat before any round) have no values in the paper; 0.2, 0.3 and 0.5 are our choices.

    After verification n += 1 and theta_hat is updated by `theta_update`:
      - "mean" (default): the running mean of chi under Beta-TS's accounting (`counts`, see
        beta_ts.BetaTS; default "consistent": r = n_accepted successes out of
        min(n_accepted + 1, n_drafted) trials), with theta0 as one pseudo-observation:
        theta_hat = (theta0 + sum r) / (1 + sum trials).
      - "paper": eq. 10 as printed, theta_hat_t = (theta_hat_{t-|Q_v|} (t - |Q_v| + 1) + |Q_v|) / (t + 1)
        with t the output tokens so far and |Q_v| = n_accepted + 1. It counts every output token as a
        success, so theta_hat -> 1 whatever the acceptance; kept for fidelity to the text only.

    `reset_per_sequence` (default True) restarts n and theta_hat at each sequence.
    `predictor`: a CaliPredictor, a path to one saved with CaliPredictor.save, or None.
    """

    name = "cali_ts"

    def __init__(self, sigma_m: float, sigma_s: float, theta0: float, theta_update: str,
                 predictor: CaliPredictor | str | Path | None, reset_per_sequence: bool, counts: str, k_max: int,
                 seed: int, predictor_path: str | None = None, **kw):
        super().__init__(k_max=k_max, seed=seed, **kw)
        if float(sigma_m) <= 0 or float(sigma_s) <= 0:
            raise SpecBenchError(f"control.sigma_m and control.sigma_s must be > 0, got {sigma_m}, {sigma_s}")
        if not 0.0 <= float(theta0) <= 1.0:
            raise SpecBenchError(f"control.theta0 must be in [0, 1], got {theta0}")
        if theta_update not in ("mean", "paper"):
            raise SpecBenchError(f"unknown control.theta_update {theta_update!r}; allowed: mean, paper")
        self.sigma_m, self.sigma_s, self.theta0 = float(sigma_m), float(sigma_s), float(theta0)
        self.theta_update = theta_update
        if counts not in COUNTS:
            raise choice_error("control.counts", counts, COUNTS)
        self.counts = counts
        self.reset_per_sequence = bool(reset_per_sequence)
        if isinstance(predictor, (str, Path)):
            predictor = CaliPredictor.load(predictor)
        self.predictor = predictor.eval() if predictor is not None else None
        self.needs_hidden = predictor is not None
        self.predictor_path = predictor_path
        self._restart()
        self.mu = self.sigma2 = self.theta_m = self.theta = None

    @classmethod
    def attach(cls, params: dict, draft: DraftRef | None) -> dict:
        """`predictor: null|auto` with a draft that has a trained predictor (EESD's early exit,
        trained with it by `python -m specbench.train method=eesd`): use it; else none."""
        if params.get("predictor") == "none":  # the paper's "w/o model prediction" ablation, trained predictor or not
            return params | {"predictor": None}
        if params.get("predictor") not in (None, "auto") or draft is None:
            return params if params.get("predictor") != "auto" else params | {"predictor": None}
        ckpt = load_checkpoint("cali", draft.model_key, draft.structure, "auto", required=False)
        if ckpt is None:
            return params | {"predictor": None}
        d, max_i = CaliPredictor.sizes(ckpt["state"], ckpt["path"])
        if draft.hidden_size is not None and d != draft.hidden_size:
            raise SpecBenchError(f"Cali-TS predictor {ckpt['path']} is for hidden size {d}, the draft's is "
                                 f"{draft.hidden_size}; {ckpt['fix']}")
        check_pairing(ckpt, draft)
        pred = CaliPredictor.from_state(ckpt["state"], d, max_i, ckpt["path"])
        # on the draft's device (no host copy of each hidden state); float32 whatever the model
        # dtype: its inputs are cast to its weights (CaliPredictor.logits)
        return params | {"predictor": pred.to(draft.device), "predictor_path": str(ckpt["path"])}

    def describe(self) -> dict:
        return {"cali_predictor": self.predictor_path} if self.predictor_path else {}

    def _restart(self) -> None:
        self.n, self.theta_hat = 0, self.theta0
        self.successes = self.trials = 0  # for "mean"
        self.t = 0  # output tokens so far, for "paper"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        if self.reset_per_sequence:
            self._restart()

    def posterior(self, theta_m: float) -> tuple[float, float]:
        """(mu, sigma^2) of eqs. 6 and 9 for the current n and theta_hat."""
        sm2, ss2 = self.sigma_m**2, self.sigma_s**2
        den = self.n * sm2 + ss2
        return (ss2 * theta_m + self.n * sm2 * self.theta_hat) / den, sm2 * ss2 / den

    def on_device(self, i: int, draft_hidden, target_hidden):
        """theta_M on the device (read with the draft token: no wait of its own); None: no predictor."""
        if self.predictor is None:
            return None
        if target_hidden is None or draft_hidden is None:
            raise SpecBenchError("cali_ts with a predictor needs hidden states, but the method passed none")
        with torch.no_grad():  # i is a host int: W^i is a view, no copy or fill per token
            return self.predictor.at(target_hidden.reshape(1, -1), draft_hidden.reshape(1, -1), i)

    def keep_drafting(self, info: DraftInfo) -> bool:
        if self.predictor is None:
            self.theta_m = self.theta0
        elif info.signal is not None:
            self.theta_m = info.signal
        else:  # a caller that did not read on_device's value with its draft token
            self.theta_m = float(self.on_device(info.i, info.draft_hidden, info.target_hidden).item())
        self.mu, self.sigma2 = self.posterior(self.theta_m)
        z = torch.randn((), dtype=torch.float64, generator=self.rng).item()
        self.theta = min(1.0, max(0.0, self.mu + math.sqrt(self.sigma2) * z))
        return bernoulli(self.rng, self.theta)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not check_round(n_drafted, n_accepted):
            return
        self.n += 1
        q_v = n_accepted + 1
        if self.theta_update == "mean":
            r, trials = round_counts(n_drafted, n_accepted, self.counts)
            self.successes += r
            self.trials += trials
            self.theta_hat = (self.theta0 + self.successes) / (1 + self.trials)
        else:
            t_prev, self.t = self.t, self.t + q_v
            self.theta_hat = (self.theta_hat * (t_prev + 1) + q_v) / (self.t + 1)

    def state(self) -> dict:
        return {"n": self.n, "theta_hat": self.theta_hat, "mu": self.mu, "sigma2": self.sigma2,
                "theta_m": self.theta_m, "theta": self.theta}
