"""Claims in docs/results.md checked against the committed results: the section "## The Gaussian mixture: the sampling
stack against the exact answer", from its heading up to, not including, the next "## " heading. That is the idle
``hddm reproduce --config configs/reproduce-gmm.yaml`` run (``reproduce-gmm-manifest.json``, whose tables
``reproduce-gmm-tables.md`` the section copies): its command, machine, date and times, its two tables row by row, and
the bullets read off them — the exact rows against the true samples, the two DDPM conversions, text-free routing,
the trained mixes against each other and the monolith, the trained router against the exact one paired by seed
(recomputed from the manifest's per-seed values with the project's own :func:`~hddm_flower.gmm.compare.paired_summary`),
the rerun's numbers "now", and the DiT initialisation's speed-ups (``convert_init.json``). The diagonal noise and the
clusters' shares of the training data, which no result file holds, are recomputed from the mixture's generator
(:func:`~hddm_flower.gmm.dataset.make_mixture`) with the manifest's data config.

Prose numbers are written as the doc writes them (the unicode minus, a thousands comma, the doc's decimals, a sign
on differences); the tables and the "Data:" and "Aligned inference:" lines are the generator's text of
``tables.md`` (ASCII minus, no comma), rebuilt from the manifest. Each is looked up in the section with its whitespace
folded; a verdict word ("indistinguishable", "resolved", "a tie", "beats", "best") is checked against the intervals. The earlier
commit's run (fce2ece) is not a committed file at this commit: its numbers are not checked here."""

import re
from functools import cache

import pytest
import torch

from hddm_flower.gmm.compare import paired_summary
from hddm_flower.gmm.dataset import GMMSpec, gmm_dataset_dir, make_mixture

from . import doc_claims
from .doc_claims import RESULTS, ROOT, iv, load, num, resolved

DOC = doc_claims.DOC  # the tests of the tests point this at an altered copy
START = "## The Gaussian mixture: the sampling stack against the exact answer"
END = "\n## "
MANIFEST = "reproduce-gmm-manifest.json"
TABLES = "reproduce-gmm-tables.md"
CONVERT_INIT = "convert_init.json"

TRUE = "true samples (fresh draws)"
ORACLE = "exact FM experts · exact router · oracle"
ORACLE_8X = "exact FM experts · exact router · oracle · 8× Euler steps"
EMPTY = "exact FM experts · exact router · full · empty caption"
EXACT_TOP2 = "exact FM experts · exact router · top2"
EXACT_FULL = "exact FM experts · exact router · full"
SCHEDULE_AWARE = "exact DDPM experts · schedule_aware · oracle"
NAIVE = "exact DDPM experts · naive · oracle"
MONOLITH = "monolith (equal compute)"
MIXES = ("8FM", "2DDPM:6FM", "4DDPM:4FM")
METRICS = ("delta_log_density", "mmd2", "mode_tv", "adherence", "cluster_adherence")
LABELS = {  # the doc's names of the metrics
    "Δ log p": "delta_log_density",
    "MMD²": "mmd2",
    "mode TV": "mode_tv",
    "adherence": "adherence",
    "cluster adherence": "cluster_adherence",
}
HIGHER_IS_BETTER = {
    "delta_log_density": True,
    "mmd2": False,
    "mode_tv": False,
    "adherence": True,
    "cluster_adherence": True,
}


def passage() -> str:
    """The section with its whitespace folded (read from ``DOC`` at call time)."""
    return doc_claims.passage(START, END, DOC)


def raw_lines() -> list[str]:
    return doc_claims.raw_passage(START, END, DOC).splitlines()


def manifest() -> dict:
    return load(MANIFEST)


def result(name: str) -> dict:
    return manifest()["results"][name]


def metric(name: str, m: str) -> dict:
    """A row's interval over its sampling seeds: ``mean``, ``half``, ``lo``, ``hi``."""
    return result(name)["metrics"][m]


