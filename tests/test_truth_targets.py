"""Truth rows for captions shared by several components (colour captions): each caption's target p(x | c), its true
draws and prompts, and the metrics against it, in float64 against direct computations."""

import pytest
import torch

from hddm_flower.data import Dataset
from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm
from hddm_flower.gmm.exact import caption_cluster_prior
from hddm_flower.gmm.targets import caption_targets, captions_of, draw_components, sample_prompts, true_draws
from hddm_flower.gmm.truth import CaptionTargets, cluster_tv, log_prob_given, truth_metrics

F64 = torch.float64
SPEC = dict(num_clusters=3, components_per_cluster=2, image_size=4, channels=3, rank=2, num_samples=90)


@pytest.fixture(scope="module")
def colour_dataset(tmp_path_factory):
    return prepare_gmm(tmp_path_factory.mktemp("gmm-colour"), GMMSpec(**SPEC, captions="colour"), max_caption_tokens=8)


@pytest.fixture(scope="module")
def colour_ref(colour_dataset):
    return load_reference(Dataset.open(colour_dataset))


@pytest.fixture(scope="module")
def pattern_ref(tmp_path_factory):
    return load_reference(
        Dataset.open(prepare_gmm(tmp_path_factory.mktemp("gmm-pattern"), GMMSpec(**SPEC), max_caption_tokens=8))
    )


def _binomial_bound(p: torch.Tensor, n: int, z: float = 4.5) -> torch.Tensor:
    """|frequency − p| below z binomial standard deviations (z = 4.5: a false alarm once in ~150,000 cells)."""
    return z * (p * (1 - p) / n).sqrt() + 1e-12


def test_a_colour_captions_target_is_its_components_mixture(colour_ref):
    """p(j | c) = π_j [c_j = c] / Σ_{c_i = c} π_i; p(k | c) is exact.caption_cluster_prior; log p(x | c) equals
    log Σ_j p(j | c) N(x; μ_j, Σ_j) computed directly with dense covariances."""
    ref = colour_ref
    caps = captions_of(ref)
    assert caps.texts == ["red", "green"] and caps.per_caption.tolist() == [3, 3] and not caps.one_per_component
    w = ref.mixture.weights
    for c in range(2):
        members = [2 * k + c for k in range(3)]
        want = torch.zeros(6, dtype=F64)
        want[members] = w[members] / w[members].sum()
        torch.testing.assert_close(caps.p_component[c], want, rtol=1e-12, atol=0)
    targets = caption_targets(caps, 5)
    assert targets.caption_of.tolist() == [0] * 15 + [1] * 15  # 5 per component of that colour
    torch.testing.assert_close(targets.p_cluster(ref.cluster_of), caption_cluster_prior(ref), rtol=1e-12, atol=0)
    x = ref.mixture.sample(30, torch.Generator().manual_seed(0))[0]
    cov = ref.mixture.covariance()
    dense = torch.stack(
        [
            torch.distributions.MultivariateNormal(ref.mixture.means[j], covariance_matrix=cov[j]).log_prob(x)
            for j in range(6)
        ],
        -1,
    )  # (30, 6)
    want = torch.logsumexp(dense + torch.log(caps.p_component[targets.caption_of]), -1)
    torch.testing.assert_close(log_prob_given(ref.mixture, x, targets), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_prob_given(ref.mixture, x, None), ref.mixture.log_prob(x), rtol=0, atol=0)


