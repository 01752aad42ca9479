"""Claims in docs/results.md checked against the committed results: the sections "## The demo's choices over
independent trainings" and "## Federated vs central router (the embedded dataset, one node per cluster)", up to, not
including, the heading "## The first ten minutes".

That is: the run of ``benchmarks/embedded_trainings.py`` (``embedded_trainings.json``: its command, machine, load,
date and wall time, its protocol with ``configs/default.yaml``, the table of paired differences from today's default
with its bold cell, the default's own intervals, the prose and verdicts on them, the grids it saved); and the four
runs of ``benchmarks/federated_router.py`` (``federated_router.json``, ``federated_router-400.json``,
``federated_router-400-no-warmup.json``, ``federated_router-equal-weights.json``: their commands, machine, versions,
dates, minutes and commits, the budget, the table's six rows, the per-seed FID differences, the accuracy gaps, the
priors at t = 1, the bytes on the wire, what is said not to be measured).

Every number is recomputed from ``benchmarks/results/`` (the intervals from the per-seed values, paired by training
and sampling seed as ``hddm_flower.training_seeds.paired`` pairs them; the federated routers paired with the central
one by sampling seed), written as the doc writes it (the unicode minus, a thousands comma, the doc's decimals) and
looked up in the passage with its whitespace folded. A verdict ("a tie", "resolved", "not resolved", "better on
every seed", "not distinguishable") and a bold cell (= resolved) are checked against the paired differences."""

import math
import re
import statistics
import subprocess
from fractions import Fraction

import pytest
import yaml
from scipy import stats

from hddm_flower.config.io import load_config

from .doc_claims import DOC as RESULTS_DOC
from .doc_claims import RESULTS, ROOT, load, num, passage, raw_passage

DOC = RESULTS_DOC
START = "## The demo's choices over independent trainings"
FEDERATED = "## Federated vs central router (the embedded dataset, one node per cluster)"
END = "## The first ten minutes"
WORDS = ("zero", "one", "two", "three", "four", "five")

EMBEDDED = "embedded_trainings.json"
PROMPT_AWARE = "text · clamp"  # the arm the prose calls the prompt-aware router
SHRINK = "none · shrink + handover 0.8"  # the text-free router with shrink + hand-over
METRICS = ("fid", "kid", "adherence", "adherence_rows")

RUNS = {  # the four federated-router runs the section names
    "100": "federated_router.json",
    "400": "federated_router-400.json",
    "no-warmup": "federated_router-400-no-warmup.json",
    "equal": "federated_router-equal-weights.json",
}
FED = "fedadam-1step"
TABLE_ROWS = (("100", "central"), ("100", FED), ("400", "central"), ("400", FED), ("no-warmup", FED), ("equal", FED))


def demo() -> str:
    return passage(START, FEDERATED, DOC)


def federated() -> str:
    return passage(FEDERATED, END, DOC)


def config():
    return load_config(ROOT / load(EMBEDDED)["config"])


def default_yaml() -> dict:
    return yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())


# --- intervals as hddm_flower.training_seeds computes them


def interval(values: list[float]) -> dict:
    """Mean and the 95 % Student-t interval of the mean (``hddm_flower.gmm.truth.interval``)."""
    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "half": half, "n": len(values)}


def nested(values: list[list[float]]) -> dict:
    """``training_seeds.nested_interval``: over trainings of the per-training means, with the mean inner half-width."""
    inner = [interval(v)["half"] for v in values]
    return interval([statistics.fmean(v) for v in values]) | {"inner_half": statistics.fmean(inner)}


def off_zero(x: dict) -> bool:
    return x["lo"] > 0 or x["hi"] < 0


def values(arm: str, metric: str) -> list[list[float]]:
    return load(EMBEDDED)["values"][arm][metric]


def baseline() -> str:
    return load(EMBEDDED)["baseline"]


def differences(arm: str, metric: str) -> list[list[float]]:
    """``arm − baseline`` by training and sampling seed (``training_seeds.paired``)."""
    return [[a - b for a, b in zip(u, v, strict=True)] for u, v in zip(values(arm, metric), values(baseline(), metric))]


def difference(arm: str, metric: str) -> dict:
    return nested(differences(arm, metric))


def arms() -> list[str]:
    return [a for a in load(EMBEDDED)["arms"] if a != baseline()]


def label(arm: str) -> str:
    """An arm as the doc's table names it."""
    a = load(EMBEDDED)["arms"][arm]
    router = {"none": "text-free router", "text": "prompt-aware router"}[a["router_conditioning"]]
    s = a["sampling"]
    if not s:
        return f"{router}, clamp"
    assert set(s) == {"clean_estimate", "handover_t"}, s
    return f"{router}, {s['clean_estimate']} + hand-over {s['handover_t']:g}"


def shown(x: dict, digits: int) -> str:
    """``±mean ± half`` with the doc's decimals."""
    return f"{num(x['mean'], digits)} ± {num(x['half'], digits, sign=False)}"


def level(x: dict, digits: int) -> str:
    return f"{num(x['mean'], digits, sign=False)} ± {num(x['half'], digits, sign=False)}"


# --- the demo's choices: the run


