"""SPACE (Yi et al. 2024): smart parallel auto-correct decoding with a SAR-SFT fine-tuned model.

The mask token [M]: instead of adding a token to the tokenizer and resizing the embedding
matrix (and, with tied embeddings, the head, which would let the model *emit* [M]), the mask
is one extra learned embedding vector kept beside the model. Inputs are embedded with the
model's own table and mask positions (id `MASK` = -1) get the vector. Same model function as an
added row (the paper initialises it from a normal distribution; so do we), for every model
(byte tokenizer, GGUF, HF), and the vocabulary and head stay untouched.

Auto-correct decoding (Algorithm 1), one forward per step over
[pending x, M*k, c1, M*k, ..., ck, M*k] with the group mask (masks see only their own group,
the paper's text and Fig. 3; `mask_rule: eq6` for eq. 6's literal "less than k apart") and
eq. 7 positions (engine/tree.py `space_layout`): the outputs at x, c1..ck verify the candidates; the k masks of
the group after the last accepted token give the next step's candidates. Prefill runs
[prompt, M*k] causally (exactly the SAR-SFT training format) so the first step already has
candidates. Only the accepted real tokens stay in the cache (`KVCache.keep`).

Verification: greedy at temperature 0; otherwise standard lossless rejection sampling with the
candidates sampled from the mask distributions q and accepted with min(1, p/q) (eq. 10), and on
rejection the replacement drawn from norm(max(0, p - q)). (Algorithm 1, line 18, samples the
replacement from p itself, which is not exactly lossless; we use the residual.)

The model's weights change, so the AR baseline must run on the fine-tuned model:
`finetuned_adapter` is that model (so `baseline_weights` is "fine-tuned") (a separate copy; the
runner's target is left untouched).
"""

from __future__ import annotations

import copy
import hashlib
import json

import torch
from torch import nn

from specbench.models.artifacts import check_state, expected_state, load_checkpoint, rounded, trained_summary
from specbench.engine.sampling import probs, sample
from specbench.engine.transfer import take, upload
from specbench.engine.tree import SPACE_MASK_RULES, space_indices, space_layout
from specbench.engine.verify import Layout, Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.models import ModelAdapter

MASK = -1
TRAIN_CMD = "python -m specbench.train method=space model={model} method.k={k}"


def space_structure(cfg) -> dict:
    s = {"k": int(cfg.k), "lora": bool(cfg.lora)}
    if s["lora"]:
        s |= {"lora_r": int(cfg.lora_r), "lora_alpha": int(cfg.lora_alpha)}
    return s


class MaskedEmbed(nn.Module):
    """The learned [M] vector (the only parameter beside the model's own)."""

    def __init__(self, target: ModelAdapter, seed: int = 0):
        super().__init__()
        w = target.embed_tokens.weight
        g = torch.Generator().manual_seed(seed)
        std = float(w.float().std())
        self.vector = nn.Parameter((torch.randn(w.shape[1], generator=g, dtype=torch.float64) * std).to(w.dtype).to(w.device))

    def forward(self, adapter: ModelAdapter, ids: torch.Tensor | list[int]) -> torch.Tensor:
        ids = upload(ids, adapter.device, torch.long)
        ids = ids if ids.dim() == 2 else ids.view(1, -1)
        is_m = ids == MASK
        emb = adapter.embed(ids.clamp_min(0))
        return torch.where(is_m.unsqueeze(-1), self.vector.to(emb.dtype), emb)


def finetuned_copy(target: ModelAdapter, suffix: str, structure: dict) -> ModelAdapter:
    model = copy.deepcopy(target.model)
    adapter = ModelAdapter(model, target.tokenizer, f"{target.name}-{suffix}")
    adapter.key = f"{target.key}-{suffix}-" + hashlib.sha1(json.dumps(structure, sort_keys=True).encode()).hexdigest()[:8]
    adapter.follow_execution(target)  # graphs mode decodes the copy too (an H200 saw SPACE capture nothing without it)
    adapter.draft_quant = target.draft_quant  # parts trained beside the copy (Medusa-2's heads) are rounded as the target says
    return adapter


def untie_lm_head(model: nn.Module) -> None:
    """Give the LM head its own copy of a tied embedding matrix, so that adapting one (Medusa-2's
    LoRA on the LM head) leaves the other as it was; no-op when they are not tied."""
    head = model.get_output_embeddings()
    if head.weight is model.get_input_embeddings().weight:
        head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
    model.config.tie_word_embeddings = False  # nothing may tie them again


