"""Draft-length controllers: hand-computed updates from the papers, and behaviour in the draft loop."""

import math

import pytest
import torch
from helpers import control_settings, controller, controller_args
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.control import CONTROLLERS, DraftInfo, build_controller
from specbench.control.cali_ts import CaliPredictor, CaliTS
from specbench.core.errors import SpecBenchError
from specbench.config.settings import group as settings_of

ADAPTIVE = ["beta_ts", "cali_ts", "adaptive_threshold"]


def simulate_round(ctrl, confidences, budget=10**9):
    """The draft loop of specbench/control/base.py; confidences[j] is the (j+1)-th draft's. Returns drafts made."""
    ctrl.begin_round()
    n = 0
    while n < min(ctrl.k_max, budget):
        n += 1
        if not ctrl.keep_drafting(DraftInfo(i=n, confidence=confidences[(n - 1) % len(confidences)])):
            break
    return n


def mean_draft_length(ctrl, accept_all, rounds=400):
    ctrl.reset()
    lengths = []
    for _ in range(rounds):
        n = simulate_round(ctrl, [0.99])
        lengths.append(n)
        ctrl.update(n, n if accept_all else 0)
    return sum(lengths[rounds // 2:]) / (rounds - rounds // 2)  # after the controller has adapted


# --- hand-computed updates -------------------------------------------------------------------


def test_beta_ts_posterior_updates():
    c = controller("beta_ts", alpha0=1, beta0=1)
    c.update(5, 2)  # 2 successes, then the 3rd draft rejected: one failure
    assert (c.alpha, c.beta) == (3, 2)
    c.update(5, 5)  # all accepted: no failure
    assert (c.alpha, c.beta) == (8, 2)
    c.update(5, 4)  # only the last draft rejected: one failure
    assert (c.alpha, c.beta) == (12, 3)
    c.update(1, 0)
    assert (c.alpha, c.beta) == (12, 4)


@pytest.mark.parametrize("counts, want", [
    ("paper_output", [(3, 3), (8, 3), (12, 4), (12, 5)]),  # |Q_v| = a + 1: r = a, n = min(a + 2, k)
    ("paper_subset", [(2, 3), (6, 4), (9, 6), (8, 8)]),  # |Q_v| = a: r = a - 1, n = min(a + 1, k)
])
def test_beta_ts_literal_counts_selectable(counts, want):
    c = controller("beta_ts", counts=counts)
    got = []
    for k, a in [(5, 2), (5, 5), (5, 4), (1, 0)]:
        c.update(k, a)
        got.append((c.alpha, c.beta))
    assert got == want
    with pytest.raises(SpecBenchError, match="control.counts 'x'; allowed: consistent, paper_output, paper_subset"):
        controller("beta_ts", counts="x")


def simulated_posterior_mean(theta, counts=None, rounds=4000, seed=0):
    """Beta-TS drafting against a stream whose draft tokens are each accepted with probability
    theta (given the ones before were): the posterior mean at the end."""
    ctrl = controller("beta_ts", seed) if counts is None else controller("beta_ts", seed, counts=counts)
    world = torch.Generator().manual_seed(seed + 1)
    for _ in range(rounds):
        k = simulate_round(ctrl, [0.5])
        a = 0
        while a < k and torch.rand((), generator=world).item() < theta:
            a += 1
        ctrl.update(k, a)
    return ctrl.alpha / (ctrl.alpha + ctrl.beta)


@pytest.mark.parametrize("theta", [0.3, 0.6, 0.85])
def test_beta_ts_posterior_finds_the_true_acceptance(theta):
    """The default counts recover theta. The literal readings of Algorithm 2 do not: measured
    with this simulation, paper_output gives 0.3 -> 0.27, 0.6 -> 0.51, 0.85 -> 0.77 and
    paper_subset collapses to ~0 for every theta (a round with nothing accepted takes one from
    alpha, alpha sits at its floor, rounds shrink to one draft whose best outcome adds r = 0)."""
    assert abs(simulated_posterior_mean(theta) - theta) < 0.03
    assert simulated_posterior_mean(theta, "paper_output") < theta - 0.03
    assert simulated_posterior_mean(theta, "paper_subset") < 0.05


def test_beta_ts_reset_per_sequence():
    c = controller("beta_ts", alpha0=2, beta0=3)
    c.update(5, 2)
    c.reset(1)
    assert (c.alpha, c.beta) == (2, 3)
    keep = controller("beta_ts", alpha0=2, beta0=3, reset_per_sequence=False)
    keep.update(5, 2)
    keep.reset(1)
    assert (keep.alpha, keep.beta) == (4, 4)


def test_round_counts_are_checked():
    for c in (controller("beta_ts"), controller("cali_ts"), controller("adaptive_threshold")):
        with pytest.raises(ValueError):
            c.update(3, 4)
        before = c.state()
        c.update(0, 0)  # a round that drafted nothing teaches nothing
        assert c.state() == before


def test_cali_ts_posterior_by_hand():
    c = controller("cali_ts", sigma_m=0.2, sigma_s=0.3, theta0=0.5)
    # n = 0: the predictor alone, with its variance sigma_M^2
    assert c.posterior(0.7) == pytest.approx((0.7, 0.04))
    c.n, c.theta_hat = 3, 0.9
    # den = 3 * 0.04 + 0.09 = 0.21; mu = (0.09 * 0.7 + 0.12 * 0.9) / 0.21; var = 0.04 * 0.09 / 0.21
    mu, var = c.posterior(0.7)
    assert mu == pytest.approx((0.063 + 0.108) / 0.21)
    assert var == pytest.approx(0.0036 / 0.21)
    assert 1 / var == pytest.approx(1 / 0.04 + 3 / 0.09)  # eq. 7


def test_cali_ts_theta_hat_mean():
    c = controller("cali_ts", theta0=0.5)
    c.update(5, 2)  # r = 2 of 3 trials (consistent counts)
    assert (c.n, c.theta_hat) == (1, pytest.approx((0.5 + 2) / (1 + 3)))
    c.update(5, 5)  # r = 5 of 5
    assert (c.n, c.theta_hat) == (2, pytest.approx((0.5 + 7) / (1 + 8)))
    old = controller("cali_ts", theta0=0.5, counts="paper_output")
    old.update(5, 2)  # r = 2 of 4 trials
    assert old.theta_hat == pytest.approx((0.5 + 2) / (1 + 4))


def test_cali_ts_theta_hat_paper_eq10():
    c = controller("cali_ts", theta0=0.5, theta_update="paper")
    c.update(5, 2)  # |Q_v| = 3, t: 0 -> 3: (0.5 * 1 + 3) / 4
    assert c.theta_hat == pytest.approx(3.5 / 4)
    c.update(5, 0)  # |Q_v| = 1, t: 3 -> 4: (0.875 * 4 + 1) / 5
    assert c.theta_hat == pytest.approx(4.5 / 5)
    for _ in range(200):  # the documented flaw: all-rejected rounds still drive theta_hat to 1
        c.update(5, 0)
    assert c.theta_hat > 0.99


def test_adaptive_threshold_by_hand():
    c = controller("adaptive_threshold", gamma=0.6, epsilon=0.01, beta1=0.5, beta2=0.9, alpha=0.8)
    c.update(4, 2)  # e = 1: AR = 0.5 (beta1 taken as 0) <= 0.8 -> g~ = 0.61
    assert c.ar == pytest.approx(0.5)
    assert c.gamma == pytest.approx(0.9 * 0.6 + 0.1 * 0.61)  # 0.601
    c.update(2, 2)  # AR = 0.5 * 0.5 + 0.5 * 1 = 0.75 <= 0.8 -> g~ = 0.611
    assert c.ar == pytest.approx(0.75)
    assert c.gamma == pytest.approx(0.9 * 0.601 + 0.1 * 0.611)  # 0.602
    c.update(1, 1)  # AR = 0.875 > 0.8 -> g~ = 0.592
    assert c.gamma == pytest.approx(0.9 * 0.602 + 0.1 * 0.592)  # 0.601


def test_adaptive_threshold_reset_option():
    c = controller("adaptive_threshold")
    c.update(4, 0)
    c.reset(0)
    assert c.gamma > 0.6 and c.rounds == 1  # carries over by default (the paper's Figure 5)
    c = controller("adaptive_threshold", reset_per_sequence=True)
    c.update(4, 0)
    c.reset(0)
    assert (c.gamma, c.ar, c.rounds) == (0.6, 0.0, 0)


def test_fixed_and_static_threshold():
    f = controller("fixed", k=4)
    assert f.k_max == 4 and simulate_round(f, [0.1]) == 4
    assert simulate_round(controller("fixed", k=4, k_max=10), [0.1], budget=2) == 2
    t = controller("threshold", gamma=0.6)
    assert simulate_round(t, [0.9, 0.9, 0.5, 0.9]) == 3  # stops after the first token below gamma
    assert simulate_round(t, [0.1]) == 1  # every round drafts at least one token
    for bad in ({"k": 0}, {"k": 12, "k_max": 10}):
        with pytest.raises(SpecBenchError):
            controller("fixed", **bad)


# --- behaviour -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ADAPTIVE)
def test_acceptance_lengthens_drafts(name):
    long = mean_draft_length(controller(name, 1), accept_all=True, rounds=1000)
    short = mean_draft_length(controller(name, 1), accept_all=False, rounds=1000)
    assert long > 8 and short < 2, (long, short)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(CONTROLLERS)), k_max=st.integers(1, 12), seed=st.integers(0, 2**31),
       confidences=st.lists(st.floats(0, 1), min_size=1, max_size=15),
       accepted=st.lists(st.floats(0, 1), min_size=1, max_size=30), budget=st.integers(1, 20))
