"""Composing the configuration, and validating it (specbench/config/validate.py), before anything is written to disk.

Every entry point (`python -m specbench`, `specbench.train`, `specbench.tools.skipsearch`) composes the
Hydra config through here and runs `validate` once over the result: a bad value is one line
`specbench: error: ...` (exit 2) naming the key, the value and what is allowed. For multiruns and
`+experiment` presets every combination of the sweep is composed and validated before the first
job starts, so Hydra's multi-line reports never reach the user.

It imports no torch (the CLI refuses bad input before torch loads); cli, train and skipsearch all
import it. After `validate`, the entry points read the config as typed settings (specbench/config/settings.py).
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from specbench.config.engines import method_configs, method_options
from specbench.config.settings import CONF_DIR
from specbench.config.validate import validate
from specbench.core.errors import SpecBenchError, one_line

GROUPS = ("method", "task", "model", "control", "experiment", "engine")
MULTIRUN_FLAGS = ("-m", "--multirun")
MAX_COMBINATIONS = 256  # beyond: each swept value once, the other keys at their first value


PAPER_CONTROL_FALLBACK = "fixed"  # the default controller of a method without conf/control/paper/<method>.yaml


def register_paper_control_fallbacks(conf_dir: Path = CONF_DIR) -> list[str]:
    """`control: paper/${method}` (conf/config.yaml) picks each method's paper default controller;
    the file is optional: for a method without one, `control/paper/<method>` is registered in
    Hydra's config store as PAPER_CONTROL_FALLBACK (a file, where there is one, is found first).
    Runs when this module is imported, which every entry point does before composing."""
    store = ConfigStore.instance()
    methods = [p.stem for p in (conf_dir / "method").glob("*.yaml")] + method_configs(conf_dir)
    missing = sorted(m for m in methods if not (conf_dir / "control" / "paper" / f"{m}.yaml").is_file())
    for name in missing:
        group, _, leaf = f"control/paper/{name}".rpartition("/")
        store.store(group=group, name=leaf, node={"defaults": [f"/control/{PAPER_CONTROL_FALLBACK}@_here_"]})
    return missing


register_paper_control_fallbacks()


def fail(message: str, code: int = 2) -> None:
    print(f"specbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def check_choices(argv: list[str]) -> None:
    """Reject unknown group choices before Hydra does (its message spans many lines); argv as
    config.engines.engine_argv rewrote it."""
    for arg in argv:
        if arg.startswith("~"):
            # the code reads every shipped key: a removed one would fail late, or fall back to a default elsewhere
            fail(f"{arg!r}: removing a key is not supported; set it to another value (null where allowed)")
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        for v in value.split(",") if sep and key in GROUPS else []:
            try:
                name, options, where = method_options(CONF_DIR, v, argv) if key == "method" else (v, _choices(key), "")
            except SpecBenchError as e:
                fail(str(e))
            if name not in options:
                fail(f"unknown {key} {name!r}{where}; allowed: {', '.join(options)}")


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    """The composed config; any composition failure is a one-line SpecBenchError."""
    try:
        return _compose(overrides, hydra_config)
    except Exception as e:  # noqa: BLE001 - any composition failure is bad input
        if m := re.match(r"Could not override '([^']+)'", str(e)):
            raise SpecBenchError(_unknown_key(m.group(1), overrides)) from None
        raise SpecBenchError(_culprit(overrides) + one_line(e)) from None


def _compose(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=hydra_config)


def _culprit(overrides: list[str]) -> str:
    """'<override>: ' for the first override that composition refuses (Hydra's message may not name it:
    `profile.ks.x=1` -> "invalid literal for int()"); '' when none alone is to blame."""
    for i, o in enumerate(overrides):
        try:
            _compose(overrides[:i + 1])
        except Exception:  # noqa: BLE001
            return f"{o}: "
    return ""


def _unknown_key(key: str, overrides: list[str]) -> str:
    """Hydra refuses a key the config lacks and suggests `+key=...`, which the schema then refuses too:
    compose it that way and let validate name the allowed keys and the nearest known one."""
    plus = [f"+{o}" if o.split("=", 1)[0] == key else o for o in overrides]
    try:
        validate(_compose(plus))
    except SpecBenchError as e:
        if repr(key) in str(e) or repr(key.split(".")[0]) in str(e):  # contrl.k: the unknown part is 'contrl'
            return str(e)
    except Exception:  # noqa: BLE001 - the '+' form fails for another reason: Hydra's own words are no better
        pass
    return f"unknown key {key!r}"


def _sweep_values(overrides: list[str]) -> list[list[str]]:
    """Each override as the list of its values (`k=1,2` -> ['k=1', 'k=2'])."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001
        raise SpecBenchError(one_line(e)) from None
    out = []
    for o in parsed:
        if o.is_sweep_override():
            key = o.get_key_element()
            out.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            out.append([o.input_line])
    return out


def combinations(argv: list[str]) -> list[list[str]] | None:
    """The override lists of every job `argv` starts (one unless it is a multirun); None when
    `argv` holds a Hydra flag we leave to Hydra (--help, --cfg, ...)."""
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in MULTIRUN_FLAGS for f in flags):
        return None
    overrides = [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]
    multirun = bool(flags)
    per_key = _sweep_values(overrides) if multirun else [[o] for o in overrides]
    first = [values[0] for values in per_key]
    base = compose(first, hydra_config=True)
    if str(base.hydra.mode).endswith("MULTIRUN"):
        multirun = True
        per_key = _sweep_values(overrides)
    if not multirun:
        return [overrides]
    # sweeps of a preset (hydra.sweeper.params), unless the command line sets the same key
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    params = base.hydra.sweeper.get("params") or {}
    per_key += [_sweep_values([f"{k}={v}"])[0] for k, v in params.items() if k not in given]
    if math.prod(len(v) for v in per_key) <= MAX_COMBINATIONS:
        return [list(c) for c in itertools.product(*per_key)]
    first = [values[0] for values in per_key]
    return [first[:i] + [v] + first[i + 1:] for i, values in enumerate(per_key) for v in values]


def precheck(argv: list[str]) -> None:
    """Compose and validate every job of `argv` (as config.engines.engine_argv rewrote it); one line and
    exit 2 on the first bad one."""
    check_choices(argv)
    try:
        for overrides in combinations(argv) or []:
            validate(compose(overrides))
    except SpecBenchError as e:
        fail(str(e))