@cache
def paired(a: str, b: str, m: str) -> dict:
    """Row ``a`` − row ``b`` paired by sampling seed (every row of a seed shares its prompts, noise and reference)."""
    return paired_summary([[s[m] for s in result(a)["per_seed"]]], [[s[m] for s in result(b)["per_seed"]]])


def level(x: float, digits: int) -> str:
    """A level as the doc writes it: no plus sign, the unicode minus."""
    return num(x, digits, sign=False)


def level_iv(x: dict, digits: int, scale: float = 1.0) -> str:
    """A row's ``mean ± half`` as the prose writes it (a level: no plus sign)."""
    return f"{level(x['mean'] * scale, digits)} ± {level(x['half'] * scale, digits)}"


def percent(x: float) -> str:
    return f"{level(100 * x, 0)} %"


def covers(x: dict, value: float) -> bool:
    return x["mean"] - x["half"] <= value <= x["mean"] + x["half"]


def trained_rows() -> list[str]:
    return [n for n, r in manifest()["results"].items() if r["row"]["group"] != "exact"]


def text_free_rows() -> list[str]:
    """Rows of trained experts routed by a text-free router (trained or exact), not by the oracle."""
    return [
        n for n in trained_rows() if result(n)["row"]["group"] != "monolith" and result(n)["row"]["mode"] != "oracle"
    ]


@cache
def mixture_and_sizes() -> tuple:
    """The mixture of the manifest's data config and its clusters' sizes in the drawn dataset (``meta.json``'s
    ``clusters[k].size``), by :mod:`hddm_flower.gmm.dataset`'s own draw."""
    cfg = manifest()["config"]
    d = cfg["data"]
    spec = GMMSpec(
        num_clusters=cfg["num_experts"],
        components_per_cluster=d["gmm_components"],
        image_size=d["image_size"],
        channels=d["gmm_channels"],
        rank=d["gmm_rank"],
        num_samples=d["gmm_samples"],
        seed=d["seed"],
    )
    assert gmm_dataset_dir("", spec, d["max_caption_tokens"]).name == manifest()["dataset"]["dataset"]
    mixture, _, cluster_of = make_mixture(spec)
    _, comp = mixture.sample(spec.num_samples, torch.Generator().manual_seed(spec.seed + 1))
    labels = torch.as_tensor(cluster_of)[comp]
    return mixture, [int((labels == k).sum()) for k in range(spec.num_clusters)]


# --- the section, its files and the run


def test_the_section_runs_from_its_heading_to_the_next_one_and_holds_its_bullets():
    p = passage()
    assert p.startswith(START)
    assert [line for line in raw_lines() if line.startswith("## ")] == [START]
    for bullet in (
        "- **Exact experts + exact router are indistinguishable from true samples",
        "- **`schedule_aware` vs `naive` on exact DDPM experts**",
        "- **A text-free router costs prompt adherence, even with exact parts.**",
        "- **Trained experts at this budget (mini preset, 200 steps each) are far from the truth**",
        "- **The intervals are across sampling seeds for one trained router, not across trainings.**",
        "- Longer budgets and DDM's equal-steps protocol",
    ):
        assert bullet in p


def test_the_files_the_section_names_are_committed():
    names = re.findall(r"`((?:benchmarks|configs|tests|hddm_flower)/[^`]+)`", passage())
    assert f"benchmarks/results/{MANIFEST}" in names and f"benchmarks/results/{TABLES}" in names
    for name in names:
        assert (ROOT / name).is_file(), name
    config = re.search(r"--config (\S+)", manifest()["command"])[1]
    assert (ROOT / config).is_file() and f"`{config}` (`data.name: {manifest()['config']['data']['name']}`" in passage()


def test_the_config_line_is_the_manifests_mixture():
    cfg = manifest()["config"]
    d = cfg["data"]
    assert (
        f"(`data.name: {d['name']}`: {cfg['num_experts']} patterns × {d['gmm_components']} colours, "
        f"{d['gmm_channels']}×{d['image_size']}×{d['image_size']}, rank-{d['gmm_rank']} + diagonal covariances;"
    ) in passage()


