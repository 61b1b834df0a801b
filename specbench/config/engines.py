"""What the shared modules (cli, config, rundir) need to know of engine=vllm, kept here so they carry no
vLLM branches of their own.

With `engine=vllm` on the command line, `method=<name>` names one of vLLM's methods, whose configs are
conf/method/vllm/<name>.yaml (their names overlap the native ones: `suffix`, `eagle` are vLLM's own
implementations there); `engine_argv` rewrites the override to `method=vllm/<name>` before Hydra sees it.
A leaf module (errors and schema only): config.compose and config.identity import it.
"""

from __future__ import annotations

from pathlib import Path

from specbench.config import schema
from specbench.core.errors import SpecBenchError

VLLM_METHOD_DIR = "vllm"
HEAD_METHODS = ("eagle", "eagle3", "medusa", "draft_model")  # vLLM loads a drafter: method.model


# files a vLLM run dir holds beside the native engine's (identity.RUN_FILES)
RUN_FILES = {"worker.log"}  # the worker's output (vLLM's log)


def method_configs(conf_dir: Path) -> list[str]:
    """vLLM's methods as config names (`vllm/<name>`), for the paper-control fallbacks of config/compose.py."""
    return [f"{VLLM_METHOD_DIR}/{p.stem}" for p in (conf_dir / "method" / VLLM_METHOD_DIR).glob("*.yaml")]


def fingerprint_engine(c: dict) -> None:
    """The engine group's part of a run's fingerprint (identity.fingerprint), in place: none for the native
    engine (as runs recorded before engines existed), and engine=vllm without its batch sizes (one record
    per batch size, so more sizes extend a run, like task.num_samples for the native engine)."""
    if c.get("engine") == {"name": "native"}:
        c.pop("engine")
    if isinstance(c.get("engine"), dict):
        c["engine"].pop("batch_sizes", None)


def _control_changed(get) -> bool:
    """Whether the control group differs from the shipped default (conf/control/fixed.yaml)."""
    import yaml

    k = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "control" / "fixed.yaml").read_text())["k"]
    name = get("control.name")
    return name not in (None, "fixed") or get("control.k") not in (None, k) or get("control.k_max") not in (None, get("control.k"), k)


def _engine_values(argv: list[str]) -> list[str]:
    return [a.partition("=")[2] for a in argv if a.partition("=")[0].lstrip("+") == "engine"]


def engine_argv(argv: list[str]) -> list[str]:
    """argv with `method=<name>` read as vLLM's method when engine=vllm is given."""
    engines = _engine_values(argv)
    if any("," in e for e in engines):
        raise SpecBenchError(f"engine={engines[0]!r} is not allowed; run each engine in its own command (their methods differ)")
    if "vllm" not in engines:
        return argv
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key == "method" and not value.startswith(VLLM_METHOD_DIR + "/"):
            arg = "method=" + ",".join(f"{VLLM_METHOD_DIR}/{v}" for v in value.split(","))
        out.append(arg)
    return out


def method_options(conf_dir: Path, value: str, argv: list[str]) -> tuple[str, list[str], str]:
    """(the method's name, the names allowed, ' for engine=vllm' or '') for a `method=` value."""
    if not value.startswith(VLLM_METHOD_DIR + "/"):
        return value, sorted(p.stem for p in (conf_dir / "method").glob("*.yaml")), ""
    name = value.split("/", 1)[1]
    if "vllm" not in _engine_values(argv):
        raise SpecBenchError(f"method={value!r}: vLLM's methods run with engine=vllm (then method={name})")
    return name, sorted(p.stem for p in (conf_dir / "method" / VLLM_METHOD_DIR).glob("*.yaml")), " for engine=vllm"


def _bad(key: str, value, allowed: str) -> SpecBenchError:
    shown = "null" if value is None else repr(value)
    return SpecBenchError(f"{key}={shown} is not allowed; expected {allowed}")


def engine_rules(get) -> None:
    """The rules between keys that the engine sets; `get(key)`: the value, None when absent or null.
    engine=vllm: a model vLLM can load, a drafter where the method needs one, n-gram bounds in order;
    native: none of vLLM's own methods."""
    name = get("method.name")
    if get("engine.name") in (None, "native"):
        if name in schema.VLLM_METHODS and name not in schema.METHODS:
            raise SpecBenchError(f"method {name!r} is one of vLLM's: run it with engine=vllm")
        return
    if _control_changed(get):
        raise SpecBenchError("control.* is not read with engine=vllm (vLLM drafts method.num_speculative_tokens tokens a "
                             "step); drop the control settings (they changed the run's name and identity, not the run)")
    if get("model.loader") == "tiny":
        raise _bad("model.loader", "tiny", "gguf or hf with engine=vllm (a tiny random Llama has no tokenizer vLLM can load)")
    sizes = get("engine.batch_sizes")
    if isinstance(sizes, list) and len(set(sizes)) < len(sizes):  # one record a batch size: a second is refused after the run
        raise _bad("engine.batch_sizes", sizes, "distinct batch sizes")
    if get("model.draft_quant") not in (None, "none"):  # our trained parts' rounding; vLLM loads its drafter itself
        raise _bad("model.draft_quant", get("model.draft_quant"), "none with engine=vllm")
    if name in HEAD_METHODS and not get("method.model"):
        raise _bad("method.model", get("method.model"), f"the {name} drafter vLLM loads (a Hugging Face directory or hub id)")
    lo, hi = get("method.prompt_lookup_min"), get("method.prompt_lookup_max")
    if name == "ngram" and lo is not None and hi is not None and hi < lo:
        raise _bad("method.prompt_lookup_max", hi, f"an integer >= method.prompt_lookup_min ({lo})")
