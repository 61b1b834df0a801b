"""The typed config schema: for every key a run, `specbench.train` and `specbench.tools.skipsearch` read,
its type, range and whether null is allowed. Defaults are NOT here: conf/*.yaml is their one source
(a test checks that every shipped key has an entry here and every entry here is shipped or marked
optional). `config.validate` walks a composed config against these tables; a key without an entry
is refused as unknown.

Tables are flat, keyed by dotted paths relative to their group (`draft.num_layers` in a method
table is `method.draft.num_layers`). Group tables are chosen by the group's `name` (model: by
`loader`). This module imports nothing of specbench but `errors`: the CLI checks bad input
without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbench.core.errors import SpecBenchError, bad_value

SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes < 2**64; per-sample seeds add the sample index
THREADS_MAX = 1024
RESAMPLES_MAX = 1_000_000  # a bootstrap keeps resamples x samples indices in memory


@dataclass(frozen=True)
class Key:
    type: str                       # int | num | bool | str | list | table | any
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    null: bool = False
    choices: tuple = ()             # str: the allowed values; int/num: literal strings also allowed ("auto")
    item: Key | None = None         # list: each item's type
    empty: bool = False             # str: "" allowed; list: [] allowed
    table: dict = field(default_factory=dict, hash=False)  # table: a nested table (train.first_use.train)
    optional: bool = False          # not shipped in conf/ (a test or library knob): reads as `absent` when not given
    absent: object = None           # optional keys only: the value settings give it when not given
    folder: bool = False            # str: one folder name (run_name: a part of run_dir, so no '/' and no '..')

    def allowed(self) -> str:
        """What the key takes, in words, for the error line."""
        if self.type == "str" and self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.type in ("int", "num"):
            text = "an integer" if self.type == "int" else "a finite number"
            if self.lo is not None:
                text += f" {'>' if self.lo_open else '>='} {self.lo}"
            if self.hi is not None:
                text += f" {'and ' if self.lo is not None else ''}{'<' if self.hi_open else '<='} {self.hi}"
            text += "".join(f" or {c!r}" for c in self.choices)
        elif self.type == "list":
            text = ("a list" if self.empty else "a non-empty list") + f" of {self.item.allowed()}"
        else:
            text = {"bool": "true or false", "str": "a string" if self.empty else "a non-empty string"}.get(self.type, self.type)
            if self.folder:
                text = "one folder name (no '/' or '\\', not '.' or '..'; run_dir=<path> puts a run elsewhere)"
        return text + (" or null" if self.null else "")

    def accepts(self, v) -> bool:
        if v is None:
            return self.null
        if self.type in ("int", "num"):
            return v in self.choices if isinstance(v, str) else self._in_range(v)
        if self.type == "bool":
            return isinstance(v, bool)
        if self.type == "str" and self.folder:
            return isinstance(v, str) and v not in ("", ".", "..") and not any(c in v for c in "/\\\0")
        if self.type == "str":
            return isinstance(v, str) and (v in self.choices if self.choices else (self.empty or v != ""))
        if self.type == "list":
            return isinstance(v, list) and (self.empty or bool(v)) and all(self.item.accepts(x) for x in v)
        return True  # any, table (a table's keys are walked by config.validate)

    def _in_range(self, v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.type == "int" and not isinstance(v, int):
            return False
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)


def check(key: str, value, spec: Key) -> None:
    """`value` for `key` against `spec`; a SpecBenchError naming both and what is allowed."""
    if spec.type == "str" and spec.choices and value is not None:
        if value not in spec.choices:
            raise SpecBenchError(f"unknown {key} {value!r}; allowed: {', '.join(sorted(map(str, spec.choices)))}")
    elif not spec.accepts(value):
        raise bad_value(key, value, spec.allowed())


def INT(lo=None, hi=None, **kw) -> Key:
    return Key("int", lo, hi, **kw)


def NUM(lo=None, hi=None, **kw) -> Key:
    return Key("num", lo, hi, **kw)


def POS(**kw) -> Key:
    """A number > 0 (rates, budgets, learning rates)."""
    return Key("num", 0, lo_open=True, **kw)


def FRACTION(**kw) -> Key:
    return Key("num", 0, 1, **kw)


def BOOL(**kw) -> Key:
    return Key("bool", **kw)


def STR(**kw) -> Key:
    return Key("str", **kw)


def CHOICE(*values, **kw) -> Key:
    return Key("str", choices=values, **kw)


def LIST(item: Key, **kw) -> Key:
    return Key("list", item=item, **kw)


ANY = Key("any", null=True)
SEED = INT(0, SEED_MAX)
PATH = STR(null=True)  # a file or directory; whether it exists is the loader's check
AUTO_PATH = STR(null=True)  # "auto" or a path, or null
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")  # = specbench.models.DTYPES + auto (tests)
BACKENDS = ("eager", "mkldnn", "hybrid", "ggml", "ggml_f32", "ggml_q8", "bf16", "qint8")  # = kernels.backends.BACKENDS
COUNTS = ("consistent", "paper_output", "paper_subset")  # = control.beta_ts.COUNTS

# ------------------------------------------------------------------------------ top level
TOP = {
    "seed": SEED,
    "max_new_tokens": INT(1),
    "sampling.temperature": NUM(0),
    "sampling.top_p": NUM(0, 1, lo_open=True),
    "sampling.top_k": INT(0),
    "threads": INT(1, THREADS_MAX, null=True),
    "timing": CHOICE("coarse", "fine"),
    "warmup_tokens": INT(0),
    "profile.enabled": BOOL(),
    "profile.ks": LIST(INT(1)),  # upper bound: the model's context and memory (config.resources)
    "profile.context": INT(1),
    "profile.reps": INT(1),
    "profile.tolerance": NUM(0),
    "profile.max_remeasure": INT(0),
    "measure.spike_factor": NUM(1, lo_open=True),  # a slow sample is one `factor` times the medians: <= 1 is every sample
    "measure.max_retries": INT(0, 100),
    "measure.min_samples": INT(1),
    "measure.ci.level": NUM(0, 1, lo_open=True, hi_open=True),
    "measure.ci.resamples": INT(1, RESAMPLES_MAX),
    "measure.ci.seed": SEED,
    "measure.ci.max_rel_width": POS(),
    "measure.max_load_per_core": POS(),  # whole-run interference (summary.shared_cores)
    "measure.min_cpu_per_thread": NUM(0, 1),
    "measure.max_foreign_share": NUM(0, 1),  # others' share of our CPUs' time (interference.foreign_share)
    "progress": BOOL(),
    "overwrite": BOOL(),
    "run_name": STR(folder=True),
    "run_dir": STR(empty=True),  # empty: refused by identity.check_run_dir (config.rules), which says what to give
}

# ------------------------------------------------------------------------------ task (by name)
_TASK = {"name": STR(), "num_samples": INT(1, null=True, choices=("all",)), "seed": SEED,
         "data_dir": PATH, "max_new_tokens": INT(1), "system": STR(null=True, empty=True)}
_FIELDS = {"path": PATH, "prompt_field": STR(), "id_field": STR(null=True), "category_field": STR(null=True),
           "reference_field": STR(null=True)}
TASKS = {
    "gsm8k": _TASK | {"fewshot_index": INT(0, null=True)},
    # bounds the sandbox's rlimits can hold (a day of CPU per test, 16 TiB of address space): beyond, setrlimit failed in the child
    "humaneval": _TASK | {"timeout_s": NUM(0, 86400, lo_open=True), "memory_mb": INT(1, 1 << 24), "allow_unisolated": BOOL()},
    "jsonl": _TASK | _FIELDS,
    "mt_bench": _TASK | {"categories": LIST(STR(), null=True)},
    "spec_bench": _TASK | _FIELDS | {"url": STR(), "group_mt_bench": BOOL(), "categories": LIST(STR(), null=True)},
    "xsum": _TASK | {"fewshot_index": INT(0, null=True), "max_doc_words": INT(1, null=True)},
}

# ------------------------------------------------------------------------------ model (by loader)
_MODEL = {"name": STR(), "loader": CHOICE("gguf", "hf", "tiny"), "dtype": CHOICE(*DTYPES), "device": STR(),
          "backend": CHOICE(*BACKENDS), "attn_implementation": STR(optional=True, absent="sdpa"),
          "execution": CHOICE("eager", "graphs"), "graph_max_width": INT(1, 1024),
          "draft_quant": CHOICE("none", "q8_0")}
_CHAT = {"chat_template": BOOL(), "eos_tokens": LIST(STR(), empty=True)}
MODELS = {
    "gguf": _MODEL | _CHAT | {"package": STR(), "gguf_file": STR(), "path": PATH},
    "hf": _MODEL | _CHAT | {"id": STR(null=True), "revision": STR(null=True), "device_map": ANY,
                            "trust_remote_code": BOOL()},
    # sizes: their product is bounded by memory (config.resources); hidden_size / num_heads by rules
    "tiny": _MODEL | {"seed": SEED, "num_layers": INT(1), "hidden_size": INT(1), "intermediate_size": INT(1),
                      "num_heads": INT(1), "num_kv_heads": INT(1), "init_std": POS(),
                      "tie_embeddings": BOOL(optional=True, absent=True)},
}

# ------------------------------------------------------------------------------ method (by name)
_TRAINABLE = {"checkpoint": AUTO_PATH, "allow_untrained": BOOL(), "train_if_missing": BOOL()}
_DRAFT_VOCAB = {"draft_vocab.size": INT(1, null=True), "draft_vocab.source": STR()}
_DRAFT = {"draft.source": CHOICE("truncate", "hf"), "draft.num_layers": INT(1, choices=("auto",)),
          "draft.checkpoint": AUTO_PATH, "draft.id": STR(null=True), "draft.dtype": CHOICE(*DTYPES),
          "draft.device": STR(), "train_if_missing": BOOL()}
_LORA = {"lora": BOOL(), "lora_r": INT(1), "lora_alpha": POS()}
# SAM-Decoding's auxiliary drafters (= methods/samd.py SUPPORTED_AUX: the ones it keeps in sync)
SAMD_AUX = ("eagle", "eagle3", "hydra", "medusa", "pld", "rest", "self_sd", "token_recycling", "vanilla_sd")
METHODS = {
    "ar": {"name": STR()},
    "eagle": {"name": STR(), "top_k": INT(1), "depth": INT(1), "num_nodes": INT(1), "bias": BOOL(),
              "loss_reg": NUM(0), "loss_cls": NUM(0), "cls_labels": CHOICE("soft", "hard")} | _TRAINABLE,
    "eagle3": {"name": STR(), "top_k": INT(1), "depth": INT(1), "num_nodes": INT(1), "layers": ANY,
               "draft_vocab_size": INT(1, null=True), "ttt_steps": INT(1), "step_decay": NUM(0, 1),
               "lm_head": CHOICE("trained", "target")} | _TRAINABLE,
    "eesd": {"name": STR(), "n_layers": INT(1), "head": CHOICE("shared", "trained")} | _TRAINABLE | _DRAFT_VOCAB,
    "hf_assisted": {"name": STR(), "mode": CHOICE("assistant", "prompt_lookup"), "k": INT(1)} | _DRAFT,
    "medusa": {"name": STR(), "variant": CHOICE("medusa1", "medusa2"), "num_heads": INT(1), "share_head": BOOL(),
               "sizes": LIST(INT(1), null=True), "tree": ANY, "tree_from_accuracies": INT(1, null=True),
               "acceptance": CHOICE("auto", "typical"), "epsilon": FRACTION(), "delta": NUM(0),
               "loss_decay": NUM(0, 1, lo_open=True), "lambda0": NUM(0), "lm_loss": CHOICE("kl", "ce"),
               "heads_lr_ratio": POS(), "lr": POS(null=True), "lambda0_schedule": CHOICE("sine", "linear", "constant"),
               "warmup_epochs": INT(0), "warmup": CHOICE("heads", "backbone"), "backbone": CHOICE("lora", "full"),
               "lora_r": INT(1), "lora_alpha": POS(), "lora_dropout": NUM(0, 1, hi_open=True)} | _TRAINABLE | _DRAFT_VOCAB,
    "hydra": {"name": STR(), "variant": CHOICE("hydra_pp", "hydra"), "num_heads": INT(1), "share_head": BOOL(), "num_layers": INT(1, null=True),
              "tree": ANY, "dropout": NUM(0, 1, hi_open=True)} | _TRAINABLE,
    "pld": {"name": STR(), "max_ngram": INT(1), "min_ngram": INT(1)},
    "token_recycling": {"name": STR(), "topk": INT(1), "tree": ANY, "max_nodes": INT(1, null=True),
                        "reset_per_sequence": BOOL()},
    "lookahead": {"name": STR(), "window": INT(1), "ngram": INT(3), "guess": INT(1), "pool_from_prompt": BOOL(),
                  "full_match_bonus": BOOL()},
    "rest": {"name": STR(), "corpus": LIST(STR()), "build_missing": BOOL(), "max_suffix": INT(1), "min_suffix": INT(1),
             "max_matches": INT(1), "continuation_len": INT(1), "num_draft": INT(1),
             "cut": CHOICE("paths", "nodes")},
    "suffix": {"name": STR(), "spec": CHOICE("tree", "path"), "max_depth": INT(1), "max_spec_tokens": INT(1),
               "max_spec_factor": NUM(0, 1e6), "max_spec_offset": NUM(-1e6, 1e6), "min_token_prob": FRACTION(), "reset_per_sequence": BOOL()},
    "samd": {"name": STR(), "n_predicts": INT(2), "len_threshold": INT(0), "len_bias": INT(),
             "corpus": LIST(STR(), empty=True), "build_missing": BOOL(), "aux": CHOICE(*SAMD_AUX),
             "aux_settings": ANY},  # a mapping of the auxiliary's keys (config.rules checks them against its table)
    "self_sd": {"name": STR(), "skip.source": STR(), "skip.model": STR(null=True), "skip.attn": LIST(INT(0), empty=True),
                "skip.mlp": LIST(INT(0), empty=True), "skip.cache_dir": PATH, "skip.path": PATH,
                "train_if_missing": BOOL()} | _DRAFT_VOCAB,
    "swift": {"name": STR(), "verification": CHOICE("tree", "chain"), "optimize": BOOL(), "bayes": BOOL(),
              "skip_ratio": FRACTION(), "context_window": INT(1), "opt_interval": INT(1), "bayes_interval": INT(1),
              "max_opt_iter": INT(0), "max_tolerance_iter": INT(0), "max_score": FRACTION()},
    "space": {"name": STR(), "k": INT(1), "p_ar": FRACTION(), "lr": POS(), "seed": SEED,
              "mask_rule": CHOICE("group", "eq6")} | _LORA | _TRAINABLE,
    "vanilla_sd": {"name": STR()} | _DRAFT,
}

# ------------------------------------------------------------------------------ control (by name)
_K_MAX = {"name": STR(), "k_max": INT(1)}
_TS = {"counts": CHOICE(*COUNTS), "reset_per_sequence": BOOL()}
CONTROLS = {
    "adaptive_threshold": _K_MAX | {"gamma": FRACTION(), "epsilon": NUM(0), "beta1": NUM(0, 1, hi_open=True),
                                    "beta2": NUM(0, 1, hi_open=True), "alpha": NUM(0, 1, lo_open=True),
                                    "reset_per_sequence": BOOL()},
    # a Beta prior of 1e308 pseudo-counts: betaincinv returns nan and drafting silently stops early (1e6 is already
    # a prior no run of samples can move)
    "beta_ts": _K_MAX | _TS | {"alpha0": NUM(0, 1e6, lo_open=True), "beta0": NUM(0, 1e6, lo_open=True)},
    "cali_ts": _K_MAX | _TS | {"sigma_m": NUM(1e-6, 1e6), "sigma_s": NUM(1e-6, 1e6), "theta0": FRACTION(),
                               "theta_update": CHOICE("mean", "paper"), "predictor": PATH},
    "fixed": _K_MAX | {"k": INT(1)},
    "threshold": _K_MAX | {"gamma": FRACTION()},
}

# ------------------------------------------------------------------------------ train
_TRAIN = {
    "data.num_prompts": INT(1), "data.num_original": INT(0), "data.max_new_tokens": INT(1),
    "data.batch_size": INT(1), "data.greedy_fraction": FRACTION(), "data.greedy_prefix": INT(0),
    "data.temperature": POS(), "data.top_p": NUM(0, 1, lo_open=True),
    "data.gen_minutes": POS(null=True),  # a safety cap, null: none (the budget is num_prompts)
    "data.general_prompts": INT(0), "data.general_max_prompt_tokens": INT(8),
    # max_sequences: one at least is held out, so 1 left nothing to train on
    "max_sequences": INT(2), "cap": CHOICE("first", "spread"), "labels": CHOICE("target", "text"), "distill": CHOICE("hard", "soft"), "lr": POS(),
    "feature_cache": CHOICE("float16", "float32", null=True),
    "prefill_batch_size": INT(1), "matmul": CHOICE("float32", "tf32"),
    "max_steps": INT(1, null=True), "epochs": INT(1, null=True),  # null: the other bound (not both: the loop says so)
    "batch_size": INT(1), "max_len": INT(2),
    # a safety cap, null: none; 0: no optimisation step, which the trainer reports as one line (no checkpoint written)
    "max_minutes": NUM(0, null=True),
    "schedule": CHOICE("constant", "cosine"), "warmup_steps": INT(0),
    "checkpoint_every": INT(1, null=True), "eval_every": INT(1, null=True),
    "eval_fraction": NUM(0, 1, hi_open=True),
    "seed": SEED, "cali": BOOL(), "init": PATH,
    "cali_predictor.max_i": INT(1), "cali_predictor.pairs_per_sequence": INT(1), "cali_predictor.epochs": INT(1),
    "cali_predictor.lr": POS(), "cali_predictor.batch_size": INT(1),
}
SKIP_SEARCH = {"iterations": INT(1), "num_prompts": INT(1), "max_new_tokens": INT(1), "k": INT(1),
               "draft_exit": CHOICE("adaptive", "fixed"), "gamma": FRACTION(), "alpha": FRACTION(),
               "sampler": CHOICE("tpe", "gp"), "seed": SEED}
TRAIN = _TRAIN | {
    "first_use.loaders": LIST(CHOICE("gguf", "hf", "tiny"), empty=True),
    "first_use.max_params": POS(),
    "first_use.train": Key("table", table=_TRAIN),  # merged over train.* (a subset of its keys)
    **{f"first_use.skip_search.{k}": v for k, v in SKIP_SEARCH.items() if k != "seed"},
}
# python -m specbench.tools.skipsearch's own keys (their defaults: conf/skipsearch.yaml)
SEARCH = SKIP_SEARCH | {"out": PATH, "progress": BOOL(), "confirm": INT(0), "repeats": INT(1)}

# ------------------------------------------------------------------------------ engine (by name), vLLM's methods
ENGINES = {
    "native": {"name": STR()},
    "vllm": {"name": STR(), "python": STR(), "batch_sizes": LIST(INT(1, 4096)), "dtype": CHOICE(*DTYPES),
             "max_model_len": INT(16), "enforce_eager": BOOL(), "kv_cache_gib": POS(), "tensor_parallel_size": INT(1),
             "pipeline_parallel_size": INT(1), "ignore_eos": BOOL(), "timeout_s": POS()},
}
_SPEC = {"name": STR(), "num_speculative_tokens": INT(1, 64)}
_HEAD = _SPEC | {"model": STR(null=True)}  # null is refused by config.rules with what to give
# engine=vllm: method=<name> is conf/method/vllm/<name>.yaml (specbench.vllm_engine.settings maps them to vLLM's keys)
VLLM_METHODS = {
    "ar": {"name": STR()},
    "ngram": _SPEC | {"prompt_lookup_min": INT(1), "prompt_lookup_max": INT(1)},
    "suffix": _SPEC | {"max_tree_depth": INT(1), "max_cached_requests": INT(0), "max_spec_factor": NUM(0),
                       "min_token_prob": FRACTION()},
    "eagle": _HEAD, "eagle3": _HEAD, "medusa": _HEAD, "draft_model": _HEAD,
}

GROUP_KEYS = ("method", "task", "model", "control", "train", "engine")  # nodes with their own tables
GROUPS = {"method": METHODS, "task": TASKS, "control": CONTROLS, "engine": ENGINES}  # chosen by `name`; model by `loader`


def group_table(group: str, cfg_group, engine: str = "native") -> tuple[str, dict | None]:
    """(the choice, its table) for one group node of a composed config; table None: unknown choice.
    `engine`: the config's engine.name (vllm: the method is one of vLLM's)."""
    if group == "method" and engine == "vllm":
        choice = cfg_group.get("name")
        return repr(choice), VLLM_METHODS.get(choice)
    if group == "train":
        return "train", TRAIN
    if group == "model":
        choice = cfg_group.get("loader")
        return f"loader {choice!r}", MODELS.get(choice)
    choice = cfg_group.get("name")
    return repr(choice), GROUPS[group].get(choice)


def all_tables() -> list[dict]:
    """Every table (tests: the keys a config can have)."""
    return [TOP, TRAIN, SEARCH, *TASKS.values(), *MODELS.values(), *METHODS.values(), *CONTROLS.values(),
            *ENGINES.values(), *VLLM_METHODS.values()]