def idle_run_claims() -> dict[str, str]:
    """What the idle run's table row says, each as the doc writes it from the manifest."""
    m = manifest()
    t = m["timings_s"]
    (per_seed,) = {r["samples_per_seed"] for r in m["results"].values()}
    (seeds,) = {r["seeds"] for r in m["results"].values()}
    assert seeds == m["config"]["evaluation"]["seeds"]
    return {
        "command": f"| `{m['command']}` |",
        "cores": f"| {m['torch_threads']}-core ",
        "device": "CPU only" if m["device"] == "cpu" else m["device"],
        "torch": f"torch {m['versions']['torch']};",
        "load": f"(load {level(m['load_average']['start'][0], 1)} at the start;",
        "date": f"| {m['created_at'][:10]} |",
        "wall": f"| **{level(m['seconds'] / 60, 1)} min**",
        "cpu": f"({level(m['cpu_seconds'] / 60, 1)} CPU-min)",
        "stages": f"training {level(t['training'], 0)} s, router {level(t['router'], 0)} s, evaluation "
        f"{level(t['evaluation'], 0)} s |",
        "samples": f"| {per_seed} × {seeds} seeds = {level(per_seed * seeds, 0)} |",
    }


@pytest.mark.parametrize("claim", list(idle_run_claims()))
def test_the_idle_runs_row_is_its_manifests_command_machine_date_times_and_samples(claim):
    (row,) = [line for line in raw_lines() if line.startswith(f"| `{manifest()['command']}`")]
    assert idle_run_claims()[claim] in re.sub(r"\s+", " ", row)


def test_evaluation_is_its_share_of_the_run_over_its_samples_rows_and_euler_steps():
    m = manifest()
    (per_row,) = {r["samples_per_seed"] * r["seeds"] for r in m["results"].values()}
    assert (
        f"Evaluation ({level(per_row, 0)} samples × {len(m['results'])} rows × {m['config']['evaluation']['num_steps']} "
        f"Euler steps, plus the log-density and MMD against fresh true samples) is "
        f"{level(100 * m['timings_s']['evaluation'] / m['seconds'], 0)} % of the run; on "
        f"{['no', 'one', 'two', 'three', 'four'][m['torch_threads']]} idle cores the whole run takes "
        f"{level(m['seconds'] / 60, 1)} minutes"
    ) in passage()


# --- the tables: tables.md's text, rebuilt from the manifest


def cell(x: dict | None, spec: str, scale: float = 1.0) -> str:
    """A cell as ``tables.md`` writes it (the generator's format: ASCII minus, no comma)."""
    return "–" if x is None else f"{format(x['mean'] * scale, spec)} ± {format(x['half'] * scale, spec)}"


def table_row(name: str) -> str:
    m = result(name)["metrics"]
    return (
        f"| {name} | {cell(m['delta_log_density'], '.2f')} | {cell(m['mmd2'], '.2f', 1e3)} | "
        f"{cell(m['mode_tv'], '.3f')} | {cell(m.get('adherence'), '.3f')} | {cell(m.get('cluster_adherence'), '.3f')} |"
    )


def test_the_tables_rows_are_the_manifests_rows_in_its_order():
    names = [line.split(" | ")[0].removeprefix("| ") for line in raw_lines() if line.startswith("| ")]
    names = [n for n in names if n in manifest()["results"]]
    assert names == list(manifest()["results"])


@pytest.mark.parametrize("name", list(load(MANIFEST)["results"]))
def test_each_table_row_is_its_manifest_rows_intervals_over_seeds(name):
    assert table_row(name) in raw_lines()


