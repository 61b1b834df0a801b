"""Vanilla speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a separate draft model.

The draft is either a Hugging Face model sharing the target's tokenizer (`draft.source: hf`)
or, by default, a separate small model built from the target's first `draft.num_layers` layers
plus its final norm and head (`draft.source: truncate`), with its own KV cache. Untrained, such
a truncated draft agrees with the target on only ~4-10% of tokens on the embedded model
(shared/NOTES.md): `python -m specbench.train method=vanilla_sd` distils it on self-generated
text, and a trained checkpoint is picked up automatically (`draft.checkpoint: auto`).
"""

from __future__ import annotations

from specbench.models.artifacts import load_draft_checkpoint, trained_summary
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.models import ModelAdapter, load_hf, truncated_copy
from specbench.config.settings import shipped


def draft_num_layers(cfg, target: ModelAdapter) -> int:
    """`num_layers: auto`: 3, or one fewer than the target has when it has 3 or fewer. Three, not
    four: the published draft for the embedded model must fit ~25 MB in float16 (issue 44); its 3
    layers are 21 MB, 4 would be 28 MB."""
    n = cfg.num_layers
    return min(3, target.num_layers - 1) if n in (None, "auto") else int(n)


def build_draft(target: ModelAdapter, cfg) -> tuple[ModelAdapter, dict]:
    """The draft model named by `cfg` (the method's `draft` group) and a description of it."""
    source = cfg.source
    if source == "truncate":
        n = draft_num_layers(cfg, target)
        draft = truncated_copy(target, n)
        info = {"draft": f"first {n} layers of the target", "draft_trained": False}
        ckpt = cfg.checkpoint
        if ckpt:
            loaded = load_draft_checkpoint(draft, target, n, ckpt)
            if loaded:
                info.update(draft_trained=True, draft_checkpoint=loaded["path"], trained=trained_summary(loaded.get("settings")))
                if "draft_quant" in loaded:
                    info["draft_quant"] = loaded["draft_quant"]
        return draft, info
    if source == "hf":
        # a Hugging Face model's settings as conf/model/hf.yaml ships them, with the draft's id, dtype and device
        draft = load_hf(shipped("model", "hf", {"id": cfg.id, "dtype": cfg.dtype, "device": cfg.device}))
        draft.follow_execution(target)
        if draft.tokenizer.vocab != target.tokenizer.vocab:
            raise SpecBenchError(
                f"draft model {cfg.id!r} has a different tokenizer than the target {target.name!r}; "
                "speculative decoding needs the same vocabulary"
            )
        return draft, {"draft": str(cfg.id), "draft_trained": None}
    raise SpecBenchError(f"unknown draft.source {source!r}; allowed: hf, truncate")


@register_method
class VanillaSD(SpeculativeMethod):
    name = "vanilla_sd"

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.draft, self.draft_info = build_draft(target, cfg.draft)

    def describe(self) -> dict:
        return super().describe() | self.draft_info

    def prefill_draft(self, prompt: list[int]) -> None:
        self.dcache = self.draft.new_cache()
        self.draft.forward(prompt, self.dcache, last_only=True)

    def propose(self, k_max: int):
        def next_draft(drafts):
            seq = self.tokens + drafts
            logits, hidden = self.draft.forward(seq[self.dcache.length() :], self.dcache, last_only=True)
            return logits[-1], hidden[-1]

        return self.draft_loop(k_max, next_draft)

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        self.dcache.crop(len(self.tokens) - 1)
