"""Medusa (Cai et al. 2024): K extra decoding heads on the last hidden state + tree attention.

Head k (1-based) reads the final-norm hidden state h_t of the last verified position (whose LM
head output is the pending token x_{t+1}) and predicts x_{t+k+1}: a residual SiLU block
(Linear d->d initialised to zero, so the block is the identity at init) followed by a vocabulary
projection initialised from the model's head (`share_head: true`: the base head itself, frozen).

A proposer: candidates = `TokenTree` nodes (node at depth d with rank r = head d's top-r token;
the root is the pending token). The decode loop (methods/base.py) verifies them in one target
forward with the tree mask and positions cache_length + depth, keeps the accepted path's cache
entries, and keeps the hidden state of the path's last node, which the heads read next step
(the tree forward already computed it: no extra forward).

Acceptance (`acceptance`): `auto` = greedy verification at temperature 0, lossless tree
rejection sampling otherwise (engine/tree.py); `typical` = the paper's typical acceptance
(3.3.1; lossy: `lossless` is False so results are labelled), with the sequence's first token
(the prefill's, also a later turn's) and every step's own token taken greedily, as the paper and
the authors' code do.

StepResult.n_drafted is the tree's depth (the longest candidate a step can accept), so the
acceptance rate is accepted / depth.

`variant: medusa2` (train/medusa2.py): the backbone was fine-tuned jointly with the heads, so
decoding runs on a fine-tuned copy (`finetuned_adapter`, so `baseline_weights` is "fine-tuned", as
SPACE): lossless with respect to that copy, and the runner also decodes with the original weights.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.models.artifacts import apply_checkpoint, load_checkpoint
from specbench.engine.tree import TokenTree
from specbench.engine.transfer import upload
from specbench.engine.verify import ACCEPTANCE, DeviceTree, Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.draft_vocab import subset_head, vocab_subset
from specbench.methods.space import load_finetuned
from specbench.models import ModelAdapter, published

TRAIN_CMD = "python -m specbench.train method=medusa model={model} method.num_heads={k} method.share_head={share}"
VARIANTS = ("medusa1", "medusa2")


class ResBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, target: ModelAdapter, num_heads: int = 4, share_head: bool = False):
        super().__init__()
        if num_heads < 1:
            raise SpecBenchError(f"medusa num_heads must be >= 1, got {num_heads}")
        d, V = target.hidden_size, target.vocab_size
        self.num_heads, self.share_head = int(num_heads), bool(share_head)
        self.blocks = nn.ModuleList([ResBlock(d) for _ in range(num_heads)])
        if share_head:
            self.heads = None
        else:
            self.heads = nn.ModuleList([nn.Linear(d, V, bias=False) for _ in range(num_heads)])
            with torch.no_grad():
                for h in self.heads:
                    h.weight.copy_(target.lm_head.weight.float())
        self.__dict__["_target_head"] = target.lm_head  # not a submodule: never trained or saved
        self.to(device=target.device, dtype=target.dtype)

    def structure(self) -> dict:
        return {"num_heads": self.num_heads, "share_head": self.share_head}

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        """Final-norm hidden [..., d] -> K logits tensors [..., V]."""
        return [self.head(k, h) for k in range(self.num_heads)]

    def head(self, k: int, h: torch.Tensor) -> torch.Tensor:
        return self.projection(k)(self.features(k, h))

    def features(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Head k's input to its vocabulary projection."""
        return self.blocks[k](h)

    def projection(self, k: int) -> nn.Linear:
        return self._target_head if self.heads is None else self.heads[k]


def load_heads(target: ModelAdapter, cfg) -> tuple[MedusaHeads, dict]:
    if published.is_medusa_checkpoint(cfg.checkpoint):  # the Medusa authors' format (models/published.py)
        heads, info = published.load_medusa_heads(str(cfg.checkpoint), target.hidden_size, target.vocab_size, target.dtype)
        return apply_checkpoint(heads, None, target, info), info
    heads = MedusaHeads(target, int(cfg.num_heads), bool(cfg.share_head))
    where = cfg.checkpoint
    allow = bool(cfg.allow_untrained)
    ckpt = load_checkpoint("medusa", target.key, heads.structure(), where, required=where not in ("auto",) and not allow,
                           model_name=target.name)
    if ckpt is None and not allow:
        raise SpecBenchError(
            f"no trained Medusa heads for model {target.name} ({heads.structure()}); train them with `"
            + TRAIN_CMD.format(model=target.name, k=heads.num_heads, share=str(heads.share_head).lower())
            + "` or set method.allow_untrained=true"
        )
    info = {"num_heads": heads.num_heads, "share_head": heads.share_head, "heads_trained": ckpt is not None}
    return apply_checkpoint(heads, ckpt, target, info), info


BACKBONES = ("lora", "full")