def test_the_data_and_aligned_inference_lines_are_the_manifests_config():
    m = manifest()
    cfg, ev = m["config"], m["config"]["evaluation"]
    any_row = next(iter(m["results"].values()))
    data = (
        f"Data: {m['dataset']['dataset']} (a Gaussian mixture, {cfg['num_experts']} clusters × "
        f"{cfg['data']['gmm_components']} components, {cfg['data']['gmm_channels']}×{cfg['data']['image_size']}²). "
        f"Experts `{cfg['expert']['preset']}` × {cfg['expert']['steps']} steps × batch {cfg['expert']['batch_size']}; "
        f"monolith {cfg['num_experts'] * cfg['expert']['steps']} steps; router `{cfg['router']['preset']}` × "
        f"{cfg['router']['steps']} steps."
    )
    aligned = (
        f"Aligned inference: every component's caption × {ev['samples_per_prompt']} samples = "
        f"{any_row['samples_per_seed']} samples per row and seed, {ev['seeds']} seeds "
        f"({any_row['samples_per_seed'] * ev['seeds']} samples per row), the same noise in every row, FM Euler "
        f"{ev['num_steps']} steps, CFG {cfg['sampling']['cfg_scale']}, DDPM schedule {cfg['ddpm']['schedule']}. Each "
        f"cell: mean over seeds ± the half-width of its 95 % Student-t interval. MMD: Gaussian kernel, bandwidth "
        f"{any_row['bandwidth']:.3f} (median distance of true samples)."
    )
    assert data in raw_lines()
    assert aligned in passage()


def test_the_tables_block_is_the_committed_tables_md_after_its_produced_by_line():
    produced, *rest = (RESULTS / TABLES).read_text().strip().splitlines()
    assert produced.startswith(f"Produced by `{manifest()['command']}` on {manifest()['created_at']}")
    text = "\n".join(raw_lines())
    assert "\n".join(rest) in text


def test_the_intervals_are_over_the_sampling_seeds_of_one_training():
    m = manifest()
    for r in m["results"].values():
        assert "per_training" not in r and "nested" not in r
        assert r["seeds"] == len(r["per_seed"]) == r["metrics"]["delta_log_density"]["n"] == 3
    x = paired(f"{MIXES[0]} · top2", f"{MIXES[0]} · top2 · exact router", "mmd2")
    assert x["covers"] == "sampling seeds of one training" and x["n"] == m["config"]["evaluation"]["seeds"]
    assert "(the manifest's per-seed values; over the sampling seeds of one training)" in passage()
    assert "**The intervals are across sampling seeds for one trained router, not across trainings.**" in passage()


# --- exact experts and router against the true samples


def test_exact_parts_tie_the_true_samples_by_mmd_mode_tv_and_adherence_paired_by_seed():
    for m in ("mmd2", "mode_tv", "adherence", "cluster_adherence"):
        assert not paired(ORACLE, TRUE, m)["resolved"], m
    assert (
        "**Exact experts + exact router are indistinguishable from true samples by MMD, mode coverage and adherence** "
        f"(oracle: MMD² {level_iv(metric(ORACLE, 'mmd2'), 2, 1e3)} against {level_iv(metric(TRUE, 'mmd2'), 2, 1e3)} "
        f"for true vs true; TV {level(metric(ORACLE, 'mode_tv')['mean'], 3)} against "
        f"{level(metric(TRUE, 'mode_tv')['mean'], 3)}; adherence {level(metric(ORACLE, 'adherence')['mean'], 3)} "
        f"against {level(metric(TRUE, 'adherence')['mean'], 3)})"
    ) in passage()


def test_stratified_prompts_bias_every_rows_mmd_negative_and_the_true_samples_row_is_the_yardstick():
    true = metric(TRUE, "mmd2")
    assert true["hi"] < 0  # the true samples against fresh true samples: below 0, resolved
    assert "biases the unbiased MMD² slightly negative for every row alike: the true-samples row is the yardstick" in (
        passage()
    )


def test_by_log_density_the_exact_samples_sit_denser_than_true_ones_resolved():
    x = paired(ORACLE, TRUE, "delta_log_density")
    assert x["resolved"] and x["mean"] > 0
    assert (
        f"**They are not indistinguishable by log-density**: {num(metric(ORACLE, 'delta_log_density')['mean'], 0)} "
        "nats per sample, i.e. the samples sit in denser regions than true samples."
    ) in passage()


