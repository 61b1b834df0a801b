"""Every size-like setting of a method or controller, bounded by the model it runs on.

`config.resources` calls `check` with the model's shape (specbench/config/modelinfo.py, read without the
weights), so a size the model cannot take is one line before anything is loaded or written; the
runner calls `check_widths` once more with the widths the built method reports (a tree read from a
file, a template cut), before the run directory is created. A size is bounded by
- the vocabulary: a top-k or a tree's rank (torch.topk refuses k > V),
- the context: a length, depth or n-gram size that must fit in the model's positions,
- the verify width: the tokens one verification forward feeds (a tree's nodes and root, a window);
  it must leave one prompt token of the context, and, when the start-up profile measures it
  (tree and window widths are profiled, a linear draft's k is not), `profile.context` tokens,
- memory (CPU runs, the host's free memory): parameters a method adds, tensors sized by the
  vocabulary, the largest verification forward.
SIZES lists every integer key of a method or controller (conf/method/*.yaml, conf/control/*.yaml)
with its bound, or why none is needed; tests/test_bounds.py keeps it complete and sets each
bounded key past its bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from specbench.config import modelinfo
from specbench.core.errors import SpecBenchError, bad_value

VOCAB, CONTEXT, WIDTH, MEMORY, LAYERS = "vocab", "context", "width", "memory", "layers"
# method -> key -> its bound (one of the above, '+'-joined) or, for a key left unbounded, why
SIZES = {
    "eagle": {"top_k": VOCAB, "depth": CONTEXT, "num_nodes": WIDTH},
    "eagle3": {"top_k": VOCAB, "depth": CONTEXT, "num_nodes": WIDTH, "ttt_steps": CONTEXT,
               "draft_vocab_size": "capped at the vocabulary by the method (documented in conf/method/eagle3.yaml)"},
    "eesd": {"n_layers": LAYERS, "draft_vocab.size": VOCAB},
    "hf_assisted": {"k": WIDTH, "draft.num_layers": LAYERS},
    "medusa": {"num_heads": CONTEXT + "+" + MEMORY, "sizes": VOCAB + "+" + WIDTH, "tree": VOCAB + "+" + WIDTH,
               "tree_from_accuracies": WIDTH, "draft_vocab.size": VOCAB, "lora_r": "hidden (medusa2 with LoRA)",
               "warmup_epochs": "a count of training epochs, not a size (train.max_minutes caps the time)"},
    "hydra": {"num_heads": CONTEXT + "+" + MEMORY, "num_layers": MEMORY, "tree": VOCAB + "+" + WIDTH},
    "pld": {"max_ngram": CONTEXT, "min_ngram": CONTEXT},
    "token_recycling": {"topk": VOCAB + "+" + MEMORY, "tree": WIDTH,
                        "max_nodes": "a cut of the template: the template's size caps it (its width: check_widths)"},
    "lookahead": {"window": WIDTH, "ngram": WIDTH, "guess": WIDTH},
    "rest": {"max_suffix": CONTEXT, "min_suffix": CONTEXT, "continuation_len": CONTEXT, "num_draft": WIDTH,
             "max_matches": "capped by the occurrences the datastore holds (Datastore.continuations)"},
    "suffix": {"max_depth": CONTEXT, "max_spec_tokens": WIDTH},
    "swift": {"context_window": CONTEXT,
              "opt_interval": "how many verifications between search iterations: a rate, not a size",
              "bayes_interval": "how many search iterations between Bayesian ones: a rate, not a size",
              "max_opt_iter": "a count of search iterations (each costs one skipped forward over context_window tokens)",
              "max_tolerance_iter": "a count of search iterations"},
    "samd": {"n_predicts": WIDTH, "len_threshold": CONTEXT,
             "len_bias": "a length handicap of the static match; any integer is a rule, none a size"},
    "self_sd": {"skip.attn": LAYERS, "skip.mlp": LAYERS, "draft_vocab.size": VOCAB},
    "space": {"k": WIDTH, "lora_r": "hidden (lora: true)", "seed": "not a size"},
    "vanilla_sd": {"draft.num_layers": LAYERS},
    "control": {"k": WIDTH, "k_max": WIDTH},
}
BYTES_PER_ID = 8  # torch.long: token_recycling's adjacency matrix
HYDRA_LAYERS = 4  # num_layers: null is the variant's depth, at most 4 (hydra_heads.DEFAULT_LAYERS)


@dataclass
class Limits:
    """What bounds the sizes: the model's shape, the start-up profile, the memory there is."""
    shape: modelinfo.Shape
    profile_context: int | None  # None: no start-up profile
    free: int | None             # bytes of host memory (None: not a CPU run, or not known)
    width_bytes: int             # bytes per number of the model's dtype

    @property
    def of(self) -> str:
        return f"the model {self.shape.name}"

    def room(self, profiled: bool) -> int:
        """The widest verification: one prompt token before it, or the profile's context when the
        start-up profile measures that width."""
        if self.shape.context is None:  # not stated: only the vocabulary and memory bound sizes
            return math.inf
        before = self.profile_context if profiled and self.profile_context else 1
        return self.shape.context - before

    def room_words(self, profiled: bool) -> str:
        c = self.shape.context
        if profiled and self.profile_context:
            return (f"{self.room(True)} fit (the context of {self.of}, {c}, less profile.context={self.profile_context}, "
                    "after which the start-up profile measures it; or profile.enabled=false)")
        return f"{self.room(False)} fit (the context of {self.of}, {c}, less one prompt token)"


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _paths(v) -> list | None:
    """An explicit tree (Medusa's choices format) as a list of paths; None for a name or file."""
    if isinstance(v, list) and all(isinstance(p, list) and p and all(_int(r) for r in p) for p in v):
        return v
    return None


