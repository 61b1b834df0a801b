"""Self-Speculative decoding / Draft & Verify (Zhang et al., ACL 2024): the target drafts for itself.

The draft is the target model run with a fixed set of attention and MLP sub-layers skipped
(paper section 3.2, Algorithm 2): no second model, no extra weights, and one shared KV cache.

Cache handling (the invariant of `specbench/methods/base.py` holds between steps: every layer
holds the committed tokens except the pending one, `self.tokens[-1]`):

* drafting feeds one token per forward (the pending token, then each new draft token) with the
  skip set; a skipped attention sub-layer neither reads nor writes the cache, a kept one appends
  one entry per forward, so during drafting the layers have different lengths. Positions are
  passed explicitly (pending token at `len(self.tokens) - 1`, the j-th draft token after it),
  because the adapter's default position is each layer's own cache length;
* the draft's entries are computed from draft hidden states, so they are dropped: at the end of
  drafting the decode loop (`SpeculativeMethod.draft_candidates`) crops the cache back to the committed
  length in every layer, and verification recomputes [pending token + drafts] with the full
  model in all layers; after verification the loop crops to the accepted length, as for any method.

Drafting therefore attends to the full model's entries for committed tokens and to the draft's
own entries for earlier draft tokens of the same round (the paper's shared-cache drafting).

Skip set (`method.skip`):

* `source: explicit`: the lists `skip.attn` and `skip.mlp` (0-based layer indices);
* `source: search`: the result of `python -m specbench.tools.skipsearch` (Bayesian optimisation, paper
  section 3.3) stored at `<cache_dir>/<model key>.json` (or `skip.path`);
* `source: heuristic`: a fixed rule for when no search was run (see `heuristic_skip`);
* `source: auto` (default): explicit when either list is non-empty, else the searched set when a search
  result is cached (on small models the runner searches on first use), else heuristic.

The draft-exit rule is whichever controller `control=` names; the paper's own is
`control=adaptive_threshold` (section 3.4). The confidence the controllers see is the draft's
probability of its own token (the `draft_loop` convention); under greedy decoding this is the
paper's max p(x | z*), under sampling the paper uses the max probability instead (Algorithm 4).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbench.models.artifacts import (check_published, find_skip_result, load_skip_result, safe_key,
                                        skip_result_summary)
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.draft_vocab import subset_head, vocab_subset
from specbench.models import LayerSkip, ModelAdapter, published

SOURCES = ("auto", "explicit", "search", "heuristic")


def heuristic_skip(num_layers: int) -> LayerSkip:
    """A skip set for when no search was run, following the paper's findings (appendix C, D):
    about a third to a half of the sub-layers skipped, more attention than MLP, and only in the
    upper part of the network (later layers are more redundant; skipping the first layers is the
    worst strategy, its Table 7).

    Rule: the candidate layers are the upper three quarters minus the last layer,
    U = [L // 4, L - 1). Attention is skipped in every other layer of U starting at its first
    (U[0], U[2], ...), the MLP in every third layer of U starting at its second (U[1], U[4], ...).
    L = 30 (SmolLM2-135M): 11 attention + 7 MLP sub-layers of 60; L = 40 (LLaMA-2-13B): 15 + 10
    (the paper's search found 24 + 12 there); L = 4: attention of layer 1, MLP of layer 2.
    """
    upper = list(range(num_layers // 4, max(num_layers // 4, num_layers - 1)))
    return LayerSkip(attn=frozenset(upper[0::2]), mlp=frozenset(upper[1::3]))


def check_layers(kind: str, layers, num_layers: int) -> frozenset[int]:
    out = set()
    for v in layers or []:
        if isinstance(v, bool) or not isinstance(v, int) and not (isinstance(v, str) and v.strip().lstrip("-").isdigit()):
            raise SpecBenchError(f"skip.{kind} entries must be layer indices (integers), got {v!r}")
        i = int(v)
        if not 0 <= i < num_layers:
            raise SpecBenchError(
                f"skip.{kind} layer {i} is out of range: the model has {num_layers} layers, valid indices 0..{num_layers - 1}"
            )
        out.add(i)
    return frozenset(out)


def model_key(target: ModelAdapter) -> str:
    return safe_key(getattr(target, "key", None) or target.name)


def search_path(target: ModelAdapter, cfg) -> Path:
    """Where `skip.source: search` looks for the search result of this model (default: the
    artifact cache's self_sd/ folder, else the published set shipped in the package)."""
    if cfg.path:
        return Path(str(cfg.path)).expanduser()
    return find_skip_result(cfg.cache_dir, model_key(target))


def resolve_skip(target: ModelAdapter, cfg) -> tuple[LayerSkip, dict]:
    """The skip set named by `cfg` (the method's `skip` group) and a description of it."""
    cfg = cfg or {}
    source = cfg.source
    attn, mlp = list(cfg.attn), list(cfg.mlp)
    n = target.num_layers
    if source not in SOURCES and (Path(str(source)).suffix == ".json" or Path(str(source)).expanduser().is_file()):
        return _published_skip(Path(str(source)).expanduser(), cfg, n, bool(attn or mlp))
    if source not in SOURCES:
        raise SpecBenchError(f"unknown skip.source {source!r}; allowed: {', '.join(SOURCES)} or a skip-set file (.json)")
    if source == "auto":  # the paper's method is the searched skip set; the heuristic only stands in for it
        source = "explicit" if attn or mlp else "search" if search_path(target, cfg).is_file() else "heuristic"
    elif source != "explicit" and (attn or mlp):
        raise SpecBenchError(
            f"skip.attn/skip.mlp are only used with skip.source=explicit (or auto), not {source!r}; "
            "clear them or set skip.source=explicit"
        )
    info: dict = {"skip_source": source}
    if source == "explicit":
        skip = LayerSkip(check_layers("attn", attn, n), check_layers("mlp", mlp, n))
    elif source == "heuristic":
        skip = heuristic_skip(n)
    else:
        path = search_path(target, cfg)
        if not path.is_file():
            raise SpecBenchError(
                f"skip.source=search but no search result for model {target.name!r} (key {model_key(target)!r}) at {path}; run "
                f"`python -m specbench.tools.skipsearch model=<this model> iterations=50` first "
                "(or use skip.source=heuristic / skip.source=explicit with skip.attn=[..] skip.mlp=[..])"
            )
        check_published(path, "python -m specbench.tools.skipsearch model=<this model>")
        result = load_skip_result(path)
        found = result.get("model_key")
        if found is not None and found != model_key(target):
            raise SpecBenchError(
                f"search result {path} is for model key {found!r}, not {model_key(target)!r}; rerun the search"
            )
        skip = LayerSkip(
            check_layers("attn", result["skip"]["attn"], n), check_layers("mlp", result["skip"]["mlp"], n)
        )
        # what made the set, for the run's settings line and the leaderboard's budget column
        info.update(skip_file=str(path), skip_search_objective=result.get("objective"), trained=skip_result_summary(result))
    return skip, _describe(skip, n, info)


def _describe(skip: LayerSkip, n: int, info: dict) -> dict:
    info.update(
        skip_attn=sorted(skip.attn),
        skip_mlp=sorted(skip.mlp),
        skipped_fraction=round((len(skip.attn) + len(skip.mlp)) / (2 * n), 4),
    )
    return info


def _published_skip(path: Path, cfg, n: int, explicit_given: bool) -> tuple[LayerSkip, dict]:
    """A skip set as Self-SD publishes them (skip_layers.json; models/published.py)."""
    if explicit_given:
        raise SpecBenchError(f"skip.attn/skip.mlp are not used with skip.source={str(path)!r}; clear them")
    if not path.is_file():
        raise SpecBenchError(f"skip.source={str(path)!r}: no such file")
    attn, mlp, entry = published.load_skip_set(path, cfg.model)
    where = f"{path} [{entry}]"
    try:
        skip = LayerSkip(check_layers("attn", attn, n), check_layers("mlp", mlp, n))
    except SpecBenchError as e:  # say which file (published sets are per model: a 13B set on a 7B fails here)
        raise SpecBenchError(f"{where}: {e}") from None
    return skip, _describe(skip, n, {"skip_source": "file", "skip_file": str(path), "skip_entry": entry})


@register_method
class SelfSD(SpeculativeMethod):
    name = "self_sd"

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.skip, self.skip_info = resolve_skip(target, cfg.skip)
        ids, self.vocab_info = vocab_subset(target, cfg, run)
        self.draft_head = subset_head(target.lm_head, ids, target)

    def describe(self) -> dict:
        return super().describe() | self.skip_info | self.vocab_info

    def propose(self, k_max: int):
        # the draft's own entries in the shared cache are dropped by the decode loop (`draft_candidates`)
        return self.draft_loop(k_max, skipped_draft(self, self.skip, self.draft_head))


def skipped_draft(method: SpeculativeMethod, skip: LayerSkip, head=None):
    """`next_draft` for `draft_loop`: the target with `skip` left out, one token per forward into the
    shared cache, at explicit positions (layers hold different lengths while drafting); SWIFT uses it too."""
    base = len(method.tokens) - 1  # committed tokens in the cache; the pending token's position
    device = method.target.device

    def next_draft(drafts):
        tok = drafts[-1] if drafts else method.tokens[-1]
        pos = torch.full((1,), base + len(drafts), device=device)  # a fill on the device, no host copy
        logits, hidden = method.target.forward([tok], method.cache, positions=pos, skip=skip, last_only=True, head=head)
        return logits[-1], hidden[-1]

    return next_draft