def test_the_schedule_aware_ddpm_row_lands_on_the_same_log_density_as_the_exact_fm_one():
    fm, ddpm = metric(ORACLE, "delta_log_density"), metric(SCHEDULE_AWARE, "delta_log_density")
    assert num(fm["mean"], 0) == num(ddpm["mean"], 0)
    assert covers(fm, ddpm["mean"]) and covers(ddpm, fm["mean"])
    assert "the schedule-aware DDPM row, exact in another parametrisation, lands on the same value" in passage()


def test_eight_times_the_euler_steps_shrinks_the_log_density_gap_about_8_fold():
    one, eight = metric(ORACLE, "delta_log_density"), metric(ORACLE_8X, "delta_log_density")
    factor = result(ORACLE_8X)["row"]["steps_factor"]
    assert covers(eight, one["mean"] / factor)  # first order: the error shrinks by the steps' factor
    assert (
        f"{factor}× the Euler steps shrinks it about {factor}-fold ({level(one['mean'], 1)} → "
        f"{level_iv(eight, 1)}), as first-order discretisation error should."
    ) in passage()


def test_the_diagonal_noise_is_its_mixtures_in_its_images_dimensions():
    cfg = manifest()["config"]["data"]
    mixture, _ = mixture_and_sizes()
    sigma = mixture.diag.sqrt()
    d = cfg["gmm_channels"] * cfg["image_size"] ** 2
    assert sigma.shape[1] == d
    low, high = level(float(sigma.min()), 2), level(float(sigma.max()), 1)  # the doc's range: 0.0624… to 0.0974…
    assert f"(σ ≈ {low}–{high} in {d} dimensions)" in passage()


# --- the two conversions of exact DDPM experts


@pytest.mark.parametrize("m", METRICS)
def test_schedule_aware_matches_the_exact_fm_experts_where_the_doc_says_and_differs_paired_where_it_says(m):
    """On the metrics the doc names as within the interval, the schedule-aware row's mean lies in the exact FM
    oracle row's interval and the paired difference is not resolved; on the two it names, paired by seed, resolved."""
    d = paired(SCHEDULE_AWARE, ORACLE, m)
    if m in ("mmd2", "delta_log_density"):
        assert resolved(d)
    else:
        assert covers(metric(ORACLE, m), metric(SCHEDULE_AWARE, m)["mean"]) and not resolved(d)
    assert "schedule-aware reproduces the exact FM experts within the interval on mode TV and both adherences;" in (
        passage()
    )


def test_schedule_awares_paired_differences_in_mmd_and_dlogp_are_the_manifests():
    a, b = metric(SCHEDULE_AWARE, "mmd2"), metric(ORACLE, "mmd2")
    mmd, dlp = (paired(SCHEDULE_AWARE, ORACLE, m) for m in ("mmd2", "delta_log_density"))
    assert (
        f"paired by seed it differs, by little, in MMD² ({iv(a, 2, scale=1e3)} against {iv(b, 2, scale=1e3)} "
        f"×10⁻³; paired {iv(mmd, 2, scale=1e3)}) and Δ log p (paired {iv(dlp, 3)} nats per sample), both resolved"
    ) in passage()


def test_naive_conversion_loses_its_nats_raises_mmd_and_misplaces_its_share_of_samples():
    x = metric(NAIVE, "delta_log_density")
    assert x["hi"] < 0
    assert (
        f"on the {manifest()['config']['ddpm']['schedule']} schedule loses {level(-x['mean'], 0)} nats per sample, "
        f"raises MMD² to {level(metric(NAIVE, 'mmd2')['mean'] * 1e3, 0)} ×10⁻³ and puts "
        f"{percent(1 - metric(NAIVE, 'adherence')['mean'])} of the samples in the wrong component"
    ) in passage()


# --- text-free routing