def medusa2_structure(cfg) -> dict:
    """What a Medusa-2 checkpoint is keyed by (training settings such as lambda0 are recorded, not keyed).
    `backbone`: lora (the paper's recipe, 4: LoRA on every linear map of the backbone and on the LM
    head, dropout 0.05) | full (the whole backbone, its tied LM head included, fine-tuned)."""
    backbone = str(cfg.backbone)
    if backbone not in BACKBONES:
        raise choice_error("medusa backbone", backbone, BACKBONES)
    # `lora: False` is the key full fine-tuning always had, so its checkpoints still load
    s = {"variant": "medusa2", "num_heads": int(cfg.num_heads), "share_head": bool(cfg.share_head),
         "lora": backbone == "lora"}
    if s["lora"]:
        s |= {"lora_r": int(cfg.lora_r), "lora_alpha": int(cfg.lora_alpha),
              "lora_dropout": float(cfg.lora_dropout), "lora_head": True}
    return s


def load_medusa2(target: ModelAdapter, cfg) -> tuple[ModelAdapter, MedusaHeads, dict]:
    """The jointly trained backbone (a copy; `target` stays the original) and its heads."""
    structure = medusa2_structure(cfg)
    ft, ckpt = load_finetuned(
        target, "medusa2", structure, cfg,
        f"no jointly trained Medusa-2 weights for model {target.name} ({structure}); train them with `"
        + TRAIN_CMD.format(model=target.name, k=structure["num_heads"], share=str(structure["share_head"]).lower())
        + " method.variant=medusa2` or set method.allow_untrained=true")
    heads = MedusaHeads(ft, structure["num_heads"], structure["share_head"])  # share_head: the fine-tuned head
    info = {"variant": "medusa2", "num_heads": heads.num_heads, "share_head": heads.share_head,
            "backbone": "lora" if structure["lora"] else "full",
            "heads_trained": ckpt is not None}
    if ckpt is not None and "draft_quant" in ckpt:
        info["backbone_draft_quant"] = ckpt["draft_quant"]  # the heads' own rounding is info["draft_quant"]
    heads_ckpt = None if ckpt is None else {"state": ckpt["state"].get("heads"), "path": ckpt["path"],
                                           "settings": ckpt.get("settings"), "fix": ckpt["fix"]}
    return ft, apply_checkpoint(heads, heads_ckpt, ft, info), info


def build_tree(cfg, num_heads: int, settings: dict | None, published_tree: list | None = None) -> TokenTree:
    """An explicit `tree` (paths, a JSON file of paths or the name of a tree in an installed Medusa),
    dense `sizes`, or `tree_from_accuracies` (the paper's default: a sparse tree from the trained
    heads' accuracies); giving more than one is an error. `published_tree`: the tree that goes
    with published heads (they store no accuracies), used unless a tree is given."""
    n_acc, paths, sizes = cfg.tree_from_accuracies, cfg.tree, cfg.sizes
    if published_tree is not None and not paths:
        return _checked(TokenTree.from_paths(published_tree), num_heads, "medusa")
    given = [k for k, v in (("tree_from_accuracies", n_acc), ("tree", paths), ("sizes", sizes)) if v]
    if len(given) > 1:
        raise SpecBenchError(f"medusa: set only one of method.{', method.'.join(given)} (the others =null); "
                             "the default is tree_from_accuracies (the paper's sparse tree)")
    if paths:
        return paths_tree(paths, num_heads, "medusa")
    if sizes:
        tree = TokenTree.cartesian(list(sizes))
    elif n_acc:
        acc = (settings or {}).get("head_accuracy")
        if not acc:
            raise SpecBenchError("medusa tree_from_accuracies needs trained heads (their checkpoint stores the per-head "
                                 "accuracies); train them or give method.tree / method.sizes")
        tree = TokenTree.from_accuracies(acc[:num_heads], int(n_acc))
    else:
        tree = TokenTree.cartesian([2, 2, 1, 1])
    return _checked(tree, num_heads, "medusa")


def paths_tree(paths, num_heads: int, name: str) -> TokenTree:
    """The tree of `method.tree` for Medusa-style heads (medusa, hydra): Medusa's choices format
    (a list of paths), a JSON file of paths or the name of a tree in an installed Medusa. A
    malformed tree or one deeper than the heads is one line naming `name`."""
    try:
        tree = TokenTree.from_paths(published.medusa_tree(paths) if isinstance(paths, str) else [list(p) for p in paths])
    except (ValueError, TypeError) as e:  # a path without its parent, a non-integer rank
        raise SpecBenchError(f"{name} method.tree: {e}") from None
    return _checked(tree, num_heads, name)


def _checked(tree: TokenTree, num_heads: int, name: str) -> TokenTree:
    if tree.max_depth > num_heads:  # head d drafts depth d: no head for a deeper node
        raise SpecBenchError(f"{name} tree depth {tree.max_depth} exceeds num_heads={num_heads}")
    return tree


