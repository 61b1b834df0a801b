"""Token choice and verification: greedy, and lossless speculative (rejection) sampling.

Rejection sampling follows Leviathan et al. / Chen et al.: draft token x with draft probability
q(x) is accepted with probability min(1, p(x)/q(x)); on rejection the replacement is drawn from
norm(max(0, p - q)); if every draft token is accepted a bonus token is drawn from p. Both p and
q are the *processed* distributions (temperature, top-k, top-p), so the output follows the
target's processed distribution exactly. A draft without a distribution (prompt lookup, a
greedy draft) passes q = one-hot, which the same rule handles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.transfer import upload


@dataclass(frozen=True)
class SamplingConfig:
    """The decoding rule; SamplingConfig() is greedy decoding (what a run's `sampling.*` keys give is
    `from_cfg(run.sampling)`)."""

    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @classmethod
    def from_cfg(cls, cfg) -> "SamplingConfig":
        """`cfg`: the run's `sampling` settings."""
        return cls(float(cfg.temperature), float(cfg.top_p), int(cfg.top_k))


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Processed next-token distribution(s), float32/64, for logits [..., V]."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        p = p.masked_fill(drop, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p.cpu() if p.is_cuda else p, 1, generator=generator).item())


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    if cfg.greedy:
        return int(logits.argmax(-1).item())
    return sample(probs(logits, cfg), generator)


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """target_logits[i] predicts the token after draft[i-1] (row 0: after the pending token).

    Returns (number of draft tokens accepted, the target's next token after them)."""
    choice = target_logits.argmax(-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return n, choice[n]


def draft_token_probs(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p(x_i) and q(x_i) of each draft token ([k] each) from p, q: [k, V] (q None: one-hot, q(x) = 1)."""
    p_x = p.gather(-1, draft.view(-1, 1)).squeeze(-1)
    q_x = torch.ones_like(p_x) if q is None else q.gather(-1, draft.view(-1, 1)).squeeze(-1)
    return p_x, q_x


def accept_tests(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[k] bool: draft token i passes u_i < p(x_i)/q(x_i), written without dividing."""
    return (q_x > 0) & (u * q_x <= p_x)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) for one row; p itself where the residual is empty (p == q exactly:
    rejection then has probability 0, so any choice is unreachable but must be a distribution)."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total, p / p.sum(-1, keepdim=True))


def one_hot(tok: int, like: torch.Tensor) -> torch.Tensor:
    """A one-hot row on `like`'s device and dtype (a draft without a distribution)."""
    return torch.nn.functional.one_hot(torch.tensor(tok, device=like.device), like.shape[-1]).to(like.dtype)


def verify_sampling(
    target_logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Rejection sampling. draft_probs: [k, V] processed draft distributions, or None for a
    deterministic draft (one-hot q).

    The math stays on the model's device in float32 (float64 for a float64 model): the accept
    tests, the first rejection n and the row to sample from (the residual at n, or p[k] when all
    pass) are chosen there, and that row comes to the host, where the generator is, in the same
    copy as n: one read per verification (on a GPU each read drains the launch queue)."""
    if cfg.greedy:
        return verify_greedy(target_logits, draft)
    p = probs(target_logits, cfg)
    k = len(draft)
    if not k:
        return 0, sample(p[0], generator)
    drafted = upload(draft, p.device, torch.long)
    q = draft_probs.to(p) if draft_probs is not None else torch.nn.functional.one_hot(drafted, p.shape[-1]).to(p)
    u = torch.rand(k, generator=generator, dtype=p.dtype)  # on the host: the generator's device
    p_x, q_x = draft_token_probs(p[:k], q, drafted)
    ok = accept_tests(p_x, q_x, upload(u, p.device))
    n = ok.long().cumprod(0).sum().view(1)  # the first rejected position; k when every test passes
    # (a 1-element index: indexing with a 0-dim tensor reads it to the host first)
    q_n = torch.cat([q, torch.zeros_like(p[:1])])[n]
    row = torch.where(n.view(1, 1) == k, p[n], residual(p[n], q_n))[0]  # p[k] itself when all passed
    host = torch.cat([row, n.to(row.dtype)]).cpu()  # float32 holds any n <= k exactly
    return int(host[-1]), sample(host[:-1], generator)