def test_k_max_never_exceeded(name, k_max, seed, confidences, accepted, budget):
    ctrl = controller(name, seed, **({"k": k_max} if name == "fixed" else {"k_max": k_max}))
    ctrl.reset(seed)
    for frac in accepted:
        n = simulate_round(ctrl, confidences, budget)
        assert 1 <= n <= min(k_max, budget)
        ctrl.update(n, math.floor(frac * n))


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_same_seed_same_decisions(name):
    def run(seed):
        ctrl = controller(name, seed)
        out = []
        for sample in range(3):
            ctrl.reset(seed + sample)
            for r in range(30):
                n = simulate_round(ctrl, [0.9, 0.7, 0.5, 0.95])
                ctrl.update(n, (r * 7) % (n + 1))
                out.append(n)
        return out, ctrl.state()

    assert run(5) == run(5)
    if name in ("beta_ts", "cali_ts"):
        assert run(5)[0] != run(6)[0]


def _separable(n=512, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    th, dh = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    pos = torch.randint(1, 14, (n,), generator=g)
    label = (dh[:, 0] + th[:, 1] > 0).float()
    return th, dh, pos, label


def test_predictor_learns_and_round_trips(tmp_path):
    data = _separable()
    p = CaliPredictor(d=8)
    losses = p.train_on(data, epochs=30, lr=0.05, batch_size=64, seed=0)
    assert losses[-1] < 0.5 * losses[0]
    th, dh, pos, label = data
    with torch.no_grad():
        acc = ((p(th, dh, pos) > 0.5).float() == label).float().mean()
    assert acc > 0.9
    p.save(tmp_path / "p.pt")
    q = CaliPredictor.load(tmp_path / "p.pt")
    with torch.no_grad():
        assert torch.equal(p(th, dh, pos), q(th, dh, pos))
        # any float dtype is cast to the predictor's own
        assert torch.allclose(q(th.bfloat16(), dh.half(), pos), q(th.bfloat16().float(), dh.half().float(), pos))


def test_cali_ts_with_predictor():
    p = CaliPredictor(d=8)
    c = CaliTS(**controller_args("cali_ts") | {"predictor": p})
    assert c.needs_hidden and not controller("cali_ts").needs_hidden
    h = torch.randn(8)
    c.keep_drafting(DraftInfo(i=12, confidence=0.5, target_hidden=h.bfloat16(), draft_hidden=h))
    assert c.theta_m == pytest.approx(0.5)  # a fresh predictor says 0.5 (zero W_p)
    with pytest.raises(SpecBenchError, match="hidden"):
        c.keep_drafting(DraftInfo(i=1))


def test_cali_ts_reads_its_predictor_at_one_matmul_per_draft_token():
    """Drafting asks the predictor once per draft token, at a position the host knows: it must pick
    W^i there, not evaluate all max_i of them (on SmolLM2-135M ten 576 x 576 matmuls cost about a
    decoder layer per draft token), and must give forward's values exactly."""
    from torch.utils.flop_counter import FlopCounterMode

    d = 16
    g = torch.Generator().manual_seed(0)
    p = CaliPredictor(d=d)
    with torch.no_grad():
        for t in p.parameters():
            t.copy_(torch.randn(t.shape, generator=g))
    c = CaliTS(**controller_args("cali_ts") | {"predictor": p})
    th, dh = torch.randn(d, generator=g), torch.randn(d, generator=g)
    for i in range(1, p.max_i + 4):
        with FlopCounterMode(display=False) as flops:
            got = c.on_device(i, dh, th)
        assert flops.get_total_flops() <= 2 * d * d + 2 * 2 * d, i  # W^i h, then W_p [.; .]
        with torch.no_grad():
            want = p(th.view(1, -1), dh.view(1, -1), torch.tensor([i]))
        assert torch.equal(got, want), i


def test_cali_ts_predictor_from_path(tmp_path):
    CaliPredictor(d=4).save(tmp_path / "p.pt")
    c = controller("cali_ts", predictor=str(tmp_path / "p.pt"))
    assert isinstance(c.predictor, CaliPredictor) and c.needs_hidden


def test_unknown_controller_lists_names():
    with pytest.raises(SpecBenchError) as e:
        build_controller(settings_of("control", {"name": "nope"}), seed=0)  # no table, no class
    for name in ("fixed", "threshold", "adaptive_threshold", "beta_ts", "cali_ts"):
        assert name in str(e.value)


def test_yaml_configs_build(tmp_path):
    for name in sorted(CONTROLLERS):
        cfg = control_settings(name)
        assert cfg.name == name and cfg.k_max == 10
        ctrl = build_controller(cfg, seed=0)
        assert type(ctrl) is CONTROLLERS[name] and ctrl.k_max == 10