def test_true_draws_and_oracle_clusters_follow_p_j_given_c(colour_ref):
    """The components of the true draws for a colour caption, and the clusters its prompts give oracle routing,
    are drawn from p(j | c) and p(k | c): frequencies within a binomial bound; the prompts carry the caption's
    own text states."""
    ref = colour_ref
    caps = captions_of(ref)
    n_per = 4000
    targets = caption_targets(caps, n_per // 3)  # 4,000 samples per caption
    n = len(targets.caption_of)
    g = torch.Generator().manual_seed(7)
    comp = draw_components(targets.per_sample, g)
    assert torch.equal(true_draws(ref, targets, n, seed=7), ref.mixture.sample(n, g, comp)[0])  # from those draws
    prompts = sample_prompts(ref, caps, targets, seed=8)
    for c in range(2):
        mine = targets.caption_of == c
        freq = torch.bincount(comp[mine], minlength=6).double() / int(mine.sum())
        p = caps.p_component[c]
        assert ((freq - p).abs() <= _binomial_bound(p, int(mine.sum()))).all(), (freq, p)
        k_freq = torch.bincount(prompts.labels[mine], minlength=3).double() / int(mine.sum())
        pk = caption_cluster_prior(ref)[c]
        assert ((k_freq - pk).abs() <= _binomial_bound(pk, int(mine.sum()))).all(), (k_freq, pk)
        row = caps.states_of[c]
        assert (prompts.cond.states[mine] == ref.cond.states[row]).all()
        assert {prompts.captions[i] for i in mine.nonzero()[:, 0].tolist()} == {caps.texts[c]}


def test_captions_that_name_one_component_draw_what_a_fixed_component_draws(pattern_ref):
    """With one component per caption the targets are one-hot and no random number is spent on a component: the
    true draws are bit for bit those of fixed components per prompt, the prompts' clusters are the components'."""
    ref = pattern_ref
    caps = captions_of(ref)
    assert caps.one_per_component and torch.equal(caps.p_component, torch.eye(6, dtype=F64))
    targets = caption_targets(caps, 3)
    comps = torch.arange(6).repeat_interleave(3)
    assert torch.equal(targets.caption_of, comps)
    fixed = ref.mixture.sample(18, torch.Generator().manual_seed(11), comps)[0]
    assert torch.equal(true_draws(ref, targets, 18, 11), fixed)
    prompts = sample_prompts(ref, caps, targets, seed=3)
    assert torch.equal(prompts.labels, ref.cluster_of[comps]) and prompts.captions == [ref.captions[j] for j in comps]


def test_cluster_tv_and_adherence_against_closed_forms(colour_ref):
    """A colour caption's samples all in one cluster: cluster TV = 1 − p(that cluster | c); split in the proportions
    p(k | c): 0. Adherence counts the caption (the colour), and cluster adherence is absent (no caption fixes its
    cluster)."""
    ref = colour_ref
    caps = captions_of(ref)
    pk = caption_cluster_prior(ref)
    targets = CaptionTargets(caps.p_component, torch.zeros(600, dtype=torch.long))  # all "red"
    assert cluster_tv(torch.zeros(600, dtype=torch.long), targets, ref.cluster_of) == pytest.approx(1 - float(pk[0, 0]))
    # exactly p(k | c)·n in each cluster where that is an integer: build n from the largest-remainder rounding
    counts = (pk[0] * 600).round().long()
    counts[-1] = 600 - counts[:-1].sum()
    clusters = torch.arange(3).repeat_interleave(counts)
    assert cluster_tv(clusters, targets, ref.cluster_of) == pytest.approx(
        0.5 * float((counts.double() / 600 - pk[0]).abs().sum()), abs=1e-15
    )
    two = caption_targets(caps, 10)
    x = true_draws(ref, two, 60, seed=1)
    y = true_draws(ref, two, 60, seed=2)
    m = truth_metrics(ref.mixture, ref.cluster_of, x, y, two, 1.0)
    assert m["adherence"] == 1.0 and "cluster_adherence" not in m
    wrong = true_draws(ref, CaptionTargets(caps.p_component, 1 - two.caption_of), 60, seed=1)  # the other colour
    mw = truth_metrics(ref.mixture, ref.cluster_of, wrong, y, two, 1.0)
    assert mw["adherence"] == 0.0 and mw["delta_log_density_cond"] < m["delta_log_density_cond"] - 5


@pytest.fixture
def one_thread():
    """Small closed-form tensors: one torch thread (several only contend), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_truth_rows_score_colour_captions_end_to_end(colour_dataset, tmp_path, one_thread):
    """evaluate_group on the exact rows of a colour-caption mixture (no training: seconds): every row and seed is
    scored against p(x | c); the exact experts under the exact prompt-aware router put each colour's samples in
    the clusters of p(k | c) about as the true draws do, and stay on the caption's colour."""
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.gmm.evaluate import evaluate_group, truth_rows

    cfg = config_from_dict(
        {
            "num_experts": 3,
            "objectives": {"ddpm": 1, "fm": 2},
            "data": {"name": "gmm", "image_size": 4, "gmm_channels": 3, "gmm_components": 2, "gmm_captions": "colour"},
            "sampling": {"cfg_scale": 1.0, "x0_clamp": 3.0},
            "evaluation": {"samples_per_prompt": 40, "seeds": 2, "num_steps": 12, "batch_size": 240},
            "federation": {"min_nodes": 3, "min_experts": 1},
        },
        "gmm-colour-test",
    )
    names = {
        "true samples (fresh draws)",
        "exact FM experts · exact router · oracle",
        "exact FM experts · exact prompt-aware router · full",
        "exact FM experts · exact router · full · empty caption",
    }
    rows = [r for r in truth_rows([], [], "") if r.name in names]
    out = evaluate_group((cfg.to_dict(), str(tmp_path), str(colour_dataset), rows, None, False))
    assert set(out) == names
    true = out["true samples (fresh draws)"]
    assert true["samples_per_seed"] == 6 * 40 and len(true["per_seed"]) == 2
    assert true["metrics"]["adherence"]["mean"] == 1.0 and "cluster_adherence" not in true["metrics"]
    # 240 draws from p(k | c) per seed: the cluster TV of exact draws is sampling noise, a few hundredths
    assert true["metrics"]["cluster_tv"]["mean"] < 0.12
    for name in ("exact FM experts · exact router · oracle", "exact FM experts · exact prompt-aware router · full"):
        m = out[name]["metrics"]
        assert m["adherence"]["mean"] > 0.95, name
        assert m["cluster_tv"]["mean"] < true["metrics"]["cluster_tv"]["mean"] + 0.1, name
        # on their caption's components log p(x | c) = log p(x) − log p(c) there: both differences agree
        assert m["delta_log_density_cond"]["mean"] == pytest.approx(m["delta_log_density"]["mean"], abs=0.5), name
    empty = out["exact FM experts · exact router · full · empty caption"]["metrics"]
    assert "adherence" not in empty and empty["delta_log_density_cond"]["mean"] == empty["delta_log_density"]["mean"]
    from safetensors.torch import load_file

    ps = load_file(tmp_path / out["exact FM experts · exact router · oracle"]["per_sample_file"])
    seed0 = out["exact FM experts · exact router · oracle"]["per_seed"][0]
    got = float(ps["seed-0.log_p_cond"].double().mean() - ps["seed-0.true_log_p_cond"].double().mean())
    assert got == pytest.approx(seed0["delta_log_density_cond"], abs=1e-3)


def test_the_colour_config_is_the_equal_steps_ladder_with_colour_captions():
    from pathlib import Path

    from hddm_flower.config.io import load_config

    root = Path(__file__).parent.parent / "configs"
    colour, base = load_config(root / "reproduce-gmm-colour.yaml"), load_config(root / "reproduce-gmm-equal-steps.yaml")
    assert colour.data.gmm_captions == "colour" and base.data.gmm_captions == "pattern"
    d = colour.to_dict()
    d["data"]["gmm_captions"] = "pattern"
    assert d == base.to_dict()