def test_the_two_sections_run_from_the_demo_heading_through_the_federated_router_to_the_first_ten_minutes():
    text = DOC.read_text()
    assert text.count(START) == text.count(FEDERATED) == 1
    assert text.index(START) < text.index(FEDERATED) < text.index(END)
    assert END not in demo() and END not in federated()


def test_the_summary_in_the_json_is_the_nested_interval_of_its_values_paired_by_training_and_seed():
    summary = load(EMBEDDED)["summary"]
    for arm in load(EMBEDDED)["arms"]:
        for metric in METRICS:
            pairs = [(summary[arm][metric], nested(values(arm, metric)))]
            if arm != baseline():
                pairs.append((summary[arm][metric]["minus_baseline"], difference(arm, metric)))
            for theirs, mine in pairs:
                for key in ("mean", "half", "inner_half"):
                    assert math.isclose(theirs[key], mine[key], rel_tol=1e-9, abs_tol=1e-12), (arm, metric, key)


def test_the_runs_command_is_the_jsons_with_its_arms_quoted_and_its_out_folder_written_out():
    e = load(EMBEDDED)
    arm_names = list(e["arms"])
    prefix = "python -m benchmarks.embedded_trainings "
    head, _, out = e["command"].partition(" --out ")
    (trainings,) = re.findall(r"--trainings (\d+)", head)
    (seeds,) = re.findall(r"--seeds (\d+)", head)
    assert head == f"{prefix}--trainings {trainings} --seeds {seeds} --arms {' '.join(arm_names)}" and out
    quoted = " ".join(f'"{a}"' for a in arm_names)
    assert f"| `{prefix}--trainings {trainings} --seeds {seeds} --arms {quoted} --out OUT` |" in demo()


def test_the_runs_machine_is_the_jsons():
    parts = load(EMBEDDED)["machine"].split(", ")
    cpu, cores, memory, gpu, processes = parts[0], parts[1], parts[2], parts[3], parts[-1]
    assert gpu == "no GPU" and memory.endswith(" RAM") and processes.endswith(" processes")
    assert f"| {cpu}, {cores}, {memory.removesuffix(' RAM')}, CPU only, {processes}; **shared** (" in demo()


def test_the_run_was_shared_by_its_load_at_the_start_and_at_the_end():
    e = load(EMBEDDED)
    cores = int(re.search(r"(\d+) cores", e["machine"]).group(1))
    start, end = e["load_average"]["start"][0], e["load_average"]["end"][0]
    assert start > cores and end > cores  # **shared**: the load is above the cores
    assert (
        f"**shared** (load {num(start, 1, sign=False)} at the start, {num(end, 1, sign=False)} at the end) |" in demo()
    )


def test_the_runs_date_and_wall_time_are_the_jsons():
    e = load(EMBEDDED)
    assert f"| {e['date'][:10]} | {num(e['seconds'] / 60, 1, sign=False)} min (training 0's" in demo()


def test_training_i_moves_the_expert_and_router_seeds_by_the_codes_stride():
    source = (ROOT / "hddm_flower" / "training_seeds.py").read_text()
    (stride,) = re.findall(r"^TRAINING_SEED_STRIDE = ([\d_]+)$", source, flags=re.M)
    stride = int(stride.replace("_", ""))
    assert 'd[section]["seed"] = d[section]["seed"] + i * TRAINING_SEED_STRIDE' in source
    moved = "i" if stride == 1 else f"i · {num(stride, 0, sign=False)}"
    assert f"(training i moves the expert and router seeds by {moved};" in demo()


def test_each_training_trains_the_configs_experts_and_both_routers():
    e, cfg = load(EMBEDDED), config()
    (trainings,) = {len(values(a, m)) for a in e["arms"] for m in METRICS}
    assert {a["router_conditioning"] for a in e["arms"].values()} == {"none", "text"}  # both routers
    assert (
        f"measured over **{WORDS[trainings]} independent trainings** of `{e['config']}`" in demo()
        and f"each training trains the {cfg.num_experts} experts, {cfg.objectives.ddpm} DDPM : {cfg.objectives.fm} FM, "
        "once and both routers on them"
        in demo()
    )


def test_the_protocol_is_the_jsons_and_the_default_configs():
    e, cfg = load(EMBEDDED), config()
    steps = int(re.search(r"64-d, (\d+) steps, shared by every arm", e["feature_network"]).group(1))
    trainings, seeds, prompts, samples = map(
        int,
        re.fullmatch(
            r"(\d+) trainings × (\d+) sampling seeds; per seed (\d+) held-out prompts × (\d+) samples "
            r"\(top-2, the config's evaluation steps\) and the sample grid",
            e["protocol"],
        ).groups(),
    )
    assert {len(v) for a in e["arms"] for m in METRICS for v in values(a, m)} == {seeds}
    s, ev = cfg.sampling, cfg.evaluation
    assert (
        f"one shared feature classifier (hddm feature classifier 64-d, {num(steps, 0, sign=False)} steps, trained once "
        f"on the dataset) scores every arm; per sampling seed the same {prompts} held-out prompts × {samples} samples "
        f"(top-2, {ev.num_steps} Euler steps, CFG {s.cfg_scale:g}) give FID, KID and held-out-prompt adherence, and the "
        f"{len(s.prompts)} × {s.samples_per_prompt} sample grid ({s.num_steps} steps) gives adherence per grid row; "
        f"{seeds} sampling seeds per training."
    ) in demo()
    assert f"(chance {1 / cfg.num_experts:.3f})" in demo()
    assert f"± is the 95 % Student-t interval **over the {WORDS[trainings]} trainings** of the per-training mean " in (
        demo()
    )