def lora_expected(model: nn.Module, r: int) -> dict:
    """name -> (shape, dtype) of a LoRA delta over every linear layer inside the decoder layers
    (what `train.loop.apply_lora` adapts): `<module>.A` [r, in], `<module>.B` [out, r]."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and ".layers." in f".{name}":
            out[f"{name}.A"] = ((r, m.in_features), m.weight.dtype)
            out[f"{name}.B"] = ((m.out_features, r), m.weight.dtype)
    return out


def merge_lora(model: nn.Module, delta: dict, structure: dict, path, fix: str = "") -> None:
    """W += (alpha / r) B A for every adapted linear layer (peft's merge, without peft), summed in
    float64 so that the merged weights do not depend on the checkpoint's float16/float32 dtype order."""
    r, alpha = int(structure["lora_r"]), int(structure["lora_alpha"])
    check_state(delta, lora_expected(model, r), path, fix)
    with torch.no_grad():
        for key in delta:
            if key.endswith(".A"):
                name = key[:-2]
                w = model.get_submodule(name).weight
                d = delta[f"{name}.B"].double() @ delta[key].double() * (alpha / r)
                w.copy_((w.double() + d.to(w.device)).to(w.dtype))


def load_finetuned(target: ModelAdapter, kind: str, structure: dict, cfg, missing: str) -> tuple[ModelAdapter, dict | None]:
    """A frozen fine-tuned copy of `target` from checkpoint `kind` (SPACE, Medusa-2) and the
    checkpoint (None when untrained and allowed); `missing` is the error when there is none."""
    where = cfg.checkpoint
    allow = bool(cfg.allow_untrained)
    ckpt = load_checkpoint(kind, target.key, structure, where, required=where != "auto" and not allow,
                           model_name=target.name)
    if ckpt is None and not allow:
        raise SpecBenchError(missing)
    ft = finetuned_copy(target, kind if ckpt is not None else f"{kind}-untrained", structure)
    if ckpt is not None and "lora" in ckpt["state"]:
        merge_lora(ft.model, ckpt["state"]["lora"], structure, ckpt["path"], ckpt["fix"])
    elif ckpt is not None:
        state = ckpt["state"].get("model")
        check_state(state, expected_state(ft.model), ckpt["path"], ckpt["fix"])
        head, emb = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
        if head is not None and emb is not None and not torch.equal(head, emb):
            untie_lm_head(ft.model)  # trained untied (a LoRA-adapted head): a tied copy would load one of the two
        ft.model.load_state_dict(state)
    ft.model.to(device=target.device, dtype=target.dtype).eval()
    for p in ft.model.parameters():
        p.requires_grad_(False)
    if ckpt is not None:  # the fine-tuned weights are no longer the GGUF's blocks: the ggml* backends ran them as float32
        ckpt = ckpt | rounded(ft.model, target)
    return ft, ckpt


def load_space(target: ModelAdapter, cfg) -> tuple[ModelAdapter, MaskedEmbed, dict]:
    structure = space_structure(cfg)
    ft, ckpt = load_finetuned(target, "space", structure, cfg,
                              f"no SAR-SFT fine-tuned SPACE weights for model {target.name} ({structure}); train them with `"
                              + TRAIN_CMD.format(model=target.name, k=structure["k"]) + "` or set method.allow_untrained=true")
    mask = MaskedEmbed(target, int(cfg.seed))
    info = {"k": structure["k"], "lora": structure["lora"], "space_trained": ckpt is not None}
    if ckpt is not None:
        mask.vector.data.copy_(ckpt["state"]["mask_embedding"].to(mask.vector.dtype))
        info["checkpoint"] = ckpt["path"]
        if "draft_quant" in ckpt:
            info["draft_quant"] = ckpt["draft_quant"]
        info["train_settings"] = ckpt.get("settings")
        info["trained"] = trained_summary(ckpt.get("settings"))
    mask.to(device=target.device, dtype=target.dtype)
    mask.vector.requires_grad_(False)
    return ft, mask, info


@register_method
class Space(SpeculativeMethod):
    name = "space"
    uses_controller = False  # k candidates per step, fixed by the SAR-SFT training

    def __init__(self, target, cfg, sampling, run):
        ft, self.mask_embed, self.info = load_space(target, cfg)
        super().__init__(ft, cfg, sampling, run)
        self.base_target = target
        self.finetuned_adapter = ft
        self.k = self.info["k"]
        rule = str(cfg.mask_rule)
        if rule not in SPACE_MASK_RULES:
            raise choice_error("method.mask_rule", rule, SPACE_MASK_RULES)
        self.info["mask_rule"] = rule
        layout, mask, pos = space_layout(self.k, prefix=1, rule=rule)
        self.layout = layout
        self.mask = mask.to(ft.device)
        self.pos = pos.to(ft.device)
        self.real_idx, self.groups = space_indices(layout, self.k)

    def describe(self) -> dict:
        return super().describe() | {k: v for k, v in self.info.items() if k != "train_settings"}

    def verify_widths(self) -> list[int]:
        return [len(self.layout)]

    def _forward(self, ids, positions=None, tree_mask=None, first: int = 0) -> torch.Tensor:
        """Logits and hidden states of rows first.. (the rows before fill the cache only)."""
        t = self.target
        h = t.run_layers(self.mask_embed(t, ids), self.cache, positions=positions, tree_mask=tree_mask)[:, first:]
        return t.lm_head(t.norm(h))[0], h[0]

    def prefill(self, ids: list[int]):
        """[prompt, M*k] causally (the SAR-SFT training format): the masks give the first
        candidates; the loop then drops the masks' cache entries."""
        # the prompt's rows but its last need no logits: the 49k-row head is a fifth of a forward per row
        logits, hidden = self._forward(ids + [MASK] * self.k, first=len(ids) - 1)
        self.mask_rows = logits[1:]
        return logits[:1], hidden[:1]

    def propose(self, k_max: int) -> Proposal:
        rows = self.mask_rows
        if self.sampling.greedy:
            cands, q = rows.argmax(-1).tolist(), None
        else:
            q = probs(rows, self.sampling)
            host = q.cpu()  # every candidate's row in one copy (one wait on a GPU, not one per candidate)
            cands = [sample(host[j], self.gen) for j in range(len(rows))]
        feed = [self.tokens[-1] if kind == "x" else (cands[i - 1] if kind == "c" else MASK) for kind, i in self.layout]
        return Proposal(cands, q, layout=Layout(feed, self.mask, self.pos, self.real_idx))

    def verify_forward(self, prop, feed, mask, positions):
        return self._forward(feed, positions=positions, tree_mask=mask)

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        # the mask group after the last accepted candidate holds the next step's candidates
        self.mask_rows = take(logits, self.groups[len(path) - 1])
