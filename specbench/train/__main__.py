"""python -m specbench.train method=<eesd|vanilla_sd|...> model=<name> [train.max_minutes=..]

Same Hydra configuration as the benchmark (conf/), plus the `train` group. Generates (or reuses)
the self-distillation data, trains, and caches the checkpoint by model and structure where the
methods look for it (`checkpoint: auto`).
"""

from __future__ import annotations

import sys

import torch

from specbench.config import settings
from specbench.config.compose import check_choices, compose, fail, validate
from specbench.core.errors import SpecBenchError, choice_error, interrupted, stop_on_sigterm
from specbench.config.help import train_help, wants_help
from specbench.models import load_model
from specbench.train.session import TRAINERS, train_model

KEPT = ("the generated batches (journal) and the training state saved every train.checkpoint_every steps are kept; "
        "run the same command to resume")


def main(argv: list[str]) -> None:
    if wants_help(argv):
        print(train_help(sorted(TRAINERS)))
        return
    check_choices(argv)
    try:
        cfg = compose(argv)
        validate(cfg)
        print(train(cfg))
    except SpecBenchError as e:
        fail(str(e))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the journals and resume states on disk are the progress
        from tqdm import tqdm
        for bar in list(getattr(tqdm, "_instances", ())):  # the open bar ends its line first, not after ours
            bar.close()
        interrupted(KEPT)


def train(cfg) -> dict:
    """Train what the composed (validated) config names; the trainers read its typed settings."""
    run = settings.of(cfg)
    if run.method.name not in TRAINERS:
        raise choice_error("trainable method", run.method.name, TRAINERS)
    if run.threads:
        torch.set_num_threads(int(run.threads))
    torch.set_grad_enabled(False)
    return train_model(run, load_model(run.model))


if __name__ == "__main__":
    stop_on_sigterm()  # the process's own entry only: a test calling main() keeps its SIGTERM as it was
    main(sys.argv[1:])
