"""EESD: greedy equality with AR for every controller, exact reuse of the first-N layers'
states, distribution preservation under sampling, training and checkpoints, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency

from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError

from helpers import CONF, GREEDY, build, control_settings, method_cfg, tiny_model

from specbench.config.settings import of

CONTROLS = [
    {"name": "fixed", "k": 3, "k_max": 3},
    {"name": "beta_ts", "k_max": 5},
    {"name": "cali_ts", "k_max": 5},
    {"name": "threshold", "gamma": 0.3, "k_max": 4},
    {"name": "adaptive_threshold", "k_max": 4},
]


def eesd(target, n_layers, control, sampling=GREEDY, **cfg):
    mcfg = method_cfg("eesd", **{"n_layers": n_layers, "head": "shared", "allow_untrained": True, "checkpoint": None} | cfg)
    over = {k: v for k, v in control.items() if k != "name"}
    return build("eesd", target, mcfg, sampling, control_settings(control["name"], **over))


def ar(target, sampling=GREEDY):
    return build("ar", target, method_cfg("ar"), sampling)


@settings(max_examples=25, deadline=None)
@given(
    n_layers=st.integers(1, 3),
    ctrl=st.sampled_from(CONTROLS),
    prompt=st.lists(st.integers(3, 258), min_size=1, max_size=12),
    max_new=st.integers(1, 30),
    seed=st.integers(0, 1000),
)
def test_eesd_greedy_equals_ar(n_layers, ctrl, prompt, max_new, seed):
    target = tiny_model()
    eos = target.tokenizer.eos_ids
    want = ar(target).generate(prompt, max_new, eos, seed).tokens
    m = eesd(target, n_layers, ctrl)
    got = m.generate(prompt, max_new, eos, seed)
    assert got.tokens == want
    # every cache is back at the committed length (the last token stays pending); a step that
    # ran into EOS committed its tokens past it, which generate() then cut from the output
    committed = len(m.tokens) - 1
    assert all(n <= committed for n in m.cache.lengths)


def test_exit_at_last_layer_is_the_target_so_everything_is_accepted():
    """N = L-1 with the exit layer initialised from the last layer is exactly the target: every
    draft must be accepted. This checks that verification's reuse of the layer-N states and KV
    entries computed while drafting is exact."""
    target = tiny_model()
    m = eesd(target, target.num_layers - 1, {"name": "fixed", "k": 4, "k_max": 4})
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "speculate"}])
    g = m.generate(prompt, 40, frozenset(), 0)
    assert g.tokens == ar(target).generate(prompt, 40, frozenset(), 0).tokens
    drafted = sum(s.drafted for s in g.steps)
    assert drafted > 20 and sum(s.accepted for s in g.steps) == drafted


def test_the_vocabulary_head_sees_only_the_rows_that_are_read():
    """On the embedded model the 49k-row head costs a fifth of a target forward per row: the exit
    layer's prefill over the prompt and its catch-up rows fill its cache and need no logits. At most
    one row per draft token, one per verified row and the prefill's last go through a head."""
    target = tiny_model()
    rows = []
    hook = target.lm_head.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[:-1].numel()))
    try:
        g = eesd(target, 2, {"name": "fixed", "k": 3, "k_max": 3}).generate(list(range(3, 43)), 24, frozenset(), 0)
    finally:
        hook.remove()
    drafted = sum(s.drafted for s in g.steps)
    assert drafted > 0 and sum(rows) <= 1 + drafted + sum(s.drafted + 1 for s in g.steps)


@pytest.mark.parametrize("n_layers", [1, 3])
def test_eesd_sampling_preserves_distribution(n_layers):
    """Tokens 1 and 2 of the output (made by speculative steps) follow AR's distribution."""
    target = tiny_model()
    sampling = SamplingConfig(temperature=1.0, top_k=5)
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "dist"}])
    m, a = eesd(target, n_layers, {"name": "fixed", "k": 2, "k_max": 2}, sampling), ar(target, sampling)
    seeds = range(300)
    for pos in (1, 2):
        ours = [m.generate(prompt, 3, frozenset(), s).tokens[pos] for s in seeds]
        ref = [a.generate(prompt, 3, frozenset(), 10_000 + s).tokens[pos] for s in seeds]
        vocab = sorted(set(ours) | set(ref))
        table = np.array([[ours.count(v) for v in vocab], [ref.count(v) for v in vocab]])
        assert chi2_contingency(table)[1] > 1e-3


def test_bad_n_layers():
    target = tiny_model()
    with pytest.raises(SpecBenchError, match=r"n_layers=4 must be in \[1, 3\]"):
        eesd(target, 4, CONTROLS[0])