def _well_formed(v: list) -> bool:
    """Paths each non-empty, of integer ranks >= 0, none twice (an empty path or a rank -1 reached the
    tree builders as an IndexError; a repeated path is a node drafted twice)."""
    ok = v and all(isinstance(p, list) and p and all(_int(r) and r >= 0 for r in p) for p in v)
    return bool(ok) and len({tuple(p) for p in v}) == len(v)


def dense_nodes(sizes: list[int]) -> int:
    """Nodes of a dense tree (TokenTree.cartesian), root not counted."""
    n, level = 0, 1
    for s in sizes:
        level *= s
        n += level
    return n


# ----------------------------------------------------------------------------- the checks
def check(get: Callable[[str], object], lim: Limits) -> list[int]:
    """Raises the first size beyond `lim` as a one-line SpecBenchError; returns the verify widths
    the method's settings imply. `get(key)`: the value of a dotted key, None when absent or null."""
    name = get("method.name")
    for key in ("control.k", "control.k_max"):
        if _int(v := get(key)):
            _width(key, v, v + 1, "the draft and the token before it", lim, profiled=False)
    rule = METHOD_CHECKS.get(name)
    return rule(lambda k: get(f"method.{k}"), lim) if rule else []


def _vocab(key: str, v: int, lim: Limits, vocab: int | None = None, what: str = "") -> None:
    vocab = vocab or lim.shape.vocab
    if v > vocab:
        raise bad_value(key, v, f"at most {vocab}, the {what or 'vocabulary of ' + lim.of}")


def _context(key: str, v: int, lim: Limits, what: str) -> None:
    if lim.shape.context is not None and v >= lim.shape.context:
        raise bad_value(key, v, f"an integer below {lim.shape.context}, the context length of {lim.of} ({what})")


def _width(key: str, v, width: int, what: str, lim: Limits, profiled: bool = True) -> int:
    if width > lim.room(profiled):
        raise bad_value(key, v, f"a size whose verification fits the context: this one verifies {width:,} tokens "
                                f"per step ({what}); {lim.room_words(profiled)}")
    _forward_memory(key, v, width, lim)
    return width


def _forward_memory(key: str, v, width: int, lim: Limits) -> None:
    """One verification of `width` tokens (after the profile's context, which measures it: the
    attention scores and logits of the width itself are what a huge size costs)."""
    if lim.free is None:
        return
    s, cached = lim.shape, lim.profile_context or 0
    need = s.params() * lim.width_bytes + s.forward_bytes(width, cached, width, lim.width_bytes)
    if need > lim.free:
        raise bad_value(key, v, f"a smaller size: a verification of {width:,} tokens after {cached} cached needs about "
                                f"{need / modelinfo.GIB:.1f} GiB with the weights, {lim.free / modelinfo.GIB:.1f} GiB are free")