def test_the_result_files_and_the_grids_the_section_names_are_committed():
    assert "Files: `benchmarks/results/embedded_trainings.{md,json}`" in demo()
    assert (RESULTS / "embedded_trainings.md").is_file() and (RESULTS / "embedded_trainings.json").is_file()
    assert "training 0's first-seed grids in `benchmarks/results/embedded_trainings/`." in demo()
    for arm in (baseline(), PROMPT_AWARE):  # benchmarks/embedded_trainings.py's _slug
        name = "-".join(w for w in arm.replace("·", " ").replace("+", " ").split())
        assert (RESULTS / "embedded_trainings" / f"{name}.png").is_file()
        assert f"(../benchmarks/results/embedded_trainings/{name}.png)" in demo()


# --- the demo's choices: the table


def table_lines() -> list[list[str]]:
    lines = [line.strip() for line in raw_passage(START, FEDERATED, DOC).splitlines()]
    (i,) = [i for i, line in enumerate(lines) if line.startswith("| arm − today's default")]
    rows = [lines[i]]
    for line in lines[i + 1 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_the_difference_tables_rows_are_the_jsons_arms_against_its_baseline():
    header, rule, *rows = table_lines()
    assert header[0] == f"arm − today's default ({label(baseline())})"
    assert header[1] == "FID ↓ [inner]" and header[3:] == ["adherence, held-out prompts ↑ [inner]",
                                                           "adherence, grid rows ↑ [inner]"]  # fmt: skip
    assert set(rule) == {"---"} and len(rule) == len(header) == 5
    assert sorted(r[0] for r in rows) == sorted(label(a) for a in arms())


def test_the_kid_column_is_headed_as_the_raw_kid_the_json_holds():
    header = table_lines()[0]
    # the cells are the file's kid itself (checked below); the generator writes it unscaled under "KID"
    assert "| arm − baseline | FID [inner] | KID [inner] |" in (RESULTS / "embedded_trainings.md").read_text()
    assert "{cell(d['kid'], '+.2f')}" in (ROOT / "benchmarks" / "embedded_trainings.py").read_text()
    assert header[2] == "KID ↓"


DIGITS = {"fid": 1, "kid": 1, "adherence": 3, "adherence_rows": 3}
INNER = {"fid", "adherence", "adherence_rows"}  # the doc's columns with an [inner]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("arm", [SHRINK, PROMPT_AWARE, "text · shrink + handover 0.8"])
def test_each_difference_cell_is_the_paired_interval_over_trainings_bold_where_it_is_resolved(arm, metric):
    rows = {r[0]: r[1:] for r in table_lines()[2:]}
    d = difference(arm, metric)
    cell = shown(d, DIGITS[metric])
    if off_zero(d):
        cell = f"**{cell}**"
    if metric in INNER:
        cell += f" [{num(d['inner_half'], DIGITS[metric], sign=False)}]"
    assert rows[label(arm)][METRICS.index(metric)] == cell


def test_todays_default_itself_is_the_baseline_arms_interval_over_trainings():
    fid, held_out, rows = (nested(values(baseline(), m)) for m in ("fid", "adherence", "adherence_rows"))
    assert (
        f"(Today's default itself: FID {level(fid, 1)}, held-out adherence {level(held_out, 3)}, grid-row adherence "
        f"{level(rows, 3)}, over trainings.)"
    ) in demo()


# --- the demo's choices: what it shows


def test_shrink_and_handover_on_the_embedded_data_is_a_tie_on_every_metric():
    assert not any(off_zero(difference(SHRINK, m)) for m in METRICS)
    (gmm,) = re.findall(r'\(see "([^"]+)"\)', demo())
    assert re.search(rf"^## {re.escape(gmm)}\b", DOC.read_text(), flags=re.M)  # the Gaussian-mixture section
    fid, held_out = difference(SHRINK, "fid"), difference(SHRINK, "adherence")
    assert (
        f"**Shrink + hand-over on the embedded data is a tie** (FID {shown(fid, 1)}, adherence {shown(held_out, 3)}, "
        "over trainings)"
    ) in demo()


def test_the_default_keeps_the_clamp_and_shrink_with_handover_is_two_keys_away():
    s = config().sampling
    overrides = load(EMBEDDED)["arms"][SHRINK]["sampling"]
    assert "clean_estimate" not in default_yaml()["sampling"]  # the section's default
    assert overrides["clean_estimate"] != s.clean_estimate and overrides["handover_t"] != s.handover_t
    assert (
        f"The default stays `sampling.clean_estimate: {s.clean_estimate}`, `sampling.handover_t: {s.handover_t}`; "
        f"shrink + hand-over is {WORDS[len(overrides)]} keys away."
    ) in demo()


def test_the_prompt_aware_routers_grid_row_adherence_is_the_one_resolved_difference():
    rows = difference(PROMPT_AWARE, "adherence_rows")
    assert [(a, m) for a in arms() for m in METRICS if off_zero(difference(a, m))] == [(PROMPT_AWARE, "adherence_rows")]
    assert rows["mean"] > 0
    assert (
        f"**The prompt-aware router makes the sample grid follow its prompts** (grid-row adherence {shown(rows, 3)} "
        "over trainings, the one resolved difference;"
    ) in demo()


def test_on_held_out_prompts_the_prompt_aware_routers_adherence_is_higher_in_most_pairs_and_not_resolved():
    gain = difference(PROMPT_AWARE, "adherence")
    pairs = [x for v in differences(PROMPT_AWARE, "adherence") for x in v]
    assert not off_zero(gain)
    assert (
        f"its adherence gain is {shown(gain, 3)} (higher in {sum(x > 0 for x in pairs)} of the {len(pairs)} training "
        "× seed pairs, not resolved over trainings)"
    ) in demo()


def test_the_prompt_aware_routers_fid_is_worse_in_mean_and_not_resolved():
    fid = difference(PROMPT_AWARE, "fid")
    assert fid["mean"] > 0 and not off_zero(fid)
    assert f"its FID is worse in mean, {shown(fid, 1)} (not resolved)" in demo()
    assert "the prompt-aware router's gain in adherence is not resolved and its FID is worse in mean" in demo()


def test_on_the_first_sampling_seed_the_prompt_aware_router_loses_fid_in_every_training():
    aware = [v[0] for v in values(PROMPT_AWARE, "fid")]
    free = [v[0] for v in values(baseline(), "fid")]
    losses = [a - f for a, f in zip(aware, free, strict=True)]
    assert all(x > 0 for x in losses)
    prompts = int(re.search(r"per seed (\d+) held-out prompts", load(EMBEDDED)["protocol"]).group(1))

    def listed(xs):
        return f"{', '.join(num(x, 1, sign=False) for x in xs[:-1])} and {num(xs[-1], 1, sign=False)}"

    assert (
        f"on the first sampling seed's {prompts} held-out prompts it loses {num(min(losses), 0, sign=False)}–"
        f"{num(max(losses), 0, sign=False)} FID in every training ({listed(aware)} against {listed(free)})"
    ) in demo()


def test_on_the_other_sampling_seeds_the_prompt_aware_router_loses_less_fid_than_on_the_first():
    per_training = differences(PROMPT_AWARE, "fid")
    assert all(max(v[1:]) < v[0] for v in per_training)  # less than that training's first-seed loss
    assert f"on the other {WORDS[len(per_training[0]) - 1]} seeds it ties or loses less." in demo()


def test_the_demos_default_router_stays_the_text_free_one():
    conditioning = config().router.conditioning
    assert load(EMBEDDED)["arms"][baseline()]["router_conditioning"] == conditioning
    assert "conditioning" not in default_yaml()["router"]  # the section's default
    assert f"**The demo's default stays the paper's text-free router** (`router.conditioning: {conditioning}`)" in (
        demo()
    )
    assert f"`--set router.conditioning={load(EMBEDDED)['arms'][PROMPT_AWARE]['router_conditioning']}` turns it on" in (
        demo()
    )


def test_the_grids_rows_are_the_default_configs_prompts_and_sampling():
    s = config().sampling
    assert (
        f"Rows: the default's {len(s.prompts)} prompts ({', '.join(s.prompts)}) × {s.samples_per_prompt} samples, "
        f"top-{s.top_k}, {s.num_steps} Euler steps, CFG {s.cfg_scale:g}."
    ) in demo()


# --- federated vs central router: the runs


def run(key: str) -> dict:
    return load(RUNS[key])


def result(key: str, name: str) -> dict:
    return run(key)["results"][name]


def nodes(key: str) -> int:
    return run(key)["config"]["num_experts"]


def test_the_federated_sections_result_files_are_committed_each_with_its_md():
    files = re.search(r"Files: (.+?) \(each with its `\.md`\)", federated()).group(1)
    names = [n.removeprefix("benchmarks/results/") for n in re.findall(r"`([^`]+)`", files)]
    assert names == list(RUNS.values())
    for name in names:
        assert (RESULTS / name).is_file() and (RESULTS / name).with_suffix(".md").is_file()


def test_the_link_to_deployment_md_points_at_an_existing_heading():
    (anchor,) = re.findall(r"\]\(deployment\.md#([^)]+)\)", federated())
    headings = [line.lstrip("#").strip() for line in (ROOT / "docs" / "deployment.md").read_text().splitlines()]
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings if h}
    assert anchor in slugs