def test_missing_checkpoint_says_how_to_train(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=eesd"):
        eesd(tiny_model(), 2, CONTROLS[0], allow_untrained=False, checkpoint="auto")


def _cfg(method: str, overrides: list[str]):
    base = ["model=tiny-llama", f"method={method}", "train.data.num_prompts=3", "train.data.num_original=6",
            "train.data.max_new_tokens=12", "train.data.batch_size=3", "train.epochs=3", "train.batch_size=3",
            "train.max_len=1024", "train.eval_fraction=0.3", "train.cali_predictor.pairs_per_sequence=6",
            "train.cali_predictor.epochs=2"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=base + overrides)


def test_training_lowers_loss_and_checkpoint_reloads_identically(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    from specbench.train.__main__ import train

    cfg = _cfg("eesd", ["method.n_layers=2", "train.lr=3e-3"])
    out = train(cfg)
    assert out["held_out_loss"][1] < out["held_out_loss"][0]
    assert (tmp_path / "eesd").is_dir() and (tmp_path / "cali").is_dir()

    target = tiny_model()
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "reload"}])
    trained = build("eesd", target, of(cfg).method, GREEDY, control_settings("cali_ts", k_max=4))
    assert trained.describe()["exit_trained"] and trained.controller.needs_hidden
    again = build("eesd", target, of(cfg).method, GREEDY, control_settings("cali_ts", k_max=4))
    g1, g2 = trained.generate(prompt, 20, frozenset(), 3), again.generate(prompt, 20, frozenset(), 3)
    assert g1.tokens == g2.tokens == ar(target).generate(prompt, 20, frozenset(), 3).tokens
    assert g1.steps == g2.steps
    for a, b in zip(trained.exit.state_dict().values(), again.exit.state_dict().values()):
        assert torch.equal(a, b)

    # a checkpoint trained for another structure is refused, not loaded
    from specbench.models.artifacts import load_checkpoint

    path = next((tmp_path / "eesd").glob("*.safetensors"))
    with pytest.raises(SpecBenchError, match="was trained for"):
        load_checkpoint("eesd", target.key, {"n_layers": 3, "head": "shared"}, path)


def test_vanilla_draft_distillation_is_picked_up(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    from specbench.train.__main__ import train

    cfg = _cfg("vanilla_sd", ["method.draft.num_layers=1", "train.lr=3e-3"])
    out = train(cfg)
    assert out["held_out_loss"][1] < out["held_out_loss"][0]
    target = tiny_model()
    m = build("vanilla_sd", target, of(cfg).method, GREEDY, control_settings("fixed", k=3))
    assert m.describe()["draft_trained"] is True
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "draft"}])
    assert m.generate(prompt, 20, frozenset(), 0).tokens == ar(target).generate(prompt, 20, frozenset(), 0).tokens


class _Recorder:
    """Stands in for a controller (never registered): drafts k_max tokens a round and records
    what a controller is handed, with the pending token's position at the round's start."""

    name, needs_hidden = "recorder", True

    def __init__(self, method, k_max):
        self.method, self.k_max, self.rounds = method, k_max, []

    def reset(self, seed=None):
        pass

    def begin_round(self):
        self.rounds.append({"pending": len(self.method.tokens) - 1, "infos": [], "accepted": None})

    def keep_drafting(self, info):
        self.rounds[-1]["infos"].append(info)
        return True

    def on_device(self, i, draft_hidden, target_hidden):
        return None  # nothing to read with the draft token

    def update(self, n_drafted, n_accepted):
        self.rounds[-1]["accepted"] = n_accepted


def test_cali_training_pairs_are_what_the_controller_sees_when_decoding():
    """The predictor must be trained on the inputs it gets at decode time: for every draft token
    whose context is on the committed sequence (i <= accepted + 1), the training-data builder,
    given that sequence, position t = pending - 1 (the last verified token) and i, returns the
    controller's (target hidden, draft hidden, i, accepted?) exactly."""
    from specbench.train.trainers import cali_features, cali_pair

    target = tiny_model()
    m = eesd(target, 3, {"name": "fixed", "k": 4, "k_max": 4})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the exit layer starts as the target's last layer: perturb it so some drafts fail
        for p in m.exit.layer.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    m.controller = _Recorder(m, 4)
    prompt = [5, 17, 99, 3, 42, 8]
    out = m.generate(prompt, 40, frozenset(), 0).tokens
    feats = cali_features(target, m.exit, prompt + out)
    seen = labels = 0
    for r in m.controller.rounds:
        a = r["accepted"]
        for info in r["infos"][: a + 1]:
            th, dh, i, label = cali_pair(feats, r["pending"] - 1, info.i)
            torch.testing.assert_close(th, info.target_hidden, rtol=0, atol=1e-9)
            torch.testing.assert_close(dh, info.draft_hidden, rtol=0, atol=1e-9,
                                       msg=lambda s, i=info.i: f"draft hidden of draft token {i}: {s}")
            assert (i, label) == (info.i, float(info.i <= a))
            seen, labels = seen + 1, labels + label
    assert seen > 10 and 0 < labels < seen and max(len(r["infos"]) for r in m.controller.rounds) == 4
