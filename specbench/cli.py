"""`python -m specbench ...`: Hydra entry point with one-line errors for bad input."""

from __future__ import annotations

import sys

from specbench.config import CONF_DIR, fail, precheck


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from specbench.errors import SpecBenchError

    # every job of the command (each combination of a multirun) is composed and validated first
    precheck(sys.argv[1:])

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def _main(cfg: DictConfig) -> None:
        from specbench.runner import run

        try:
            run(cfg)
        except SpecBenchError as e:
            fail(str(e))

    _main()


if __name__ == "__main__":
    main()
