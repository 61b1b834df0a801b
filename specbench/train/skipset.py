"""Self-SD's trained part: the skip set, found by the Bayesian-optimisation search of
specbench/train/skipsearch.py (`python -m specbench.tools.skipsearch` for the full budget). Declared here, with
the other trained parts, so that first use finds it (specbench/train/parts.py)."""

from __future__ import annotations

from specbench.models.artifacts import find_skip_result
from specbench.methods.self_sd import model_key
from specbench.config.settings import shipped
from specbench.train.skipsearch import gsm8k_train_prompts, progress_path, save_result, search_control, search_skip_set
from specbench.train.parts import Part, first_use


def search(cfg, target, path) -> None:
    s = cfg.train.first_use.skip_search
    task = shipped("task", "gsm8k", {"data_dir": cfg.task.data_dir})
    prompts, ids = gsm8k_train_prompts(task, target.tokenizer, int(s.num_prompts), int(cfg.seed))
    # an interrupted first-use search resumes from its finished trials next time
    result = search_skip_set(target, prompts, iterations=int(s.iterations), max_new_tokens=int(s.max_new_tokens),
                             control=search_control(s.draft_exit, s.k, s.gamma, s.alpha), seed=int(cfg.seed),
                             sampler=str(s.sampler), progress=True, prompt_ids=ids,
                             progress_file=progress_path(path))
    save_result(result | {"model_key": model_key(target), "first_use": True}, path)
    progress_path(path).unlink(missing_ok=True)


def search_minutes(cfg) -> float:
    s = cfg.train.first_use.skip_search
    return (int(s.iterations) + 2) * int(s.num_prompts) * int(s.max_new_tokens) * 0.1 / 60  # ~0.1 s/token on CPU


@first_use("self_sd")
def skip_search_parts(cfg, target):
    skip = cfg.method.skip
    if skip.source not in ("auto", "search") or skip.path or skip.attn or skip.mlp:
        return []
    path = find_skip_result(skip.cache_dir, model_key(target))  # a published set counts as present
    return [Part("the Self-SD skip set (Bayesian-optimisation search)", path,
                 lambda cfg, target: search(cfg, target, path), search_minutes, "skip_search")]