def options(command: str) -> tuple[list[str], dict[str, str]]:
    """A federated_router command's options without the program, --keep and --out; and the dropped ones."""
    tokens = re.sub(r"^python (-m benchmarks\.federated_router|benchmarks/federated_router\.py) ", "", command).split()
    kept, dropped = [], {}
    while tokens:
        t = tokens.pop(0)
        if t in ("--keep", "--out"):
            dropped[t] = tokens.pop(0)
        else:
            kept.append(t)
    return kept, dropped


@pytest.mark.parametrize("key", ["100", "400"])
def test_the_benchmark_commands_are_the_jsons_without_the_keep_folder(key):
    block = re.search(r"```bash\n(.+?)```", raw_passage(FEDERATED, END, DOC), flags=re.S).group(1)
    commands = re.sub(r"\\\n\s*", "", block).splitlines()
    (doc_command,) = [c for c in commands if c.endswith(f"--out benchmarks/results/{RUNS[key]}")]
    mine, dropped = options(doc_command)
    theirs, _ = options(run(key)["command"])
    assert mine == theirs and set(dropped) == {"--out"}


def test_the_machine_versions_and_date_are_the_jsons():
    (cores,) = {re.search(r"(\d+) cores", run(k)["machine"]).group(1) for k in RUNS}
    (torch,) = {run(k)["versions"]["torch"] for k in RUNS}
    (flwr,) = {run(k)["versions"]["flwr"] for k in RUNS}
    (date,) = {run(k)["date"][:10] for k in RUNS}
    assert f"{cores}-core Intel Xeon (AMX), 24 GiB, no GPU; torch {torch}, flwr {flwr}; {date}." in federated()


