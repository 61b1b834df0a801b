"""Typed settings (specbench/config/settings.py): every shipped config builds them, they are the schema's
keys and nothing else, the run-dir names of a few commands are what they were before settings
existed, and no module of the package reads a config key with a default of its own."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from helpers import CONF, run_settings

from specbench.config import schema, settings
from specbench.config.compose import compose
from specbench.core.errors import SpecBenchError
from specbench.config.engines import engine_argv

PKG = Path(__file__).resolve().parents[1] / "specbench"


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _leaves(s, prefix="") -> dict:
    out = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        out |= _leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else {f"{prefix}{f.name}": v}
    return out


@pytest.mark.parametrize("group", ["method", "task", "control", "engine", "model"])
def test_every_shipped_choice_builds_its_settings_with_the_yaml_values(group):
    for choice in _choices(group):
        run = settings.of(compose(["model=tiny-llama", f"{group}={choice}"]))
        node = settings.record(getattr(run, group))
        s = getattr(run, group)
        table = schema.group_table(group, node)[1]
        assert set(_leaves(s)) == set(table), f"{group}={choice}: the settings' fields are its table's keys"
        shipped = yaml.safe_load((CONF / group / f"{choice}.yaml").read_text())
        for key, value in shipped.items():
            if not isinstance(value, dict) and not str(value).startswith("${"):
                assert getattr(s, key) == value, f"{group}={choice}: {key}"


def test_vllm_methods_and_the_run_level_keys_build_too():
    for choice in _choices("method/vllm"):
        run = settings.of(compose(engine_argv(["engine=vllm", f"method={choice}"])))
        assert run.method.name == choice and set(_leaves(run.method)) == set(schema.VLLM_METHODS[choice])
    run = run_settings()
    assert set(_leaves(run.train)) - {"first_use.train"} == {k for k in schema.TRAIN if k != "first_use.train"}
    assert run.measure.ci.level == 0.95 and run.sampling.temperature == 0.0 and run.profile.ks[0] == 1


def test_a_settings_object_refuses_what_its_table_does_not_have():
    run = run_settings("method=vanilla_sd")
    with pytest.raises(AttributeError):
        run.method.num_layers  # noqa: B018 - a key of method.draft, not of the method
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.method.name = "pld"
    with pytest.raises(SpecBenchError, match=r"unknown key 'method.foo'"):
        settings.merge(run.method, {"foo": 1})
    with pytest.raises(SpecBenchError, match=r"method.draft.num_layers=2.5 is not allowed; expected an integer >= 1 or 'auto'"):
        settings.merge(run.method, {"draft": {"num_layers": 2.5}})
    node = settings.record(run.method)
    del node["train_if_missing"]
    with pytest.raises(SpecBenchError, match="method.train_if_missing is missing"):
        settings.group("method", node)


def test_merge_keeps_the_node_as_composed_and_record_returns_it():
    run = run_settings("method=vanilla_sd")
    merged = settings.merge(run.method, {"draft": {"num_layers": 2}})
    assert merged.draft.num_layers == 2 and merged.draft.source == run.method.draft.source
    assert list(settings.record(merged)) == list(settings.record(run.method))  # key order: as composed
    tiny = settings.record(run.model)
    assert "attn_implementation" not in tiny and run.model.attn_implementation == "sdpa"  # optional: its `absent`


# run_name of each command on main before settings existed (SPECBENCH_DATA_DIR=/fixed/data): the
# fingerprint is computed from the composed config, as it was
NAMES = {
    # session 52 (issue 44): the Self-SD skip search's first-use settings left the identity of every other
    # method (they never read them) and Self-SD's first-use search took the authors' draft exit, so the names of
    # the methods that train on first use changed once
    (): "vanilla_sd-fixed-b60a994d",
    ("method=eesd", "control=cali_ts"): "eesd-cali_ts-cd4ae2af",
    ("method=eagle3", "task=xsum"): "eagle3-fixed-4d288901",
    ("model=tiny-llama", "method=samd"): "samd-fixed-5750d722",
    # issue 44 changed medusa's default (share_head: true), so its name changed with it
    ("method=medusa", "method.variant=medusa2", "model=tiny-llama"): "medusa-fixed-cef569df",
    ("method=pld", "task=humaneval", "sampling.temperature=0.7"): "pld-fixed-f28b60b6",
    ("engine=vllm", "method=ngram"): "ngram-fixed-4f67c2db",
    ("method=self_sd", "control=adaptive_threshold", "task=mt_bench"): "self_sd-adaptive_threshold-f21019a3",
    ("method=swift", "model=tiny-llama", "task=jsonl", "task.path=x.jsonl"): "swift-threshold-b9960c19",
}


def test_run_dir_names_did_not_change(monkeypatch):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", "/fixed/data")
    for argv, name in NAMES.items():
        assert compose(engine_argv(list(argv))).run_name == name, argv


def test_the_tiny_models_key_did_not_change():
    from specbench.models import load_model

    # load_model(compose(["model=tiny-llama", ...]).model).key on main (cf2b36e) before settings existed
    for extra, key in [((), "tiny-293bb9fb798f"), (("model.num_layers=2",), "tiny-a90d41af01bf"),
                       (("model.backend=mkldnn",), "tiny-293bb9fb798f"), (("model.execution=graphs",), "tiny-293bb9fb798f")]:
        assert load_model(run_settings("model=tiny-llama", *extra).model).key == key


# ------------------------------------------------------------------------------ no defaults in code
# A config default is written once, in conf/. Forbidden in specbench/ (the settings objects have no
# `.get`; this catches the reads that would bypass them):
#  1. `X.get(...)` where X names a config: a name (or a chain ending in an attribute) spelled like
#     one (CONFIG_NAME), e.g. cfg.get(..), self.cfg.get(..), cfg.method.get(..), run_cfg.get(..);
#  2. `X.get("<a config key>", <default>)` under any name, a key being any leaf of a schema table,
#     unless NOT_CONFIG lists that file and key (a dict that is not config and shares a key name);
#  3. `getattr(X, "...", <default>)` and `OmegaConf.select(..., default=...)` on a config.
# Exempt: config/validate.py and config/schema.py (the validator reads composed nodes that may lack the key it is
# about to report; the schema chooses a table by the node's name) and report/ (it reads the
# config.json of recorded runs, where an older run may lack a later key: a record, not a config).
CONFIG_NAME = r"cfg$|^(run|ctx|measure)$"  # settings objects have no .get at all: calling one fails anyway
EXEMPT = ("config/validate.py", "config/schema.py", "report/")
NOT_CONFIG = {
    # file, key: what the dict is
    ("methods/eagle3_head.py", "draft_vocab_size"): "a released EAGLE-3 draft's config.json (absent: the full vocabulary)",
    ("models/artifacts.py", "n_layers"): "a checkpoint's structure, in the hint naming the training command",
    ("train/loop.py", "lora_dropout"): "a checkpoint's structure (SPACE's LoRA records no dropout)",
    ("run/summary.py", "device"): "a run's recorded meta (runs recorded before it was kept)",
    ("run/summary.py", "execution"): "a run's recorded meta (runs recorded before graphs mode existed)",
    ("tasks/sandbox_view.py", "path"): "the sandbox probe's reply (sys.path of the isolated interpreter)",
}


def _chain_names(node) -> list[str]:
    """['cfg', 'method'] for cfg.method, ['self', 'cfg'] for self.cfg."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def _configish(node) -> bool:
    import re

    names = _chain_names(node)
    return bool(names) and any(re.search(CONFIG_NAME, n) for n in (names[0], names[-1]))


