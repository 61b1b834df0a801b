"""The Self-SD skip-set search's command (the search itself: specbench/train/skipsearch.py).

    python -m specbench.tools.skipsearch model=<name> [iterations=50] [num_prompts=4] [max_new_tokens=64]
        [k=4] [sampler=tpe|gp] [seed=0] [out=<path>] [progress=true] [<any config.yaml override>]

The search's own keys and their defaults: conf/skipsearch.yaml (types: `SEARCH` in
specbench/config/schema.py); every other key=value is a Hydra override of the run's config.
"""

from __future__ import annotations

import sys

import torch

from specbench.config import settings
from specbench.config.compose import check_choices, check_values, compose, fail, validate
from specbench.config.schema import SEARCH
from specbench.config.settings import CONF_DIR
from specbench.core.errors import SpecBenchError
from specbench.methods.self_sd import model_key
from specbench.models import load_model
from specbench.train.skipsearch import gsm8k_train_prompts, progress_path, result_path, save_result, search_skip_set

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


def main(argv: list[str] | None = None) -> dict:


    argv = list(sys.argv[1:] if argv is None else argv)
    opts, overrides = parse_args(argv)
    for o in overrides:
        key = o.partition("=")[0].lstrip("+~")
        if key in ("method", "task"):
            raise SpecBenchError(f"the skip search always uses method=self_sd and task=gsm8k (train split); drop {o!r}")
    check_choices(overrides)
    cfg = compose(["method=self_sd", "task=gsm8k", *overrides])
    validate(cfg)
    torch.set_grad_enabled(False)
    run = settings.of(cfg)
    if run.threads:
        torch.set_num_threads(int(run.threads))
    target = load_model(run.model)
    prompts, ids = gsm8k_train_prompts(run.task, target.tokenizer, opts["num_prompts"], opts["seed"])
    out = opts["out"] or result_path(run.method.skip.cache_dir, model_key(target))
    result = search_skip_set(
        target, prompts, iterations=opts["iterations"], max_new_tokens=opts["max_new_tokens"], k=opts["k"],
        seed=opts["seed"], sampler=str(opts["sampler"]), progress=bool(opts["progress"]), prompt_ids=ids,
        progress_file=progress_path(out),
    )
    path = save_result(result, out)
    progress_path(out).unlink(missing_ok=True)  # done: a later search starts afresh
    ar, best = result["ar_objective"], result["objective"]
    print(
        f"best skip set ({len(result['skip']['attn'])} attention, {len(result['skip']['mlp'])} MLP sub-layers of "
        f"{result['num_layers']} layers): attn={result['skip']['attn']} mlp={result['skip']['mlp']}\n"
        f"{1e3 * best:.2f} ms/token vs AR {1e3 * ar:.2f} ms/token ({ar / best:.2f}x), "
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
