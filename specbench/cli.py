"""`python -m specbench ...`: Hydra entry point with one-line errors for bad input."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from specbench.config.compose import CONF_DIR, MULTIRUN_FLAGS, fail, precheck
from specbench.core.errors import Interrupted, SpecBenchError, interrupted
from specbench.config.help import main_help, wants_help
from specbench.config.engines import engine_argv

NOTHING_WRITTEN = "before this run wrote anything (runs a sweep finished are kept); run the same command to start again"


def main() -> None:
    if wants_help(sys.argv[1:]):  # ours, not Hydra's generic dump (that one: --hydra-help)
        print(main_help())
        return
    # Hydra's argparse takes -m only before the overrides; where a user writes it is no matter
    sys.argv[1:] = [a for a in sys.argv[1:] if a in MULTIRUN_FLAGS] + [a for a in sys.argv[1:] if a not in MULTIRUN_FLAGS]
    try:  # engine=vllm: method=<name> is one of vLLM's (conf/method/vllm), for Hydra too
        sys.argv[1:] = engine_argv(sys.argv[1:])
    except SpecBenchError as e:
        fail(str(e))

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def _main(cfg: DictConfig) -> None:
        # imported only once the command line is known good: bad input gets its one line without
        # paying for torch, transformers and every method (not a cycle: runner never imports cli)
        try:
            if cfg.engine.name == "vllm":  # its own package: the native decode loop is not imported
                from specbench.vllm_engine.run import run_vllm

                run_vllm(cfg)
            else:
                from specbench.run.runner import run

                run(cfg)
        except Interrupted as e:  # the run dir was open: what it kept
            interrupted(str(e))
        except KeyboardInterrupt:  # before the run dir was opened
            interrupted(NOTHING_WRITTEN)
        except SpecBenchError as e:
            fail(str(e))

    try:
        # every job of the command (each combination of a multirun) is composed and validated first
        precheck(sys.argv[1:])
        _main()
    except KeyboardInterrupt:  # while validating, or where Hydra itself was
        interrupted(NOTHING_WRITTEN)


if __name__ == "__main__":
    main()