def config_default_reads(root: Path = PKG) -> list[str]:
    keys = {k.rsplit(".", 1)[-1] for t in schema.all_tables() for k in t}
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            where = f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}"
            if isinstance(f, ast.Attribute) and f.attr == "get":
                key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if _configish(f.value):
                    found.append(where)
                elif len(node.args) > 1 and key in keys and (rel, key) not in NOT_CONFIG:
                    found.append(where)
            elif isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) == 3 and _configish(node.args[0]):
                found.append(where)
            elif isinstance(f, ast.Attribute) and f.attr == "select" and any(k.arg == "default" for k in node.keywords):
                found.append(where)
    return found


def test_no_module_reads_a_config_key_with_a_default_of_its_own():
    found = config_default_reads()
    assert not found, "read these keys as attributes of their settings (the YAML has every key):\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_default(tmp_path):
    """The check bites: each way of writing a default in code is found."""
    (tmp_path / "m.py").write_text(
        "def f(cfg, self, x, data):\n"
        "    a = cfg.get('top_k', 4)\n"           # 1: a config by name
        "    b = self.cfg.get('anything')\n"      # 1: even without a default
        "    c = cfg.method.get('depth')\n"       # 1: a chain from a config
        "    d = x.get('num_nodes', 15)\n"        # 2: a config key with a default, any name
        "    e = getattr(self.cfg, 'k', 3)\n"  # 3
        "    g = OmegaConf.select(x, 'a.b', default=1)\n"  # 3
        "    ok = data.get('tokens', [])\n"       # a record's key, not config: allowed
        "    ok2 = x.get('num_nodes')\n"          # no default: a dict read, allowed
    )
    found = config_default_reads(tmp_path)
    assert [w.split(":")[1] for w in found] == ["2", "3", "4", "5", "6", "7"], found


def test_no_controller_repeats_a_default_of_its_yaml():
    """A controller's constructor takes its table's keys without defaults: build_controller passes
    every key of conf/control/<name>.yaml, so a default there could only drift from the YAML."""
    import inspect

    from specbench.control import CONTROLLERS

    for name, cls in CONTROLLERS.items():
        keys = {k for k in schema.CONTROLS[name] if k != "name"}
        params = {n: p for c in cls.__mro__ if "__init__" in vars(c) for n, p in inspect.signature(c.__init__).parameters.items()}
        defaulted = sorted(k for k in keys if k in params and params[k].default is not inspect.Parameter.empty)
        assert not defaulted, f"{name}: {defaulted} have defaults in code"
        assert keys <= set(params), f"{name}: {sorted(keys - set(params))} not taken by its constructor"


def test_the_skip_search_settings_are_in_self_sds_identity_only(monkeypatch):
    """Only Self-SD's first use searches a skip set: its settings must not rename (or refuse to resume) any
    other method's run; and train.distill at its default (the loss every earlier run trained with) is no part
    of any run's identity."""
    monkeypatch.setenv("SPECBENCH_DATA_DIR", "/fixed/data")

    def name(*argv):
        return compose(engine_argv(list(argv))).run_name

    k = "train.first_use.skip_search.k=3"
    assert name("method=eesd", "control=cali_ts", k) == name("method=eesd", "control=cali_ts")
    assert name("method=self_sd", k) != name("method=self_sd")
    assert name("method=eesd", "train.distill=soft") != name("method=eesd")