def test_text_free_routing_of_exact_parts_puts_its_share_of_samples_in_the_prompted_cluster():
    top2, full = metric(EXACT_TOP2, "cluster_adherence"), metric(EXACT_FULL, "cluster_adherence")
    assert (
        f"Top-2 routing of exact experts puts only {percent(top2['mean'])} of samples in the prompted cluster "
        f"(full: {percent(full['mean'])})"
    ) in passage()


def test_full_routing_on_the_empty_caption_covers_the_yardstick_of_unstratified_draws():
    x = metric(EMPTY, "mmd2")
    # the empty caption's reference is drawn from the whole mixture, not stratified: its yardstick is 0
    assert "adherence" not in result(EMPTY)["metrics"] and covers(x, 0.0)
    assert f"(MMD² {level_iv(x, 2, 1e3)}, covering the yardstick)" in passage()


def test_every_text_free_routing_mode_has_chance_cluster_adherence_and_oracle_and_monolith_theirs():
    values = [metric(n, "cluster_adherence")["mean"] for n in text_free_rows()]
    chance = 1 / manifest()["config"]["num_experts"]
    assert min(values) < chance < max(values)
    assert (
        f"every text-free routing mode has cluster adherence ≈ {level(min(values), 2)}–{level(max(values), 2)} "
        f"(chance is {level(chance, 3)}), while oracle routing (which knows the prompt's cluster) reaches "
        f"{level(metric('2DDPM:6FM · oracle', 'cluster_adherence')['mean'], 2)} and the monolith, which sees every "
        f"caption, {level(metric(MONOLITH, 'cluster_adherence')['mean'], 2)}."
    ) in passage()


# --- the trained mixes


def test_the_trained_experts_are_the_manifests_preset_and_steps():
    e = manifest()["config"]["expert"]
    assert f"**Trained experts at this budget ({e['preset']} preset, {e['steps']} steps each) are far from" in passage()


MIX_SENTENCE = re.compile(
    r"8FM beats 2DDPM:6FM beats 4DDPM:4FM at top-2 \(Δ log p (\S+) vs (\S+) vs (\S+); MMD² (\S+) vs (\S+) vs (\S+) "
    r"×10⁻³, neighbours within each other's intervals\)"
)


def mix_claims() -> dict[tuple[str, str], str]:
    m = MIX_SENTENCE.search(passage())
    assert m, "the sentence ranking the three mixes at top-2"
    return {(mix, "delta_log_density"): m[1 + i] for i, mix in enumerate(MIXES)} | {
        (mix, "mmd2"): m[4 + i] for i, mix in enumerate(MIXES)
    }


@pytest.mark.parametrize(
    ("mix", "m"),
    [
        ("8FM", "delta_log_density"),
        ("2DDPM:6FM", "delta_log_density"),
        pytest.param(
            "4DDPM:4FM",
            "delta_log_density",
        ),
        ("8FM", "mmd2"),
        ("2DDPM:6FM", "mmd2"),
        ("4DDPM:4FM", "mmd2"),
    ],
)
def test_each_mixs_top2_number_in_the_ranking_is_its_row(mix, m):
    scale = 1e3 if m == "mmd2" else 1.0
    assert mix_claims()[(mix, m)] == level(metric(f"{mix} · top2", m)["mean"] * scale, 0)


def test_8fm_beats_2ddpm6fm_beats_4ddpm4fm_at_top2_by_both_metrics_and_mmd_neighbours_overlap():
    dlp = [metric(f"{mix} · top2", "delta_log_density")["mean"] for mix in MIXES]
    mmd = [metric(f"{mix} · top2", "mmd2") for mix in MIXES]
    assert dlp == sorted(dlp, reverse=True) and [x["mean"] for x in mmd] == sorted(x["mean"] for x in mmd)
    for a, b in zip(mmd, mmd[1:]):  # the rows' intervals overlap: the ranking by MMD² is not resolved by them
        assert a["hi"] >= b["lo"]
    assert mix_claims()