def _memory(key: str, v, params: int, what: str, lim: Limits) -> None:
    """`params` numbers (or bytes / width_bytes) a method adds to the weights."""
    if lim.free is None:
        return
    need = (lim.shape.params() + params) * lim.width_bytes
    if need > lim.free:
        raise bad_value(key, v, f"a smaller size: {what} and the weights need about {need / modelinfo.GIB:.1f} GiB, "
                                f"{lim.free / modelinfo.GIB:.1f} GiB are free")


def _tree(m, key: str, lim: Limits, vocab: bool = True) -> int | None:
    """An explicit tree's width (nodes + root), its ranks within the vocabulary."""
    value = m(key)
    if isinstance(value, list) and not _well_formed(value):
        raise bad_value(f"method.{key}", value if len(value) <= 8 else f"<{len(value)} paths>",
                        "a list of distinct non-empty paths of ranks >= 0 (e.g. [[0], [1], [0, 0]]), a name or a file")
    paths = _paths(value)
    if paths is None:
        return None
    if vocab and paths and (r := max(max(p) for p in paths)) >= lim.shape.vocab:
        raise bad_value(f"method.{key}", paths if len(paths) <= 8 else f"<{len(paths)} paths>",
                        f"ranks below {lim.shape.vocab}, the vocabulary of {lim.of} (a path has rank {r})")
    return _width(f"method.{key}", f"<{len(paths)} paths>", len(paths) + 1, "the tree's nodes and its root", lim)


def _eagle(m, lim: Limits) -> list[int]:
    top_k, depth, nodes = m("top_k"), m("depth"), m("num_nodes")
    draft_vocab = m("draft_vocab_size") if m("name") == "eagle3" else None
    if _int(top_k) and _int(draft_vocab) and draft_vocab < lim.shape.vocab:
        _vocab("method.top_k", top_k, lim, draft_vocab, f"draft vocabulary (method.draft_vocab_size={draft_vocab})")
    if _int(top_k):
        _vocab("method.top_k", top_k, lim)
    if _int(depth):
        _context("method.depth", depth, lim, "a draft token sits at the pending position + its depth")
    if _int(steps := m("ttt_steps")):
        _context("method.ttt_steps", steps, lim, "step j trains the draft j tokens ahead")
    return [_width("method.num_nodes", nodes, nodes + 1, "the tree's nodes and its root", lim)] if _int(nodes) else []


def _heads(m, lim: Limits) -> list[int]:
    """Medusa's and Hydra's heads: their count and size, their tree."""
    name, n, d, V = m("name"), m("num_heads"), lim.shape.hidden, lim.shape.vocab
    if not _int(n):
        return []
    _context("method.num_heads", n, lim, "head k drafts the token k places ahead")
    if name == "medusa":
        per_head = d * d + d + (0 if m("share_head") else V * d)
        _memory("method.num_heads", n, n * per_head, f"{n} heads", lim)
        if m("variant") == "medusa2" and m("backbone") == "lora":
            _rank(m, lim)
    else:  # hydra: head k's first block reads k + 2 vectors (the feature and the path's embeddings)
        layers = m("num_layers") if _int(m("num_layers")) else HYDRA_LAYERS
        proj = 0 if m("share_head") else V * d + V
        params = sum(2 * d * d * (k + 2) + (layers - 1) * (d * d + d) + proj for k in range(n))
        key, v = ("method.num_layers", layers) if layers > n else ("method.num_heads", n)
        _memory(key, v, params, f"{n} heads of {layers} blocks", lim)
    if (w := _tree(m, "tree", lim)) is not None:
        return [w]
    if name == "medusa" and isinstance(sizes := m("sizes"), list) and sizes and all(_int(s) for s in sizes):
        if max(sizes) > V:
            raise bad_value("method.sizes", sizes, f"sizes of at most {V}, the vocabulary of {lim.of}")
        return [_width("method.sizes", sizes, dense_nodes(sizes) + 1, "the dense tree's nodes and its root", lim)]
    if name == "medusa" and _int(n_acc := m("tree_from_accuracies")):
        return [_width("method.tree_from_accuracies", n_acc, n_acc + 1, "the tree's nodes and its root", lim)]
    return []


def _rank(m, lim: Limits) -> None:
    """LoRA's rank (where LoRA is used): above the hidden size it adds nothing but memory."""
    if _int(r := m("lora_r")) and r > lim.shape.hidden:
        raise bad_value("method.lora_r", r, f"at most {lim.shape.hidden}, the hidden size of {lim.of} (a rank of its d x d maps)")


