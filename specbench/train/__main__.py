"""python -m specbench.train method=<eesd|vanilla_sd|...> model=<name> [train.max_minutes=..]

Same Hydra configuration as the benchmark (conf/), plus the `train` group. Generates (or reuses)
the self-distillation data, trains, and caches the checkpoint by model and structure where the
methods look for it (`checkpoint: auto`).
"""

from __future__ import annotations

import os
import sys

from specbench.config import check_choices, compose, fail, validate
from specbench.errors import SpecBenchError


def main(argv: list[str]) -> None:
    check_choices(argv)
    try:
        cfg = compose(argv)
        validate(cfg)
        print(train(cfg))
    except SpecBenchError as e:
        fail(str(e))


def train(cfg) -> dict:
    import torch

    from specbench.errors import choice_error
    from specbench.models import load_model
    from specbench.train.data import build_sequences
    import specbench.train.medusa_space  # noqa: F401 - registers the medusa and space trainers
    import specbench.train.medusa2  # noqa: F401 - registers the Medusa-2 trainer (method.variant=medusa2)
    from specbench.train.trainers import TRAINERS

    if cfg.method.name not in TRAINERS:
        raise choice_error("trainable method", cfg.method.name, TRAINERS)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    torch.set_grad_enabled(False)
    target = load_model(cfg.model)
    data_dir = cfg.task.get("data_dir") or os.environ.get("SPECBENCH_DATA_DIR")
    sequences = build_sequences(target, cfg.train.data, data_dir, int(cfg.train.seed))
    cap = cfg.train.get("max_sequences")
    if cap and len(sequences) > int(cap):
        # generated sequences come first: keep them all, cap the original text
        sequences = sequences[: int(cap)]
    return TRAINERS[cfg.method.name](target, cfg, sequences)


if __name__ == "__main__":
    main(sys.argv[1:])
