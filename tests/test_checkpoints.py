"""Hostile checkpoints and cached kernels: every loader is strict (keys, shapes, dtypes, finite
values), checks sizes before it allocates, never runs a pickle, and says what is wrong in one
line naming the file; a cached kernel library is verified before it is loaded."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbench.models.artifacts import PUBLISHED, file_sha256, save_checkpoint
from specbench.control.cali_ts import CaliPredictor, CaliTS
from specbench.control.base import DraftRef
from specbench.core.errors import SpecBenchError
from specbench.methods.eagle_head import EagleHead
from specbench.methods.eesd import EarlyExit
from specbench.kernels import ggml
from specbench.models import truncated_copy
from tests.helpers import build, controller, method_cfg, tiny_model

SETTINGS = {"steps": 1, "train_sequences": 1}


def nan_first(state):
    k = next(k for k, v in state.items() if v.is_floating_point())
    state[k] = torch.full_like(state[k], float("nan"))


def drop_first(state):
    state.pop(next(iter(state)))


def widen_first(state):
    k = next(k for k, v in state.items() if v.dim() == 2)
    state[k] = torch.zeros(state[k].shape[0], state[k].shape[1] + 1)


def int_first(state):
    k = next(iter(state))
    state[k] = state[k].to(torch.int32)


BREAKS = [
    pytest.param(drop_first, r"missing key", id="missing_key"),  # strict=False half-loaded it, reported trained
    pytest.param(lambda s: s.update({"extra.weight": torch.zeros(2)}), r"unexpected key 'extra\.weight'", id="extra_key"),
    pytest.param(widen_first, r"has shape \[\d+, \d+\], the model needs", id="wrong_shape"),
    pytest.param(nan_first, r"holds NaN or infinite values", id="nan"),
    pytest.param(int_first, r"is torch\.int32, the model needs", id="int_dtype"),
]


def save_as_is(kind: str, key: str, structure: dict, state: dict):
    """A checkpoint file holding `state` as given, NaN included (save_checkpoint refuses to cache a
    non-finite one: this is a file damaged or crafted after it was written)."""
    finite = {k: torch.nan_to_num(v) if v.is_floating_point() else v for k, v in state.items()}
    path = save_checkpoint(kind, key, structure, finite, SETTINGS)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=meta)
    return path


def one_line(e, path_part: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and path_part in msg, msg
    return msg


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("break_it, match", BREAKS)
def test_eesd_exit(cache, break_it, match):
    target = tiny_model()
    exit_ = EarlyExit(target, 1)
    state = {k: v.clone() for k, v in exit_.state_dict().items()}
    break_it(state)
    path = save_as_is("eesd", target.key, exit_.structure(), state)
    with pytest.raises(SpecBenchError, match=match) as e:
        build("eesd", target, method_cfg("eesd", n_layers=1))
    assert "python -m specbench.train method=eesd" in one_line(e, str(path))


@pytest.mark.parametrize("break_it, match", BREAKS)
def test_vanilla_draft(cache, break_it, match):
    target = tiny_model()
    draft = truncated_copy(target, 1)
    state = {k: v.clone() for k, v in draft.model.state_dict().items() if ".layers." in k or k.endswith("norm.weight")}
    break_it(state)
    path = save_as_is("vanilla_draft", target.key, {"n_layers": 1}, state)
    with pytest.raises(SpecBenchError, match=match) as e:
        build("vanilla_sd", target, method_cfg("vanilla_sd", draft={"checkpoint": "auto"}))
    one_line(e, str(path))


@pytest.mark.parametrize("break_it, match", BREAKS)
def test_eagle_released_directory(tmp_path, break_it, match):
    target = tiny_model()
    state = {k: v.clone() for k, v in EagleHead(target).state_dict().items()}
    break_it(state)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": target.hidden_size, "num_hidden_layers": 1}))
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecBenchError, match=match) as e:
        build("eagle", target, method_cfg("eagle", checkpoint=str(tmp_path)))
    one_line(e, str(tmp_path))


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/specbench-pwned",))


@pytest.mark.parametrize("case, match", [
    ("config_not_json", r"config.json: cannot read \(JSONDecodeError\)"),
    ("config_a_list", r"config.json: a JSON list, not an object"),
    ("pickle_refused", r"pytorch_model.bin: cannot read \(UnpicklingError"),
    ("truncated", r"model.safetensors: cannot read"),
    ("not_tensors", r"pytorch_model.bin: not a flat state dict of tensors"),
])
def test_eagle_bad_directories(tmp_path, case, match):
    target = tiny_model()
    conf = {"hidden_size": target.hidden_size, "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    state = EagleHead(target).state_dict()
    if case == "config_not_json":
        (tmp_path / "config.json").write_text("{oops")
    elif case == "config_a_list":
        (tmp_path / "config.json").write_text("[1]")
    elif case == "pickle_refused":
        torch.save({"fc.weight": Evil()}, tmp_path / "pytorch_model.bin")
    elif case == "truncated":
        save_file(dict(state), str(tmp_path / "model.safetensors"))
        data = (tmp_path / "model.safetensors").read_bytes()
        (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "not_tensors":
        torch.save([1, 2, 3], tmp_path / "pytorch_model.bin")
    with pytest.raises(SpecBenchError, match=match) as e:
        build("eagle", target, method_cfg("eagle", checkpoint=str(tmp_path)))
    one_line(e, str(tmp_path))
    assert not Path("/tmp/specbench-pwned").exists()


def write_medusa(d: Path, state: dict, heads: int, layers: int = 1):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    save_file(state, str(d / "medusa_lm_head.safetensors"))
    return d


def medusa_state(target, heads=2):
    D, V = target.hidden_size, target.vocab_size
    state = {}
    for i in range(heads):
        state |= {f"{i}.0.linear.weight": torch.zeros(D, D), f"{i}.0.linear.bias": torch.zeros(D),
                  f"{i}.1.weight": torch.zeros(V, D)}
    return state


@pytest.mark.parametrize("case, match", [
    ("nan", r"'0\.1\.weight' holds NaN"),
    ("absurd_heads", r"missing key '2\.0\.linear\.weight' \(config.json says 1000000000 heads"),  # sized nothing
    ("absurd_layers", r"missing key '0\.1\.linear\.weight' \(config.json says 2 heads x 1000000000 blocks"),
    ("bool_heads", r"no positive integer 'medusa_num_heads'"),
])
def test_medusa_published_directory(tmp_path, case, match):
    from specbench.models.published import load_medusa_heads

    target = tiny_model()
    state = medusa_state(target)
    heads, layers = 2, 1
    if case == "nan":
        state["0.1.weight"][3, 4] = float("nan")
    elif case == "absurd_heads":
        heads = 10**9
    elif case == "absurd_layers":
        layers = 10**9
    elif case == "bool_heads":
        heads = True
    d = write_medusa(tmp_path / "heads", state, heads, layers)
    with pytest.raises(SpecBenchError, match=match) as e:
        load_medusa_heads(str(d), target.hidden_size, target.vocab_size)
    one_line(e, str(d))


# -- Cali-TS predictor ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, match", [
    ("huge_d", r"says d=400000, max_i=10, its weights are for d=4, max_i=10"),  # was a 3.1 GB allocation
    ("nan", r"'proj\.weight' holds NaN"),
    ("no_bias", r"missing key 'proj\.bias'"),
    ("flat_W", r"'W' must be a \[max_i, d, d\] tensor"),
    ("pickle_refused", r"is damaged or not a CaliPredictor.save file"),
    ("not_a_dict", r"not a CaliPredictor.save file \(no state_dict\)"),
])
def test_cali_predictor_file(tmp_path, case, match):
    path = tmp_path / "pred.pt"
    pred = CaliPredictor(4, 10)
    state = {k: v.clone() for k, v in pred.state_dict().items()}
    blob = {"state_dict": state, "d": 4, "max_i": 10}
    if case == "huge_d":
        blob["d"] = 400_000
    elif case == "nan":
        state["proj.weight"][0, 1] = float("nan")
    elif case == "no_bias":
        state.pop("proj.bias")
    elif case == "flat_W":
        state["W"] = torch.zeros(10, 16)
    elif case == "pickle_refused":
        blob = {"state_dict": Evil()}
    elif case == "not_a_dict":
        blob = [1, 2]
    torch.save(blob, path)
    assert path.stat().st_size < 4096
    with pytest.raises(SpecBenchError, match=match) as e:
        controller("cali_ts", predictor=str(path))
    one_line(e, str(path))
    assert not Path("/tmp/specbench-pwned").exists()


def test_cali_predictor_checkpoint_for_another_width(cache):
    target = tiny_model()
    structure = {"n_layers": 1, "head": "shared"}
    state = CaliPredictor(target.hidden_size + 2, 3).state_dict()
    path = save_checkpoint("cali", target.key, structure, state, SETTINGS | {"max_i": 10**6})  # max_i from W
    with pytest.raises(SpecBenchError, match=rf"for hidden size {target.hidden_size + 2}, the draft's is") as e:
        CaliTS.attach({"predictor": "auto"}, DraftRef(target.key, structure, "cpu", target.hidden_size))
    one_line(e, str(path))


# -- compiled kernels ----------------------------------------------------------------------------
FAKE_CC = """#!{python}
import sys
args = sys.argv[1:]
if "--version" in args:
    print("fakecc 1.0")
    sys.exit(0)