def test_full_routing_beats_top2_for_2ddpm6fm_resolved_by_mmd():
    full, top2 = metric("2DDPM:6FM · full", "mmd2"), metric("2DDPM:6FM · top2", "mmd2")
    x = paired("2DDPM:6FM · full", "2DDPM:6FM · top2", "mmd2")
    assert x["resolved"] and x["mean"] < 0
    assert paired("2DDPM:6FM · full", "2DDPM:6FM · top2", "delta_log_density")["mean"] > 0
    assert (
        f"full routing beats top-2 for 2DDPM:6FM (MMD² {level_iv(full, 1, 1e3)} vs {level_iv(top2, 1, 1e3)})"
    ) in passage()


def test_the_equal_compute_monolith_is_best_on_every_metric():
    for m in METRICS:
        values = {n: metric(n, m)["mean"] for n in trained_rows()}
        best = (max if HIGHER_IS_BETTER[m] else min)(values, key=values.get)
        assert best == MONOLITH, m
    assert "The equal-compute monolith is best on every metric." in passage()


def test_the_monolith_takes_eight_times_an_experts_steps():
    cfg = manifest()["config"]
    k, steps = cfg["num_experts"], cfg["expert"]["steps"]
    assert f"the one network that takes {k}× an expert's optimiser steps" in passage()
    assert f"the monolith's {level(k * steps, 0)} steps, {k}× an expert's" in passage()


def test_the_monolith_sees_each_cluster_at_its_share_of_what_its_expert_sees():
    k = manifest()["config"]["num_experts"]
    _, sizes = mixture_and_sizes()
    ratios = [k * n / sum(sizes) for n in sizes]
    assert (
        f"{k} × the cluster's share of it, {level(min(ratios), 2)}–{level(max(ratios), 2)}× what each expert sees of "
        "its own cluster, by the cluster sizes in the dataset's `meta.json`"
    ) in passage()


# --- the trained router against the exact one, paired by seed


def router_cost(mix: str, m: str) -> dict:
    return paired(f"{mix} · top2", f"{mix} · top2 · exact router", m)


RESOLVED_WORSE = "(resolved: the trained router is worse)"


@pytest.mark.parametrize(
    ("mix", "m", "text", "verdict"),
    [
        ("8FM", "mmd2", "MMD² {} ×10⁻³ for 8FM and", RESOLVED_WORSE),
        ("2DDPM:6FM", "mmd2", "and {} for 2DDPM:6FM (resolved: the trained router is worse)", RESOLVED_WORSE),
        ("4DDPM:4FM", "mmd2", "{} for 4DDPM:4FM (a tie)", "(a tie)"),
        ("8FM", "delta_log_density", "Δ log p {} for 8FM and", "(ties)"),
        ("4DDPM:4FM", "delta_log_density", "and {} for 4DDPM:4FM (ties)", "(ties)"),
        ("2DDPM:6FM", "delta_log_density", "but {} for 2DDPM:6FM (resolved: the trained router loses", "(resolved:"),
    ],
)
def test_trained_minus_exact_router_at_top2_is_the_paired_difference_with_its_verdict(mix, m, text, verdict):
    """Each number with the verdict that covers it (one verdict may follow two numbers)."""
    x = router_cost(mix, m)
    worse = x["mean"] > 0 if m == "mmd2" else x["mean"] < 0  # MMD²: lower is closer; Δ log p: higher is closer
    assert x["resolved"] == verdict.startswith("(resolved") and (worse or not x["resolved"])
    sentence = passage()[passage().index("Trained − exact router at top-2, paired by seed") :]
    number = text.format(iv(x, 1, scale=1e3 if m == "mmd2" else 1.0))
    assert number in sentence and verdict in sentence[sentence.index(number) :]


def test_the_trained_router_loses_its_nats_per_sample_for_2ddpm6fm():
    x = router_cost("2DDPM:6FM", "delta_log_density")
    assert x["resolved"] and x["mean"] < 0
    assert f"the trained router loses {level(-x['mean'], 0)} nats per sample there" in passage()


