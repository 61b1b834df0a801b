"""The Self-SD skip-set search's command (the search itself: specbench/train/skipsearch.py).

    python -m specbench.tools.skipsearch model=<name> [iterations=50] [num_prompts=4] [max_new_tokens=64]
        [draft_exit=adaptive|fixed] [k=8] [gamma=0.8] [alpha=0.9] [sampler=tpe|gp] [seed=0] [confirm=0] [repeats=3] [out=<path>] [progress=true] [<any config.yaml override>]

A finished search of the same setting at `out` is reused (so `confirm=5` after a search only confirms).

The search's own keys and their defaults: conf/skipsearch.yaml (types: `SEARCH` in
specbench/config/schema.py); every other key=value is a Hydra override of the run's config.
"""

from __future__ import annotations

import sys

import torch

from specbench.config import settings
from specbench.config.compose import check_choices, compose, fail
from specbench.config.validate import check_values, validate
from specbench.config.schema import SEARCH
from specbench.config.settings import CONF_DIR
from specbench.core.errors import SpecBenchError, check_output_file
from specbench.methods.self_sd import model_key
from specbench.models import load_model
from specbench.train.skipsearch import (confirm_best, gsm8k_train_prompts, load_result, progress_path, result_path,
                                       save_result, search_control, search_skip_set)

# keys of the command line that belong to the search, not to the Hydra config: conf/skipsearch.yaml
SEARCH_FILE = CONF_DIR / "skipsearch.yaml"


# -- command line ------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    """Split `key=value` arguments into the search's own settings and Hydra overrides."""
    import yaml

    opts, overrides = yaml.safe_load(SEARCH_FILE.read_text()), []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in SEARCH:
            opts[key] = yaml.safe_load(value) if value else None
        elif sep:
            overrides.append(arg)
        else:
            raise SpecBenchError(f"arguments are key=value, got {arg!r}")
    check_values(opts, SEARCH)  # types and ranges: specbench/config/schema.py
    return opts, overrides


def control_of(opts: dict) -> dict:
    return search_control(opts["draft_exit"], opts["k"], opts["gamma"], opts["alpha"])


def finished(out, target, prompts, opts) -> dict | None:
    """The search result already at `out` when it is of this exact setting (so `confirm=N` after a
    search does not search again), else None."""
    try:
        r = load_result(out)
    except SpecBenchError:
        return None
    same = (r.get("model_key") == model_key(target) and [p.get("tokens") for p in r.get("prompts") or []] == prompts
            and all(r.get(k) == opts[k] for k in ("iterations", "max_new_tokens", "seed", "sampler"))
            and r.get("control") == control_of(opts))
    return r if same else None


def main(argv: list[str] | None = None) -> dict:


    argv = list(sys.argv[1:] if argv is None else argv)
    opts, overrides = parse_args(argv)
    for o in overrides:
        key = o.partition("=")[0].lstrip("+~")
        if key in ("method", "task"):
            raise SpecBenchError(f"the skip search always uses method=self_sd and task=gsm8k (train split); drop {o!r}")
    check_choices(overrides)
    if opts["out"]:  # before the search, not after it
        check_output_file(opts["out"], "out=")
    cfg = compose(["method=self_sd", "task=gsm8k", *overrides])
    validate(cfg)
    torch.set_grad_enabled(False)
    run = settings.of(cfg)
    if run.threads:
        torch.set_num_threads(int(run.threads))
    target = load_model(run.model)
    prompts, ids = gsm8k_train_prompts(run.task, target.tokenizer, opts["num_prompts"], opts["seed"])
    out = opts["out"] or result_path(run.method.skip.cache_dir, model_key(target))
    result = finished(out, target, prompts, opts)
    if result is None:
        result = search_skip_set(
            target, prompts, iterations=opts["iterations"], max_new_tokens=opts["max_new_tokens"], control=control_of(opts),
            seed=opts["seed"], sampler=str(opts["sampler"]), progress=bool(opts["progress"]), prompt_ids=ids,
            progress_file=progress_path(out),
        )
        save_result(result, out)  # the search is kept before confirming starts
        progress_path(out).unlink(missing_ok=True)  # done: a later search starts afresh
    else:
        print(f"self_sd skip search: the finished search of this setting is reused ({out})")
    done = result.get("confirm") or {}
    if opts["confirm"] and (done.get("top"), done.get("repeats")) != (opts["confirm"], opts["repeats"]):
        result = confirm_best(target, result, opts["confirm"], opts["repeats"], progress=bool(opts["progress"]))
    path = save_result(result, out)
    ar, best = result["ar_objective"], result["objective"]
    if result.get("confirm"):
        c = result["confirm"]
        for x in c["candidates"]:
            print(f"confirm: trial {x['trial']} (search {1e3 * x['search_value']:.2f} ms/token): speedups over AR "
                  f"{', '.join(f'{v:.2f}' for v in x['speedups'])}, median {x['median_speedup']:.2f}x")
        print(f"confirm: kept trial {c['chosen_trial']} (the search's own best was trial {result['search_best']['trial']})")
    print(
        f"skip set ({len(result['skip']['attn'])} attention, {len(result['skip']['mlp'])} MLP sub-layers of "
        f"{result['num_layers']} layers): attn={result['skip']['attn']} mlp={result['skip']['mlp']}\n"
        f"its trial in the search: {1e3 * best:.2f} ms/token vs AR {1e3 * ar:.2f} ms/token ({ar / best:.2f}x), "
        f"acceptance {result['best_stats'].get('acceptance')}\n"
        f"saved: {path}  (use: method=self_sd method.skip.source=search)"
    )
    return result


def cli() -> None:
    try:
        main()
    except SpecBenchError as e:
        fail(str(e))


if __name__ == "__main__":
    cli()