with open({log!r}, "a") as f:
    f.write("built\\n")
open(args[args.index("-o") + 1], "wb").write(b"\\x7fELF" + b"x" * 4096)
"""


@pytest.fixture
def fake_cc(tmp_path, monkeypatch):
    """A 'compiler' that writes a fixed file and counts its builds (no real compile in a unit test)."""
    log = tmp_path / "builds.log"
    cc = tmp_path / "fakecc"
    cc.write_text(FAKE_CC.format(python=sys.executable, log=str(log)))
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def test_a_damaged_cached_kernel_is_rebuilt_not_loaded(fake_cc):
    so = ggml.build()
    assert fake_cc() == 1 and ggml.verified(so)
    assert ggml.build() == so and fake_cc() == 1  # cached and verified: no rebuild
    so.write_bytes(so.read_bytes()[:100])  # truncated (loading it killed the run with SIGBUS)
    assert not ggml.verified(so)
    assert ggml.build() == so and fake_cc() == 2 and ggml.verified(so)
    ggml._digest_path(so).unlink()  # built before digests existed, or the digest lost: rebuilt too
    assert ggml.build() == so and fake_cc() == 3 and ggml.verified(so)


def test_the_kernel_cache_key_has_the_cpu_flags(fake_cc, monkeypatch):
    monkeypatch.setattr(ggml, "cpu_flags", lambda: "avx avx2 avx512f fma sse2")
    new = ggml.build()
    monkeypatch.setattr(ggml, "cpu_flags", lambda: "avx sse2")  # an older node sharing the cache
    old = ggml.build()
    assert new != old and fake_cc() == 2


def test_cpu_flags_are_read_here():
    flags = ggml.cpu_flags()
    if Path("/proc/cpuinfo").exists() and os.uname().machine in ("x86_64", "aarch64"):
        assert flags and flags.split() == sorted(flags.split())


def test_cali_predictor_of_another_exit_layer_is_refused(cache):
    """EESD's exit layer retrained with train.cali=false left the old predictor beside it, same name,
    and a cali_ts run paired them without a word. The predictor records its exit layer's hash; one
    from before the key is paired by where both lie (published with published)."""
    target = tiny_model()
    structure = {"n_layers": 1, "head": "shared"}
    exit_path = save_checkpoint("eesd", target.key, structure, EarlyExit(target, 1).trainable_state(), SETTINGS)
    state = CaliPredictor(target.hidden_size, 3).state_dict()
    ref = DraftRef(target.key, structure, "cpu", target.hidden_size, str(exit_path))
    save_checkpoint("cali", target.key, structure, state, SETTINGS | {"max_i": 3, "exit_layer_sha256": file_sha256(exit_path)})
    assert CaliTS.attach({"predictor": None}, ref)["predictor"] is not None  # its own exit layer
    retrained = EarlyExit(target, 1)
    torch.nn.init.normal_(retrained.layer.self_attn.q_proj.weight)
    save_checkpoint("eesd", target.key, structure, retrained.trainable_state(), SETTINGS)
    with pytest.raises(SpecBenchError, match="was trained with another EESD exit layer than") as e:
        CaliTS.attach({"predictor": None}, ref)
    one_line(e, str(exit_path))
    assert CaliTS.attach({"predictor": "none"}, ref)["predictor"] is None  # the ablation, asked for
    # a predictor from before the key: a cached one beside a published exit layer is another layer's
    save_checkpoint("cali", target.key, structure, state, SETTINGS | {"max_i": 3})
    published = DraftRef(target.key, structure, "cpu", target.hidden_size, str(PUBLISHED / "x" / "eesd" / "e.safetensors"))
    with pytest.raises(SpecBenchError, match="was trained with another EESD exit layer"):
        CaliTS.attach({"predictor": None}, published)