def test_the_trained_router_costs_part_of_the_gap_in_as_many_mixes_by_both_metrics_as_the_doc_says():
    both = [
        mix
        for mix in MIXES
        if router_cost(mix, "mmd2")["mean"] > 0 and router_cost(mix, "delta_log_density")["mean"] < 0
    ]
    words = ["no", "one", "two", "three"]
    assert f"in {words[len(both)]} of the three mixes by both metrics' direction" in passage()


# --- the rerun's numbers "now"


RERUN = {  # what the bullet says now, after what it says then (the earlier commit's manifest, not checked here)
    "4DDPM:4FM · top2 · exact router": r"\(4DDPM:4FM · top2 · exact router: Δ log p \S+ then, (\S+) now\)",
    "monolith": r"but not the monolith, which uses no router: Δ log p \S+ ± \S+ then, (\S+ ± \S+) now",
    "monolith final loss": r"\(final loss \S+ then, (\S+) now;",
    "4DDPM:4FM · top2": r"\(e\.g\. 4DDPM:4FM · top2: MMD² \S+ ± \S+ then, (\S+ ± \S+) now;",
    "2DDPM:6FM · top2": r"2DDPM:6FM · top2: \S+ ± \S+ then, (\S+ ± \S+) now\)",
}


def rerun_now() -> dict[str, str]:
    return {
        "4DDPM:4FM · top2 · exact router": level(
            metric("4DDPM:4FM · top2 · exact router", "delta_log_density")["mean"], 2
        ),
        "monolith": level_iv(metric(MONOLITH, "delta_log_density"), 1),
        "monolith final loss": f"{manifest()['artefacts']['monolith']['final_loss']:.5f}",
        "4DDPM:4FM · top2": level_iv(metric("4DDPM:4FM · top2", "mmd2"), 1, 1e3),
        "2DDPM:6FM · top2": level_iv(metric("2DDPM:6FM · top2", "mmd2"), 1, 1e3),
    }


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(
            "4DDPM:4FM · top2 · exact router",
        ),
        "monolith",
        "monolith final loss",
        "4DDPM:4FM · top2",
        "2DDPM:6FM · top2",
    ],
)
def test_the_reruns_numbers_now_are_the_manifests(claim):
    found = re.search(RERUN[claim], passage())
    assert found, claim
    assert found[1] == rerun_now()[claim]


def test_the_orderings_that_hold_now():
    top2 = {mix: f"{mix} · top2" for mix in MIXES}
    for m in ("delta_log_density", "mmd2"):
        sign = 1 if HIGHER_IS_BETTER[m] else -1
        score = {n: sign * metric(n, m)["mean"] for n in trained_rows()}
        assert max(top2.values(), key=score.get) == top2["8FM"], m  # 8FM best of the three mixes
        d = {mode: score[f"2DDPM:6FM · {mode}"] for mode in ("full", "top2", "top1")}
        assert d["full"] > d["top2"] and d["full"] > d["top1"], m  # full better than top-2 and top-1
        assert max(score, key=score.get) == MONOLITH, m  # the monolith best overall
        for mix in MIXES:  # the exact router no worse than the trained one: no resolved win of the trained
            x = router_cost(mix, m)
            assert not (x["resolved"] and sign * x["mean"] > 0), (mix, m)
    assert (
        "Orderings that hold in both runs: 8FM best of the three mixes, full better than top-2 and top-1 for "
        "2DDPM:6FM, the monolith best overall, the exact router no worse than the trained one."
    ) in passage()


# --- the DiT initialisation


def test_the_dit_initialisations_speedups_are_convert_inits():
    c = load(CONVERT_INIT)
    assert (
        f"random initialisation's final loss {level(c['fm_speedup'], 2)}× (FM) and {level(c['ddpm_speedup'], 2)}× "
        "(DDPM) sooner"
    ) in passage()
    assert f"`{c['setup']['command'].split()[1]}`" in passage()  # the benchmark that wrote the file