def test_the_runs_minutes_are_the_jsons():
    m = {k: num(run(k)["minutes"], 1, sign=False) for k in RUNS}
    load = {k: re.search(r"load ([\d.]+) at start", run(k)["machine"]).group(1) for k in RUNS}
    assert (
        f"The {run('100')['config']['router']['steps']}-step run started at load {load['100']} ({m['100']} min)"
    ) in federated()
    assert (
        f"(loads {load['no-warmup']} and {load['400']} at their starts, one thread each; {m['no-warmup']} and "
        f"{m['400']} min)"
    ) in federated()


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)


def test_the_100_step_no_warmup_and_equal_weights_runs_predate_the_servers_warmup():
    commits = {k: run(k)["commit"] for k in RUNS}
    warmup = commits["400"]
    assert len({commits["100"], commits["no-warmup"], warmup}) == 2 and commits["100"] == commits["no-warmup"]
    assert "predate the server's warm-up (below); at 100 steps the federated router had no warm-up either." in (
        federated()
    )
    assert "| federated, no warm-up (an earlier commit) |" in federated()
    assert "| 100 steps, nodes weighted equally (an earlier commit) |" in federated()
    if git("cat-file", "-e", f"{warmup}^{{commit}}").returncode != 0:
        pytest.skip("the runs' commits are not in this checkout's history")
    assert "warm-up" in git("log", "-1", "--format=%s", warmup).stdout
    for earlier, later in ((commits["100"], warmup), (commits["equal"], commits["100"])):
        assert earlier != later and git("merge-base", "--is-ancestor", earlier, later).returncode == 0