@register_method
class Medusa(SpeculativeMethod):
    name = "medusa"
    uses_controller = False  # the tree is the draft shape

    def __init__(self, target, cfg, sampling, run):
        variant = str(cfg.variant)
        if variant not in VARIANTS:
            raise choice_error("medusa variant", variant, VARIANTS)
        if variant == "medusa2":
            ft, self.heads, self.info = load_medusa2(target, cfg)
            self.finetuned_adapter, self.base_target = ft, target
            target = ft
        self.acceptance = str(cfg.acceptance)  # the loop's verifier: auto | typical
        if self.acceptance not in ACCEPTANCE:
            raise choice_error("medusa acceptance", self.acceptance, ACCEPTANCE)
        super().__init__(target, cfg, sampling, run)
        if variant == "medusa1":
            self.heads, self.info = load_heads(target, cfg)
        default_tree = None
        if self.info.get("published") and not cfg.tree:
            # published heads store no accuracies: decode with the authors' tree, as their medusa_generate
            # does, else the dense `sizes` tree
            default_tree, self.info["tree_source"] = published.default_medusa_tree()
            if default_tree is None:
                sizes = list(cfg.sizes or [2, 2, 1, 1])
                default_tree = TokenTree.cartesian(sizes).paths[1:]
                self.info["tree_source"] += f"; dense tree sizes={sizes}"
        self.tree = build_tree(cfg, self.heads.num_heads, self.info.get("train_settings"), default_tree)
        # the tree is fixed: its mask and depths go to the model's device once, not every step
        self.tree.mask, self.tree.depths = self.tree.mask.to(self.target.device), self.tree.depths.to(self.target.device)
        # ranks needed per depth
        self.ranks = [0] * self.tree.max_depth
        for p in self.tree.paths[1:]:
            self.ranks[len(p) - 1] = max(self.ranks[len(p) - 1], p[-1] + 1)
        # ranked on the training data, which the original model wrote (Medusa-2 decodes with a fine-tuned copy)
        ids, vocab_info = vocab_subset(getattr(self, "base_target", self.target), cfg, run)
        self.info |= vocab_info
        self.draft_heads = None
        if ids is not None:
            if len(ids) < max(self.ranks):
                raise SpecBenchError(f"method.draft_vocab.size={len(ids)} is smaller than the tree's widest rank ({max(self.ranks)})")
            projections = [self.heads.projection(k) for k in range(self.heads.num_heads)]
            # one SubsetHead per distinct projection (with share_head all heads project through one)
            subsets = {i: subset_head(p, ids, self.target) for i, p in {id(p): p for p in projections}.items()}
            self.draft_heads = [subsets[id(p)] for p in projections]

    def typical_acceptance(self) -> tuple:
        return float(self.cfg.epsilon), float(self.cfg.delta)

    def describe(self) -> dict:
        d = super().describe() | {k: v for k, v in self.info.items() if k != "train_settings"}
        d |= {"tree_nodes": len(self.tree) - 1, "tree_depth": self.tree.max_depth, "acceptance": self.acceptance}
        if self.acceptance == "typical":
            d |= {"epsilon": self.verifier.epsilon, "delta": self.verifier.delta}
        return d

    def verify_widths(self) -> list[int]:
        return [len(self.tree)]

    def device_tree(self) -> DeviceTree:
        """The static tree's shape on the device, once; node i's token is head depth-1's rank-r top."""
        if getattr(self, "_dtree", None) is None:
            dev = self.target.device
            self.node_head = upload([len(p) - 1 for p in self.tree.paths[1:]], dev, torch.long)
            self.node_rank = upload([p[-1] for p in self.tree.paths[1:]], dev, torch.long)
            self._dtree = DeviceTree.of(self.tree, torch.zeros(len(self.tree) - 1, dtype=torch.long, device=dev))
        return self._dtree

    def first_token(self, logits: torch.Tensor) -> int:
        # typical acceptance: "greedy decoding for the first token" (3.3.1); the authors'
        # generate_candidates takes the argmax of the prefill's logits too, at every temperature.
        # Each later step's own token is greedy already (engine/tree.py, verify_tree_typical).
        if self.acceptance == "typical":
            return int(logits.argmax(-1))
        return super().first_token(logits)

    def head_logits(self, d: int, h: torch.Tensor) -> torch.Tensor:
        """Head d's draft logits: the full vocabulary, or -inf outside method.draft_vocab's subset."""
        if self.draft_heads is None:
            return self.heads.head(d, h)
        return self.draft_heads[d](self.heads.features(d, h))

    def propose(self, k_max: int) -> Proposal:
        # the heads read the final hidden state of the last verified position (the loop keeps it);
        # every head's top tokens come back in one read (one wait on a GPU, not one per head), or,
        # greedy, none: the tree's tokens are gathered on the device and verified there
        logits = torch.stack([self.head_logits(d, self.target_hidden) for d in range(len(self.ranks))])
        top = torch.topk(logits, max(self.ranks), -1).indices
        if self.sampling.greedy:
            return Proposal([], dtree=self.device_tree().with_tokens(top[self.node_head, self.node_rank]))
        top = top.tolist()
        ranked = [row[:r] for row, r in zip(top, self.ranks)]
        return Proposal(self.tree.node_tokens(self.tokens[-1], ranked)[1:], tree=self.tree)
