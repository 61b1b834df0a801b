"""`python -m specbench ...`: Hydra entry point with one-line errors for bad input."""

from __future__ import annotations

import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("method", "task", "model", "control")


def check_choices(argv: list[str]) -> None:
    """Reject unknown group choices before Hydra does (its message spans many lines)."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in GROUPS and "," not in value:
            options = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
            if value not in options:
                fail(f"unknown {key} {value!r}; allowed: {', '.join(options)}")


def precheck(argv: list[str]) -> None:
    """Compose the config once ourselves so a bad override is one line, not Hydra's report.
    Multirun and hydra/experiment overrides are left to Hydra (compose cannot sweep)."""
    if any(a.startswith("-") or a.startswith(("hydra", "+experiment", "experiment")) for a in argv):
        return
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            compose("config", overrides=argv)
    except Exception as e:  # noqa: BLE001 - any composition failure is bad input
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        fail("; ".join(lines[:2]) or type(e).__name__)


def fail(message: str, code: int = 2) -> None:
    print(f"specbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from specbench.errors import SpecBenchError

    check_choices(sys.argv[1:])
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