def test_both_routers_get_the_same_budget_in_images():
    text = federated()
    for key in RUNS:
        r, central, fed = run(key)["config"]["router"], result(key, "central"), result(key, FED)
        assert central["images_seen"] == r["steps"] * r["batch_size"] == fed["images_seen"]
        assert fed["rounds"] == r["steps"] and fed["training"] == "flwr FedAdam, 1 local SGD step(s) per round"
    (batch,) = {run(k)["config"]["router"]["batch_size"] for k in RUNS}
    (per_node,) = {result(k, FED)["images_seen"] // (result(k, FED)["rounds"] * nodes(k)) for k in RUNS}
    (k,) = {nodes(k) for k in RUNS}
    assert f"central N AdamW steps × {batch} images; federated N rounds of Flower's FedAdam over {k} nodes" in text
    assert f"taking one SGD step on {per_node} of its images per round" in text
    source = (ROOT / "benchmarks" / "federated_router.py").read_text()
    assert "clusters = {100 + k: [k] for k in range(cfg.num_experts)}  # one node per cluster" in source
    assert f"over {k} nodes, each holding **one** cluster (a single class" in text


def validation_images() -> int:
    """The validation split's size: the common denominator of every held-out accuracy."""
    fractions = [
        Fraction(a).limit_denominator(1000) for k in RUNS for r in run(k)["results"].values() for a in r["top1"]
    ]
    return math.lcm(*(f.denominator for f in fractions))


def test_held_out_accuracy_is_on_the_validation_splits_95_images_and_the_prior_on_4096_draws():
    n = validation_images()
    assert f"on the pooled validation split ({n} images)" in federated()
    source = (ROOT / "benchmarks" / "federated_router.py").read_text()
    (draws,) = re.findall(r"def prior_gap\(router, dataset: Dataset, k: int, n: int = (\d+)\)", source)
    assert "against the clusters' training frequencies, which are the exact posterior there" in federated()
    assert f"(pure noise, {num(int(draws), 0, sign=False)} draws)" in federated()


def test_the_fid_protocol_is_the_commands_and_the_default_configs():
    (prompts,) = {re.search(r"evaluation\.num_prompts=(\d+)", run(k)["command"]).group(1) for k in RUNS}
    (seeds,) = {re.search(r"--fid-seeds (\d+)", run(k)["command"]).group(1) for k in RUNS}
    lengths = {len(r["fid"]["values"]) for k in RUNS for r in run(k)["results"].values()}
    assert lengths == {int(seeds)}
    (features,) = {r["fid"]["feature_network"] for k in RUNS for r in run(k)["results"].values()}
    assert features.startswith("hddm feature classifier 64-d (trained on twemoji")
    ev = config().evaluation
    assert (
        f"{prompts} held-out prompts × {ev.samples_per_prompt} samples per seed, {seeds} sampling seeds shared by every "
        "router, the run's own 64-d feature classifier"
    ) in federated()


# --- federated vs central router: the table


def fed_table() -> list[list[str]]:
    lines = [line.strip() for line in raw_passage(FEDERATED, END, DOC).splitlines()]
    (i,) = [i for i, line in enumerate(lines) if line.startswith("| budget | router |")]
    rows = []
    for line in lines[i:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_tables_header_is_the_runs_noise_levels_and_seeds():
    header, rule, *rows = fed_table()
    (times,) = {tuple(run(k)["times"]) for k in RUNS}
    (seeds,) = {len(r["fid"]["values"]) for k in RUNS for r in run(k)["results"].values()}
    assert header[:5] == ["budget", "router", "wall s", "bytes on the wire", f"top-1 t={times[0]:g}"]
    assert header[5 : 4 + len(times)] == [f"{t:g}" for t in times[1:]]
    assert header[4 + len(times)] == "TV to the prior at t=1"
    assert header[5 + len(times)].startswith(f"top-2 FID, {seeds} seeds (mean ± standard deviation, ")
    assert set(rule) == {"---"} and len(rule) == len(header) and len(rows) == len(TABLE_ROWS)


def doc_row(i: int) -> list[str]:
    return fed_table()[2 + i]


@pytest.mark.parametrize("i", range(len(TABLE_ROWS)))
def test_each_table_rows_budget_and_router_are_its_runs(i):
    key, name = TABLE_ROWS[i]
    budget, router = doc_row(i)[:2]
    r = run(key)["config"]["router"]
    assert budget.startswith(f"{r['steps']} steps")
    if "images" in budget:
        assert f"({num(result(key, name)['images_seen'], 0, sign=False)} images" in budget
    if "the default" in budget:
        assert r["steps"] == config().router.steps
    if name == "central":
        assert router.startswith("central") and result(key, name)["training"].startswith(router.split(" (")[0])
    else:
        assert router.startswith("federated")
        if "rounds" in router:
            assert f"(FedAdam, {result(key, name)['rounds']} rounds" in router


def wall(key: str, name: str) -> str:
    return f"{result(key, name)['wall_seconds']:.0f}"  # benchmarks/federated_router.py's render()


@pytest.mark.parametrize("i", range(len(TABLE_ROWS)))
def test_each_table_rows_wall_seconds_are_its_runs(i):
    assert doc_row(i)[2] == wall(*TABLE_ROWS[i])


@pytest.mark.parametrize("i", range(len(TABLE_ROWS)))
def test_each_table_rows_bytes_accuracy_and_prior_are_its_runs(i):
    key, name = TABLE_ROWS[i]
    r = result(key, name)
    cells = doc_row(i)[3:-1]
    assert cells[0] == ("0" if r["bytes_total"] == 0 else f"{num(r['bytes_total'] / 2**30, 1, sign=False)} GiB")
    assert cells[1:-1] == [f"{a:.3f}" for a in r["top1"]]
    if "prior_at_t1" in r:
        assert cells[-1] == f"{r['prior_at_t1']['tv']:.3f}"
    else:  # the equal-weights run predates the prior's measurement: its TV is in no committed file
        assert key == "equal"


def fid_difference(key: str) -> dict:
    """Federated − central FID, paired by sampling seed, with the 95 % Student-t interval over the seeds."""
    fed, central = result(key, FED)["fid"]["values"], result(key, "central")["fid"]["values"]
    return interval([a - b for a, b in zip(fed, central, strict=True)])


def fid_cell(i: int) -> str:
    f = result(*TABLE_ROWS[i])["fid"]
    assert math.isclose(f["std"], statistics.stdev(f["values"]))
    assert math.isclose(f["mean"], statistics.mean(f["values"]))
    return f"{num(f['mean'], 1, sign=False)} ± {num(f['std'], 1, sign=False)}"


@pytest.mark.parametrize("i", range(len(TABLE_ROWS)))
def test_each_table_rows_fid_is_its_runs_mean_and_standard_deviation_over_seeds(i):
    assert doc_row(i)[-1].strip("*") == fid_cell(i)


@pytest.mark.parametrize("i", range(len(TABLE_ROWS)))
def test_each_table_rows_fid_is_bold_exactly_where_its_paired_difference_from_the_central_router_is_resolved(i):
    key, name = TABLE_ROWS[i]
    bold = name != "central" and off_zero(fid_difference(key))
    assert doc_row(i)[-1] == (f"**{fid_cell(i)}**" if bold else fid_cell(i))


# --- federated vs central router: what it shows


def listed(pattern: str) -> list[str]:
    """The comma-separated numbers the doc lists in the (first) group of ``pattern``."""
    return re.search(pattern, federated()).group(1).split(", ")


PER_SEED = r"Per seed \(the same prompts and noise\), federated − central FID: (.+?) at 100 steps; (.+?) at 400 steps\."


def seed_differences(key: str) -> list[float]:
    fed, central = result(key, FED)["fid"]["values"], result(key, "central")["fid"]["values"]
    return [a - b for a, b in zip(fed, central, strict=True)]


@pytest.mark.parametrize(
    ("key", "seed"),
    [(key, seed) for key in ("100", "400") for seed in range(5)],
)
def test_each_per_seed_fid_difference_is_the_runs(key, seed):
    doc = re.search(PER_SEED, federated()).group({"100": 1, "400": 2}[key]).split(", ")
    assert len(doc) == len(seed_differences(key))
    assert doc[seed] == num(seed_differences(key)[seed], 1)


def test_at_100_steps_the_two_fids_are_within_each_others_spread_and_their_paired_difference_is_not_resolved():
    d = fid_difference("100")
    sds = [result("100", n)["fid"]["std"] for n in ("central", FED)]
    assert not off_zero(d) and abs(d["mean"]) < min(sds)
    sd = statistics.stdev(seed_differences("100"))
    assert (
        f"At 100 steps the two FIDs are within each other's spread (paired difference {shown(d, 1)} over {d['n']} seeds, "
        f"the 95 % half-width; their standard deviation is {num(sd, 1, sign=False)})"
    ) in federated()


def test_at_the_default_budget_the_federated_routers_ensemble_is_better_on_every_seed_with_and_without_warmup():
    for key in ("400", "no-warmup"):
        assert all(x < 0 for x in seed_differences(key)) and off_zero(fid_difference(key))
        assert run(key)["config"]["router"]["steps"] == config().router.steps
    assert "**The ensemble is as good with the federated router, and better at the default budget.**" in federated()
    assert "router's ensemble is better on every seed, by " in federated()


@pytest.mark.parametrize("key", ["400", "no-warmup"])
def test_the_federated_routers_average_fid_gain_at_the_default_budget_is_the_runs(key):
    gain = result(key, "central")["fid"]["mean"] - result(key, FED)["fid"]["mean"]
    assert math.isclose(gain, -statistics.fmean(seed_differences(key)))
    claim = "better on every seed, by {} on average" if key == "400" else "on average ({} without the warm-up)"
    assert claim.format(num(gain, 1, sign=False)) in federated()


def points(key: str, counts: bool = False) -> list[float]:
    """The federated router's held-out top-1 accuracy minus the central one's, in points, per noise level."""
    fed = result(key, FED)["top1_federated_counts" if counts else "top1"]
    return [100 * (a - b) for a, b in zip(fed, result(key, "central")["top1"], strict=True)]


ACCURACY = {
    "100": r"below the central one: at 100 steps ([^;]+?) points at t = ",
    "400": r" points at t = \S+ … \S+; at 400 steps ([^;]+?) \(its nodes' own federated counts",
    "no-warmup": r"router was \S+ points below at t = \S+ \(([^)]+)\)",
}


@pytest.mark.parametrize(
    ("key", "j"),
    [(key, j) for key in ACCURACY for j in range(5)],
)
def test_each_held_out_accuracy_gap_is_the_runs(key, j):
    doc = listed(ACCURACY[key])
    assert len(doc) == len(points(key))
    assert doc[j] == num(points(key)[j], 1)


def test_the_accuracy_gaps_noise_levels_are_the_runs():
    (times,) = {tuple(run(k)["times"]) for k in RUNS}
    assert f"points at t = {times[0]:g} … {times[-1]:g}; at 400 steps" in federated()


def test_the_federated_router_is_never_more_than_its_largest_gap_below_and_every_gap_over_5_points_is_in_its_favour():
    gaps = points("100") + points("400")  # the routers of today's code, weighted, with the warm-up at 400
    assert (
        f"**Held-out accuracy**: the federated router is never more than {num(-min(gaps), 1, sign=False)} points below "
        "the central one"
    ) in federated()
    assert all(g > 0 for g in gaps if abs(g) > 5)
    assert "Where the gap exceeds 5 points it is in the federated router's favour." in federated()


def test_one_image_of_the_validation_split_is_the_points_the_doc_says():
    n = validation_images()
    assert f"One image of the {n} is {num(100 / n, 2, sign=False)} points" in federated()


def binomial_apart(a: float, b: float, n: int) -> bool:
    """Two accuracies on n images more than two binomial standard errors of their difference apart."""
    return abs(a - b) > 2 * math.sqrt((a * (1 - a) + b * (1 - b)) / n)


def test_the_two_routers_accuracies_are_not_distinguishable_within_two_binomial_standard_errors():
    n = validation_images()
    for key in ("100", "400", "no-warmup", "equal"):
        for a, b in zip(result(key, FED)["top1"], result(key, "central")["top1"], strict=True):
            assert not binomial_apart(a, b, n), (key, a, b)
    assert "the two are not distinguishable" in federated()
    assert "although its accuracy on data was as good" in federated()


def test_the_federated_counts_of_the_400_round_routers_nodes_are_the_runs():
    counts = result("400", FED)["top1_federated_counts"]
    assert f"(its nodes' own federated counts, other noise: {', '.join(f'{a:.3f}' for a in counts)})" in federated()


def test_without_the_warmup_the_400_round_router_was_below_at_the_lowest_noise():
    gaps = points("no-warmup")
    (times,) = {tuple(run(k)["times"]) for k in RUNS}
    assert gaps[0] < 0 and gaps[0] == min(gaps)
    assert (
        f"Without the warm-up on the server's step the 400-round router was {num(-gaps[0], 1, sign=False)} points below "
        f"at t = {times[0]:g} ("
    ) in federated()
    warmup = run("400")["config"]["router"]["optim"]["warmup_steps"]
    assert {run(k)["config"]["router"]["optim"]["warmup_steps"] for k in RUNS} == {warmup}
    assert f"where the central AdamW warms up over {warmup} steps, cost accuracy at low noise" in federated()


def test_each_router_is_trained_once_with_one_seed():
    (seed,) = {run(k)["config"]["router"]["seed"] for k in RUNS}
    assert isinstance(seed, int) and all(set(run(k)["results"]) == {"central", FED} for k in RUNS)
    assert "One seed of each router." in federated()


def test_equal_weights_drew_the_same_images_from_every_node():
    fed = result("equal", FED)
    assert f"by the images each step drew: {fed['images_seen'] // (fed['rounds'] * nodes('equal'))} for every node" in (
        federated()
    )


def test_the_cluster_frequencies_are_the_runs():
    (freq,) = {tuple(r["prior_at_t1"]["frequencies"]) for k in RUNS for r in run(k)["results"].values()
               if "prior_at_t1" in r}  # fmt: skip
    assert math.isclose(sum(freq), 1)
    assert (
        f"the data's are {100 * max(freq):.0f} % for the largest cluster and {100 * min(freq):.0f} % for the smallest"
    ) in federated()


def test_with_equal_weights_the_ensembles_fid_doubled():
    equal, central = result("equal", FED)["fid"]["mean"], result("equal", "central")["fid"]["mean"]
    assert round(equal / central) == 2 and off_zero(fid_difference("equal"))
    assert (
        f"the ensemble's FID doubled ({num(equal, 1, sign=False)} against {num(central, 1, sign=False)})" in federated()
    )


def test_the_weighted_federated_routers_prior_at_t1_is_as_close_as_the_central_routers():
    tvs = [result(k, FED)["prior_at_t1"]["tv"] for k in ("100", "400", "no-warmup")]
    assert f"(TV {min(tvs):.2f}–{max(tvs):.2f})" in federated()
    assert "the federated router's prior at t = 1 is as close to the frequencies as the central router's" in federated()


def test_the_bytes_on_the_wire_in_100_and_400_rounds_are_the_runs():
    gib = {k: num(result(k, FED)["bytes_total"] / 2**30, 1, sign=False) for k in ("100", "400")}
    rounds = {k: result(k, FED)["rounds"] for k in ("100", "400")}
    assert f"{gib['100']} GiB in {rounds['100']} rounds and {gib['400']} GiB in {rounds['400']}, against nothing" in (
        federated()
    )
    assert result("no-warmup", FED)["bytes_total"] == result("400", FED)["bytes_total"]


def spread(xs: list[float], digits: int) -> str:
    """One number as the doc writes it where every run gives the same, else the runs' range."""
    lo, hi = (num(x, digits, sign=False) for x in (min(xs), max(xs)))
    return lo if lo == hi else f"{lo}–{hi}"


def per_round_mib(key: str) -> float:
    fed = result(key, FED)
    assert abs(fed["bytes_per_round"] * fed["rounds"] - fed["bytes_total"]) < fed["rounds"]  # a rounded mean
    return fed["bytes_per_round"] / 2**20


def test_the_bytes_per_round_are_the_100_and_400_round_runs():
    (k,) = {nodes(key) for key in ("100", "400")}
    mib = spread([per_round_mib(key) for key in ("100", "400")], 0)
    assert f"experiment config: {mib} MiB per round over {k} nodes" in federated()


def test_the_bytes_per_node_and_round_are_the_100_and_400_round_runs():
    per_node = spread([per_round_mib(key) / nodes(key) for key in ("100", "400")], 1)
    assert f"a round trip and the transfer of {per_node} MiB per node." in federated()


def test_the_in_process_wall_time_of_100_rounds_is_the_100_round_runs_at_its_load():
    fed = result("100", FED)
    load = re.search(r"load ([\d.]+) at start", run("100")["machine"]).group(1)
    assert (
        f"The in-process wall time ({wall('100', FED)} s for {fed['rounds']} rounds, the run that started at load "
        f"{load})"
    ) in federated()


def variants() -> set[str]:
    return {name for p in RESULTS.glob("federated_router*.json") for name in load(p.name)["results"]} - {"central"}


def test_the_fedavg_with_10_local_steps_variant_is_called_not_measured_only_if_no_committed_run_measures_it():
    unmeasured = re.search(r"Not measured: ([^.]+)\.", federated()).group(1)
    if "fedavg-10steps" in variants():  # measured: held-out accuracy, prior and bytes, no ensemble FID
        assert "FedAvg-with-10-local-steps" not in unmeasured.replace(
            "FedAvg-with-10-local-steps variant's ensemble FID", ""
        )


def test_no_committed_run_measures_the_restricted_softmax_variant():
    assert re.search(r"Not measured: [^.]*restricted-softmax variant", federated())
    source = (ROOT / "benchmarks" / "federated_router.py").read_text()
    assert '"fedavg-10steps-fedrs": {' in source and '"restricted_softmax": 0.5' in source
    assert not any("fedrs" in v for v in variants())
    for p in RESULTS.glob("federated_router*.json"):
        assert all(
            r.get("settings", {}).get("restricted_softmax", 1.0) == 1.0 for r in load(p.name)["results"].values()
        )
