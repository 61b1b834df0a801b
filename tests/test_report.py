"""specbench.report: tables, plots, refusal to mix, repeats, Wilcoxon, experiment presets.

Most tests synthesise run dirs (summary.json / samples.jsonl / config.json as the runner writes
them); one builds two real tiny-llama runs through specbench.run.runner.run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specbench.core.errors import SpecBenchError
from specbench.report import main as report_main
from specbench.report import pool_repeats, find_runs, report
from specbench.core.stats import pooled_speedup_ci

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
ENV = {"torch": "9.9.9", "transformers": "8.8.8", "processor": "testcpu", "cpu_count": 2, "python": "3.11"}


def make_run(root: Path, *, model="tiny-llama", task="gsm8k", method="vanilla_sd", controller="fixed", seed=0,
             name=None, ar_tps=(100.0, 100.0, 100.0), m_tps=(150.0, 140.0, 160.0), ids=None, max_new_tokens=16,
             temperature=0.0, k=10, n_layers=None, gamma=None, hm=50.0, predicted=1.4, categories=None, extra=None):
    """A run dir as the runner writes it; every sample has 10 new tokens."""
    ids = ids or [f"s{i}" for i in range(len(ar_tps))]
    name = name or f"{method}-{controller}"
    d = root / model / task / name
    d.mkdir(parents=True)
    control = {"name": controller, "k_max": k}
    if controller == "fixed":
        control["k"] = k
    if gamma is not None:
        control["gamma"] = gamma
    meth = {"name": method}
    if n_layers is not None:
        meth["n_layers"] = n_layers
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": 0}
    config = {"seed": seed, "run_name": name, "model": {"name": model}, "task": {"name": task, "max_new_tokens": max_new_tokens},
              "method": meth, "control": control, "sampling": sampling, "max_new_tokens": max_new_tokens,
              "profile": {"enabled": True}, "threads": None, **(extra or {})}
    (d / "config.json").write_text(json.dumps(config))
    recs = []
    ar_wall = m_wall = 0.0
    for i, (sid, a, m) in enumerate(zip(ids, ar_tps, m_tps)):
        aw, mw = 10 / a, 10 / m
        ar_wall += aw
        m_wall += mw
        cat = categories[i] if categories else None
        recs.append({"id": sid, "index": i, "category": cat,
                     "ar": {"new_tokens": 10, "wall": aw, "tokens_per_s": a, "times": {"wall": aw}},
                     "method": {"new_tokens": 10, "wall": mw, "tokens_per_s": m, "times": {"wall": mw}},
                     "matches_ar": True, "speedup": m / a, "predicted_speedup": predicted})
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    n = len(recs)
    tok = 10 * n
    speedup = (tok / m_wall) / (tok / ar_wall)
    times = {"prefill": 0.1 * m_wall, "draft": 0.3 * m_wall, "verify": 0.5 * m_wall, "control": 0.05 * m_wall, "other": 0.05 * m_wall, "wall": m_wall}
    summary = {
        "samples": n,
        "ar": {"new_tokens": tok, "wall": ar_wall, "tokens_per_s": tok / ar_wall, "times": {"verify": ar_wall, "wall": ar_wall}},
        "method": {"new_tokens": tok, "wall": m_wall, "tokens_per_s": tok / m_wall, "times": times},
        "speedup": speedup,
        "acceptance": {"v_d": 0.5, "r_d": 0.5, "hm": hm, "tau": 2.0},
        "pos_drafted": [10, 8, 6], "pos_accepted": [8, 4, 1],
        "predicted_speedup": predicted, "eq14_speedup": 1.3,
        "meta": {"method": method, "controller": controller, "task": task, "model": model, "dtype": "float64",
                 "device": "cpu", "sampling": sampling, "max_new_tokens": max_new_tokens, "env": ENV, "lossless": True},
    }
    if categories:
        summary["per_category"] = {c: {"speedup": 1.0 + 0.1 * j} for j, c in enumerate(sorted(set(categories)))}
    (d / "summary.json").write_text(json.dumps(summary))
    return d, speedup


def test_tables_contain_the_numbers_and_repeats(tmp_path):
    root = tmp_path / "runs"
    _, s_pld = make_run(root, method="pld", ar_tps=(100, 100, 100), m_tps=(110, 120, 130), hm=12.5)
    sp = []
    for seed, m in enumerate([(150, 150, 150), (200, 200, 200), (250, 250, 250)]):
        _, s = make_run(root, seed=seed, name=f"vanilla_sd-fixed-seed{seed}", m_tps=m, hm=40.0 + 10 * seed)
        sp.append(s)
    make_run(root, task="xsum", m_tps=(300, 300, 300), hm=77.77)
    out = report([root], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    tex = (tmp_path / "rep" / "tables.tex").read_text()
    import statistics

    # repeats pooled: speedups 1.5, 2.0, 2.5 -> 2.00 ± 0.50; HM mean 50.00
    assert f"{statistics.fmean(sp):.2f}x ± {statistics.stdev(sp):.2f}" == "2.00x ± 0.50"
    row_a = next(line for line in md.splitlines() if line.startswith("| vanilla_sd+fixed |") and "50.00" in line)
    assert "2.00x ± 0.50" in row_a and "77.77" in row_a and "3.00x" in row_a  # gsm8k and xsum columns
    # every speedup cell carries its bootstrap CI over samples and how many samples it has
    lo, hi = pooled_speedup_ci([(10, 10 / 100, 10, 10 / m) for m in (110, 120, 130)])
    assert f"| pld+fixed | 12.50 | {s_pld:.2f}x [{lo:.2f}, {hi:.2f}] n=3 |" in md
    assert lo < s_pld < hi
    assert "2.00x ± 0.50 [" in row_a and "n=9" in row_a  # repeats: samples of all three runs
    assert "(f) Repeats" in md and "0,1,2" in md
    # Table 10 layout: tokens/s of the method = mean over repeats of pooled tokens/s
    assert "| 200.00 |" in md  # (150+200+250)/3
    # Table 8 layout: 30% drafting
    assert "(30%)" in md
    assert "2.00x $\\pm$ 0.50" in tex and "\\toprule" in tex
    assert len(out["groups"]) == 3  # pld, vanilla_sd x {gsm8k, xsum}... grouped per setting
    assert "testcpu" in md and "torch 9.9.9" in md


def test_pngs_written_and_nonempty(tmp_path, capsys):
    root = tmp_path / "runs"
    for k in (1, 2, 4):
        make_run(root, method="eesd", controller="fixed", k=k, name=f"fig3-k{k}", m_tps=(100 + 20 * k,) * 3)
    make_run(root, method="eesd", controller="beta_ts", name="fig3-ts", m_tps=(190,) * 3)
    for n in (1, 2, 3):
        make_run(root, method="eesd", controller="cali_ts", n_layers=n, name=f"fig4-n{n}", hm=30 + 10 * n)
    for g in (0.2, 0.6):
        make_run(root, method="self_sd", controller="threshold", gamma=g, name=f"thr{g}")
    make_run(root, task="mt_bench", categories=["writing", "math", "coding"])
    out = report([root], tmp_path / "rep")
    names = sorted(p.name for p in out["plots"])
    for stem in ("speedup_vs_k_", "hm_speedup_vs_n_", "acceptance_by_position_", "time_breakdown_",
                 "speedup_by_category_", "predicted_vs_measured", "speedup_vs_control.gamma_"):
        assert any(n.startswith(stem) for n in names), (stem, names)
    for p in out["plots"]:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plots_without_data_are_skipped(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root, method="pld")
    out = report([root], tmp_path / "rep")
    printed = capsys.readouterr().out
    assert "skipped plot speedup_vs_k" in printed and "skipped plot speedup_by_category" in printed
    assert not any("speedup_vs_k" in p.name for p in out["plots"])


def test_mixing_models_in_repeats_is_refused(tmp_path, capsys):
    root = tmp_path / "runs"
    # run dirs that declare themselves repeats (same dir, <stem>-seed<N>) but hold different models
    for seed, model in enumerate(["tiny-llama", "smollm2-135m"]):
        d, _ = make_run(tmp_path / "tmp", model=model, seed=seed, name=f"x-seed{seed}")
        (root).mkdir(exist_ok=True)
        d.rename(root / d.name)
    with pytest.raises(SpecBenchError, match="differ in model"):
        report([root], tmp_path / "rep")
    with pytest.raises(SystemExit) as e:
        report_main([str(root), "--out", str(tmp_path / "rep")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("specbench: error: ") and err.count("\n") == 1


def test_pool_repeats_refuses_other_lengths_and_sampling(tmp_path):
    make_run(tmp_path / "a", max_new_tokens=16)
    make_run(tmp_path / "b", max_new_tokens=32)
    make_run(tmp_path / "c", temperature=0.7)
    a, b, c = (find_runs([tmp_path / x])[0] for x in "abc")
    with pytest.raises(SpecBenchError, match="max_new_tokens"):
        pool_repeats([a, b])
    with pytest.raises(SpecBenchError, match="sampling"):
        pool_repeats([a, c])
    # ... but in a report they are different settings: separate tables, no error
    out = report([tmp_path], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert md.count("## (b)") == 3 and len(out["groups"]) == 3


def test_different_models_get_separate_tables(tmp_path):
    make_run(tmp_path / "runs", model="tiny-llama")
    make_run(tmp_path / "runs", model="smollm2-135m", m_tps=(300, 300, 300))
    report([tmp_path / "runs"], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert "model tiny-llama (EESD Table 1 layout)" in md and "model smollm2-135m (EESD Table 1 layout)" in md



def test_table_a_headers_name_only_what_differs(tmp_path):
    """Two sampling settings of one task: the headers say greedy / T=0.7, not the whole sampling
    dict; the length and the no-op filters (top_k=0, top_p=1.0) go in the legend or nowhere."""
    root = tmp_path / "runs"
    make_run(root, task="humaneval", method="medusa", controller="fixed", name="greedy")
    make_run(root, task="humaneval", method="medusa", controller="fixed", name="typical", temperature=0.7)
    make_run(root, task="gsm8k", method="pld")
    report([root], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Method | gsm8k HM"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells == ["Method", "gsm8k HM", "gsm8k Speedup", "humaneval (greedy) HM", "humaneval (greedy) Speedup",
                     "humaneval (T=0.7) HM", "humaneval (T=0.7) Speedup"]
    assert "Columns: gsm8k: max_new_tokens=16, greedy; humaneval (greedy): max_new_tokens=16, greedy; " \
           "humaneval (T=0.7): max_new_tokens=16, T=0.7." in md
    assert "temperature=" not in md and "T=T" not in md  # titles of (b)/(c) too
    # table (c): no column for transformers' generate where no run spent time in it
    assert "| Method | Prefill | Drafting | Verification | Sampling (control) | Other | Total |" in md
    assert "transformers generate" not in md


def test_table_c_shows_transformers_generate_where_a_run_used_it(tmp_path):
    d, _ = make_run(tmp_path / "runs", method="hf_assisted", controller="fixed")
    summary = json.loads((d / "summary.json").read_text())
    summary["method"]["times"]["hf_generate"] = summary["method"]["wall"]
    (d / "summary.json").write_text(json.dumps(summary))
    report([tmp_path / "runs"], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert "| Other | transformers generate (not broken down) | Total |" in md


def test_wilcoxon_p_equals_scipy(tmp_path):
    from scipy.stats import wilcoxon

    ids_a = [f"q{i}" for i in range(8)]
    a_tps = [100, 104, 98, 120, 111, 95, 102, 130]
    b_tps = [130, 101, 140, 150, 160, 97, 133, 180]
    make_run(tmp_path / "runs", method="vanilla_sd", ids=ids_a + ["only_a"], ar_tps=[90] * 9, m_tps=a_tps + [1])
    # b lists its samples in another order; matching must go by id
    order = [3, 1, 7, 0, 2, 6, 5, 4]
    make_run(tmp_path / "runs", method="eesd", controller="beta_ts", ids=[ids_a[i] for i in order],
             ar_tps=[90] * 8, m_tps=[b_tps[i] for i in order])
    out = report([tmp_path / "runs"], tmp_path / "rep", baseline="vanilla_sd")
    df = out["frame"]
    row = df[df["method"] == "eesd"].iloc[0]
    expected = wilcoxon(a_tps, b_tps).pvalue
    assert row["p_n"] == 8
    assert row["p"] == pytest.approx(expected, rel=1e-12)
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert f"{expected:.2g}" in md
    # default reference: each run's own AR
    out = report([tmp_path / "runs"], tmp_path / "rep2")
    row = out["frame"][out["frame"]["method"] == "eesd"].iloc[0]
    assert row["p"] == pytest.approx(wilcoxon([90] * 8, [b_tps[i] for i in order]).pvalue, rel=1e-12)


def test_unknown_baseline_is_an_error(tmp_path):
    make_run(tmp_path / "runs")
    with pytest.raises(SpecBenchError, match="matches no run"):
        report([tmp_path / "runs"], tmp_path / "rep", baseline="nope")


PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _preset_methods(name: str) -> list[str]:
    doc = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text()) or {}
    methods = []
    for d in doc.get("defaults", []):
        if isinstance(d, dict):
            for k, v in d.items():
                if k.replace("override ", "").strip() == "/method":
                    methods.append(v)
    swept = ((doc.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    if "method" in swept:
        methods += [m.strip() for m in str(swept["method"]).split(",")]
    return methods or ["vanilla_sd"]


@pytest.mark.parametrize("name", PRESETS)
def test_experiment_presets_compose(name):
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    methods = _preset_methods(name)
    present = [m for m in methods if (CONF / "method" / f"{m}.yaml").exists()]
    if not present:
        pytest.skip(f"method config(s) {methods} of preset {name} not in conf/method yet")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}"], return_hydra_config=True)
        params = cfg.hydra.sweeper.params
        assert params, f"{name} sets no hydra.sweeper.params"
        parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
        first = []
        for o in parsed:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
            assert values
            if o.key_or_group == "method":
                continue
            first.append(f"{o.key_or_group}={values[0]}")
        assert str(cfg.hydra.mode).endswith("MULTIRUN")
        for m in present:  # each existing method with the first value of every other swept key
            extra = [f"method={m}"] if len(methods) > 1 or "method" in params else []
            c = compose(config_name="config", overrides=[f"+experiment={name}", *extra, *first])
            assert c.method.name == m
            assert c.run_name and "${" not in str(c.run_name)
            assert str(c.run_dir).endswith(str(c.run_name))


def test_real_runs_through_runner(tmp_path, data_dir, monkeypatch):
    """Two tiny-llama runs built by specbench.run.runner.run, then the report on them."""
    import torch
    from hydra import compose, initialize_config_dir

    from specbench.run.runner import run

    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    torch.set_num_threads(1)
    common = ["model=tiny-llama", "max_new_tokens=12", "task.num_samples=2", "profile.ks=[1,2]", "profile.reps=1",
              "profile.context=16", "progress=false", "warmup_tokens=2"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for method, extra in (("vanilla_sd", ["method.draft.num_layers=1", "method.draft.checkpoint=null"]), ("pld", [])):
            cfg = compose(config_name="config", overrides=[*common, f"method={method}", *extra,
                                                            f"run_dir={tmp_path}/runs/tiny-llama/gsm8k/{method}"])
            run(cfg)
    out = report([tmp_path / "runs"])
    assert out["out"] == tmp_path / "runs" / "report"
    md = (out["out"] / "tables.md").read_text()
    assert "vanilla_sd+fixed" in md and "pld" in md and "Auto-regressive" in md
    s = json.loads((tmp_path / "runs/tiny-llama/gsm8k/vanilla_sd/summary.json").read_text())
    assert f"{s['speedup']:.2f}x" in md
    assert all(p.stat().st_size > 0 for p in out["plots"]) and out["plots"]


def test_the_train_group_does_not_split_runs_of_a_method_that_trains_nothing(tmp_path):
    """Runs of PLD recorded under two first-use budgets (the `train` group) are one system, as
    their run dirs are one identity (specbench.config.identity.trains_on_first_use); the eleventh and
    twelfth sessions' report labelled Token Recycling's rows by the budget."""
    root = tmp_path / "runs"
    for seed, n in enumerate((48, 32)):
        make_run(root, method="pld", seed=seed, name=f"pld-fixed-seed{seed}", extra={"train": {"max_sequences": n}})
    report([root], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert "n=6" in md and "max_sequences" not in md


def _set_env(run_dir: Path, **env) -> None:
    s = json.loads((run_dir / "summary.json").read_text())
    s["meta"]["env"] = {**s["meta"]["env"], **env}
    (run_dir / "summary.json").write_text(json.dumps(s))


def test_runs_on_two_cpu_models_are_two_systems(tmp_path):
    """SuffixDecoding measured 1.10x on an AVX2 EPYC and 1.62x on an AMX Xeon, hosts whose recorded
    machine, processor, core count and hostname were the same: the session-14 report pooled the two
    as repeats of one system (1.36x +- 0.36). The CPU model (runner.cpu_model) now tells them apart;
    runs that predate it are 'unrecorded'."""
    root = tmp_path / "runs"
    a, _ = make_run(root, method="pld", seed=0, name="pld-fixed-seed0", m_tps=(110.0, 110.0, 110.0))
    b, _ = make_run(root, method="pld", seed=1, name="pld-fixed-seed1", m_tps=(160.0, 160.0, 160.0))
    c, _ = make_run(root, method="pld", seed=2, name="pld-fixed-other", m_tps=(120.0, 120.0, 120.0))
    _set_env(a, cpu_model="AMD EPYC 7B13")
    _set_env(b, cpu_model="Intel(R) Xeon(R) Processor")
    with pytest.raises(SpecBenchError, match="differ in hardware"):  # declared repeats (-seed<N>) on two hosts
        report([root], tmp_path / "rep")
    b.rename(root / "tiny-llama" / "gsm8k" / "pld-fixed-xeon")
    report([root], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert "hardware=AMD EPYC 7B13" in md and "hardware=Intel(R) Xeon(R) Processor" in md
    assert "hardware=unrecorded" in md  # c: an older run, no cpu_model
    assert "x ± " not in md  # nothing pooled across hosts (a pooled cell reads "1.36x ± 0.36")
    assert "1.10x" in md and "1.60x" in md and "1.20x" in md


def test_environment_records_the_cpu_model():
    from specbench.run.runner import cpu_model, environment

    assert environment()["cpu_model"] == cpu_model() and cpu_model()
    if Path("/proc/cpuinfo").is_file() and "model name" in Path("/proc/cpuinfo").read_text():
        assert cpu_model() not in ("x86_64", "aarch64")


def test_the_cpu_model_tells_apart_two_machines_behind_one_name(monkeypatch):
    from specbench.run import runner

    def cpuinfo(family, model):
        fields = {"model name": "AMD EPYC", "cpu family": family, "model": model}
        return lambda name: fields.get(name)

    monkeypatch.setattr(runner, "cpuinfo_field", cpuinfo("23", "49"))
    zen2 = runner.cpu_model()
    monkeypatch.setattr(runner, "cpuinfo_field", cpuinfo("25", "17"))
    assert zen2 == "AMD EPYC (family 23, model 49)" and runner.cpu_model() == "AMD EPYC (family 25, model 17)"
    monkeypatch.setattr(runner, "cpuinfo_field", cpuinfo(None, None))  # no x86 numbers (Arm): the name alone
    assert runner.cpu_model() == "AMD EPYC"


def test_many_category_systems_are_a_grid_and_labels_skip_what_the_method_never_reads(tmp_path, monkeypatch):
    """Session 58: the leaderboard's MT-Bench category plot had 31 bar series and a legend wider than the
    plot, whose EAGLE labels carried Self-SD's skip-search settings (runs stored before those left
    EAGLE's identity). Past plots.MAX_BARS systems the plot is a grid (acceptance by position past
    plots.MAX_LINES); a method without a skip set is not
    told apart by the skip search's settings, Self-SD is."""
    from specbench.report import plots

    root = tmp_path / "runs"
    cats = ["writing", "math", "coding"]
    search = {"train": {"first_use": {"skip_search": {"k": 4}}}}
    for depth in range(plots.MAX_BARS + 1):
        make_run(root, task="mt_bench", method="eagle", name=f"eagle-d{depth}", categories=cats,
                 extra={"method": {"name": "eagle", "depth": depth, "train_if_missing": True},
                        **(search if depth % 2 else {})})
    make_run(root, task="mt_bench", method="self_sd", name="sd-a", categories=cats,
             extra={"method": {"name": "self_sd", "skip": {"source": "search"}, "train_if_missing": True}, **search})
    make_run(root, task="mt_bench", method="self_sd", name="sd-b", categories=cats,
             extra={"method": {"name": "self_sd", "skip": {"source": "search"}, "train_if_missing": True}})
    grids, position_grids = [], []
    monkeypatch.setattr(plots, "_category_grid", lambda dm, *a: grids.append(list(dm["label"])))
    monkeypatch.setattr(plots, "_position_grid", lambda dm, *a: position_grids.append(len(dm)))
    out = report([root], tmp_path / "rep")
    assert len(grids) == 1 and len(grids[0]) == plots.MAX_BARS + 3
    assert position_grids == [plots.MAX_BARS + 3]  # past MAX_LINES systems: no curves
    assert any(p.name.startswith("time_breakdown_") for p in out["plots"])
    eagle = [n for n in grids[0] if n.startswith("eagle")]
    assert eagle and not any("skip_search" in n for n in eagle), eagle
    assert sum("skip_search" in n for n in grids[0] if n.startswith("self_sd")) == 1
    monkeypatch.undo()  # and drawn for real
    names = {p.name.split("_smollm")[0].split("_tiny")[0] for p in report([root], tmp_path / "rep2")["plots"]}
    assert {"speedup_by_category", "acceptance_by_position", "time_breakdown"} <= names, names