def _ngrams(m, lim: Limits) -> list[int]:
    for key in ("max_ngram", "min_ngram"):
        if _int(v := m(key)):
            _context(f"method.{key}", v, lim, "an n-gram of the context")
    return []


def _token_recycling(m, lim: Limits) -> list[int]:
    if _int(k := m("topk")):
        _vocab("method.topk", k, lim)
        _memory("method.topk", k, lim.shape.vocab * k * BYTES_PER_ID // lim.width_bytes,
                f"the adjacency matrix ({lim.shape.vocab} tokens x {k} successors)", lim)
    if (tree := m("tree")) is not None and not isinstance(tree, (str, list)):
        raise bad_value("method.tree", tree, "a template name or a list of paths (e.g. [[0], [1], [0, 0]])")
    return [w] if (w := _tree(m, "tree", lim, vocab=False)) is not None else []


def _lookahead(m, lim: Limits) -> list[int]:
    W, N, G = m("window"), m("ngram"), m("guess")
    if not (_int(W) and _int(N) and _int(G)):
        return []
    key, v = ("ngram", N) if N - 1 > W + G else (("window", W) if W >= G else ("guess", G))
    return [_width(f"method.{key}", v, (N - 1) * (W + G),
                   "(method.ngram - 1) x (method.window + method.guess): the window's rows and the candidates", lim)]


def _rest(m, lim: Limits) -> list[int]:
    for key, what in (("max_suffix", "a suffix of the context"), ("min_suffix", "a suffix of the context"),
                      ("continuation_len", "tokens drafted after a match")):
        if _int(v := m(key)):
            _context(f"method.{key}", v, lim, what)
    n = m("num_draft")
    return [_width("method.num_draft", n, n + 1, "the trie's nodes and its root", lim)] if _int(n) else []


def _suffix(m, lim: Limits) -> list[int]:
    if _int(depth := m("max_depth")):
        _context("method.max_depth", depth, lim, "a suffix of the context")
    n = m("max_spec_tokens")
    return [_width("method.max_spec_tokens", n, n + 1, "the tree's nodes and its root", lim)] if _int(n) else []


def _samd(m, lim: Limits) -> list[int]:
    if _int(v := m("len_threshold")):
        _context("method.len_threshold", v, lim, "a match length")
    n = m("n_predicts")  # a retrieved chain: the pending token and up to n_predicts - 1 drafts
    return [_width("method.n_predicts", n, n, "the pending token and the retrieved chain", lim, profiled=False)] if _int(n) else []


def _swift(m, lim: Limits) -> list[int]:
    if _int(v := m("context_window")):
        _context("method.context_window", v, lim, "the output tokens a candidate layer set is scored on")
    return []


def _space(m, lim: Limits) -> list[int]:
    k = m("k")
    if not _int(k):
        return []
    if m("lora"):
        _rank(m, lim)
    return [_width("method.k", k, 1 + k + k * (k + 1), "the pending token, k candidates and k + 1 groups of k masks", lim)]


def _assisted(m, lim: Limits) -> list[int]:
    if _int(k := m("k")):
        _width("method.k", k, k + 1, "the draft and the token before it", lim, profiled=False)
    return []


METHOD_CHECKS = {"eagle": _eagle, "eagle3": _eagle, "medusa": _heads, "hydra": _heads, "pld": _ngrams,
                 "token_recycling": _token_recycling, "lookahead": _lookahead, "rest": _rest, "suffix": _suffix, "samd": _samd, "swift": _swift,
                 "space": _space, "hf_assisted": _assisted}


def check_widths(widths: list[int], method: str, context: int | None, profile_context: int | None) -> None:
    """The built method's own verify widths (what a step verifies and the profile measures): a tree
    read from a file or named, a template cut, within the context of the loaded model."""
    if not widths or context is None:
        return
    w, before = max(widths), profile_context or 1
    if w > context - before:
        what = f"less profile.context={profile_context} (the start-up profile measures it)" if profile_context else "less one prompt token"
        raise SpecBenchError(f"method {method} verifies {w:,} tokens per step; the model's context ({context}) {what} "
                             f"leaves room for {context - before}; choose a smaller tree")
