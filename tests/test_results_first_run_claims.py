"""Claims in docs/results.md checked against the committed results: the section "## The first ten minutes" with its
subsections "### Sample quality of the two defaults, with one yardstick" and "### Earlier candidates, scored by their
own reports", to the end of the doc; the rows of the timings table at the top of the doc that time `flwr run .`; and
README's sentence on how long the default run takes.

The one result file of the section is ``benchmarks/results/first_ten_minutes.json`` (the run of
``benchmarks/first_ten_minutes.py``: its feature classifier and protocol, per run and CFG scale the per-seed FID, KID
and adherence with their Student-t intervals, the paired differences from the previous default, the reports' held-out
velocity MSE), with its ``.md``. Every number of the yardstick table and of the prose on it is recomputed from the
per-seed values, written as the doc writes it (prose: the unicode minus, a thousands comma, the doc's digits; the
table: the writer's own format at the doc's digits, ASCII hyphen) and looked up in the passage with its whitespace
folded; a verdict ("resolved", "not resolved", "lower on every seed", "does not buy adherence", "below") is checked
against the paired differences by seed. The defaults the section describes are the committed ``configs/default.yaml``
now and at the commits its timing table names (read with ``git show``, skipped where those commits are not in the
checkout's history); its commands are parsed with the ``hddm`` command line's own parser and the config loader.

The wall times of ``flwr run .`` (879.3, 593.9, 532.0 and 891 s, the stages of the Flower log, the runs' own reports)
were measured by hand and written to no file: of those, only the doc's own arithmetic (minutes from seconds, the
percentages under ten minutes and under 540 s, the stages adding up, the two tables and README agreeing) and the dates
against the commits' are checked."""

import json
import math
import re
import statistics
import subprocess
import tempfile
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from scipy import stats

from hddm_flower.cli import build_parser
from hddm_flower.config.io import load_config, parse_overrides

from .doc_claims import DOC as RESULTS_DOC
from .doc_claims import RESULTS, ROOT, load, md_table, num, resolved

DOC = RESULTS_DOC
README = ROOT / "README.md"
CONFIG = ROOT / "configs" / "default.yaml"

TOP = "## The embedded default run"
TOP_END = "In the plain `flwr run . --stream` run"
START = "## The first ten minutes"
QUALITY = "### Sample quality of the two defaults, with one yardstick"
EARLIER = "### Earlier candidates, scored by their own reports"
README_START = "On an idle 2-core AVX-512 EPYC the run took"
README_END = "`hddm evaluate --run-dir RUN --modes"

FILE = "first_ten_minutes.json"
METRICS = ("fid", "kid", "adherence", "adherence_rows")
DIGITS = {"fid": 1, "kid": 1, "adherence": 3, "adherence_rows": 3}
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
CLI = "(cli)"  # the current default retrained by `hddm train-expert` + `hddm assemble`, beside the timed run
PARTIAL = {"ema": "EMA alone", "ema+lr2e-3": "EMA with lr 2·10⁻³", "ema+logit-normal": "EMA with logit-normal times"}


# --- the doc's passages and tables


def text_from(start: str, end: str | None = None, doc: Path | None = None) -> str:
    """The doc from ``start`` up to ``end`` (or its end), whitespace folded; read at call time so a test can swap
    the module's ``DOC``."""
    text = (doc or DOC).read_text()
    i = text.index(start)
    return re.sub(r"\s+", " ", text[i : text.index(end, i) if end else len(text)]).strip()


def raw_from(start: str, end: str | None = None) -> str:
    text = DOC.read_text()
    i = text.index(start)
    return text[i : text.index(end, i) if end else len(text)]


def timing() -> str:
    return text_from(START, QUALITY)


def quality() -> str:
    return text_from(QUALITY, EARLIER)


def earlier() -> str:
    return text_from(EARLIER)


def readme() -> str:
    return text_from(README_START, README_END, README)


def table(raw: str, header: str) -> list[list[str]]:
    """The rows of the markdown table of ``raw`` that starts with ``header``, its header and rule left out."""
    return md_table(raw, header)[1:]


def top_rows() -> list[list[str]]:
    """The timings table's rows that time ``flwr run .``: command, machine, date, wall time, experts."""
    return [r for r in table(raw_from(TOP, TOP_END), "| command | machine") if r[0].startswith("`flwr run .")]


def timed_rows() -> list[list[str]]:
    """The section's table: default, commit, date, wall time."""
    return table(raw_from(START, QUALITY), "| default | commit | date |")


def quality_rows() -> list[list[str]]:
    return table(raw_from(QUALITY, EARLIER), "| run | FID ↓ | KID ↓ |")


def seconds_of(cell: str) -> tuple[str, str]:
    """``(seconds, minutes)`` as a timed row writes them, ``593.9 s (9.9 min)``, bold or not."""
    m = re.fullmatch(r"(\*\*)?([\d.,]+) s \(([\d.]+) min\)(\*\*)?", cell)
    assert m and m.group(1) == m.group(4), cell
    return m.group(2), m.group(3)


PREVIOUS, CURRENT, PLAIN, EPYC = range(4)  # the section's timed rows: 700 steps; 460; the same later; on an EPYC


def timed(row: int) -> tuple[str, str]:
    """A timed row's ``(seconds, minutes)``."""
    return seconds_of(timed_rows()[row][3])


def commit(row: int) -> str:
    return timed_rows()[row][1]


def minutes(seconds: str) -> str:
    """Seconds as minutes to one decimal, half up (the seconds are themselves rounded: 891 s is 14.85 min)."""
    return str((Decimal(seconds.replace(",", "")) / 60).quantize(Decimal("0.1"), ROUND_HALF_UP))


def whole(seconds: str) -> str:
    return str(Decimal(seconds.replace(",", "")).quantize(Decimal("1"), ROUND_HALF_UP))


# --- configs, now and at the commits the doc names


@cache
def config():
    return load_config(CONFIG)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)


def need(*commits: str) -> None:
    if any(git("cat-file", "-e", f"{c}^{{commit}}").returncode != 0 for c in commits):
        pytest.skip("the doc's commits are not in this checkout's history")


@cache
def config_at(commit: str):
    """``configs/default.yaml`` as committed at ``commit``, loaded by today's loader."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "default.yaml"
        path.write_text(git("show", f"{commit}:configs/default.yaml").stdout)
        return load_config(path)


def lr_text(lr: float) -> str:
    """A learning rate as the doc writes it: 10⁻³, 2·10⁻³, 1.5·10⁻³."""
    m = round(lr * 1e3, 6)
    assert 0.1 <= m < 10, lr
    return "10⁻³" if m == 1 else f"{m:g}·10⁻³"


def timed_label(cfg) -> str:
    """A default as the timing table describes it."""
    e = cfg.expert
    t = "logit-normal t (FM)" if e.fm_time_sampling == "logit_normal" else "uniform t"
    ema = f"EMA {e.ema_decay:g}" if e.ema_decay > 0 else "no EMA"
    modes = cfg.evaluation.routing_modes
    evaluated = "top-2 evaluated" if list(modes) == ["top2"] else f"{len(modes)} routing modes evaluated"
    return f"{e.steps} steps, lr {lr_text(e.optim.lr)}, {t}, {ema}, {evaluated}"


# --- the yardstick run


def ftm() -> dict:
    return load(FILE)


def points() -> dict:
    return ftm()["points"]


def interval(values: list[float]) -> dict:
    """Mean and half-width of the 95 % Student-t interval of the mean (``hddm_flower.gmm.truth.interval``)."""
    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "half": half, "n": len(values)}


def baseline() -> str:
    (key,) = {p["minus_baseline"]["baseline"] for p in points().values() if "minus_baseline" in p}
    return key


def key_of(name: str) -> str:
    (key,) = [k for k, p in points().items() if p["name"] == name]
    return key


def level(key: str, metric: str) -> dict:
    return interval(points()[key]["per_seed"][metric])


def diff(key: str, metric: str, against: str | None = None) -> dict:
    """``key − against`` (the baseline unless given), paired by seed."""
    a, b = points()[key]["per_seed"][metric], points()[against or baseline()]["per_seed"][metric]
    return interval([x - y for x, y in zip(a, b, strict=True)])


def current() -> str:
    return key_of("current-default")


def cli() -> str:
    (key,) = [k for k, p in points().items() if p["name"].endswith(CLI)]
    return key


def table_keys() -> list[str]:
    """The runs of the yardstick table: every run at the baseline's CFG scale but the CLI retraining."""
    scale = points()[baseline()]["cfg_scale"]
    return [k for k, p in points().items() if p["cfg_scale"] == scale and k != cli()]


def settings(key: str, previous, now) -> dict:
    """A run's training settings: the previous default's config, changed as the run's name says (``ema``, ``lrX``,
    ``logit-normal``, ``batchB-Nsteps``); the current default's from today's config."""
    p = points()[key]
    if p["name"] == "current-default":
        e = now.expert
        return {"steps": e.steps, "batch": e.batch_size, "lr": e.optim.lr, "t": e.fm_time_sampling, "ema": e.ema_decay}
    e = previous.expert
    s = {"steps": p["expert_steps"], "batch": e.batch_size, "lr": e.optim.lr, "t": e.fm_time_sampling}
    s["ema"] = e.ema_decay
    if p["name"] == "previous-default":
        return s
    for token in p["name"].removesuffix(CLI).split("+"):
        if token == "ema":
            s["ema"] = now.expert.ema_decay
        elif token == "logit-normal":
            s["t"] = "logit_normal"
        elif token.startswith("lr"):
            s["lr"] = float(token[2:])
        elif m := re.fullmatch(r"batch(\d+)-(\d+)steps", token):
            s["batch"] = int(m.group(1))
            assert int(m.group(2)) == p["expert_steps"]
        else:
            raise AssertionError(f"{token!r} of {p['name']!r}")
    return s


def quality_label(key: str, previous, now) -> str:
    """A run as the yardstick table names it, without the compute note of a run at another batch size."""
    s = settings(key, previous, now)
    t = "logit-normal" if s["t"] == "logit_normal" else "uniform"
    body = f"{s['steps']} steps"
    if s["batch"] != now.expert.batch_size:
        body += f" at batch {s['batch']}"
    body += f", lr {lr_text(s['lr'])}, {t} t, {'EMA' if s['ema'] > 0 else 'no EMA'}"
    name = points()[key]["name"]
    if name == "previous-default":
        return f"previous default: {body}"
    if name == "current-default":
        return f"**current default** (the timed `flwr run .`): {body}"
    return body


def level_cell(x: dict, digits: int) -> str:
    return f"{x['mean']:.{digits}f} ± {x['half']:.{digits}f}"


def diff_cell(x: dict, digits: int) -> str:
    return f"{x['mean']:+.{digits}f} ± {x['half']:.{digits}f}"


def shown(x: dict, digits: int) -> str:
    return f"{num(x['mean'], digits)} ± {num(x['half'], digits, sign=False)}"


def md_rows(header: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for cells in md_table((RESULTS / "first_ten_minutes.md").read_text(), header)[1:]}


# --- where the section is


def test_the_section_runs_from_its_heading_through_its_two_subsections_to_the_end_of_the_doc():
    text = DOC.read_text()
    assert text.count(START) == text.count(QUALITY) == text.count(EARLIER) == 1
    assert text.index(START) < text.index(QUALITY) < text.index(EARLIER)
    assert not re.search(r"^#{1,3} ", text[text.index(EARLIER) + len(EARLIER) :], flags=re.M)  # the last heading


def test_the_links_to_the_section_and_to_samples_point_at_headings_of_the_doc():
    text = DOC.read_text()
    slug = "-".join(START.removeprefix("## ").lower().split())
    assert re.search(rf"^{re.escape(START)}$", text, flags=re.M)
    assert all(f"[below](#{slug})" in r[0] for r in top_rows() if "commit" in r[0])
    assert f"(docs/results.md#{slug})" in readme()
    assert "rows as in [Samples](#samples)" in text_from(QUALITY, EARLIER)
    assert re.search(r"^### Samples$", text, flags=re.M)
    assert "![samples of the current default run](samples-default.png)" in quality()
    assert (ROOT / "docs" / "samples-default.png").is_file()


# --- the timings of `flwr run .` (measured by hand: the doc's own arithmetic, its commits and configs)


def test_each_timed_rows_minutes_are_its_seconds_over_sixty():
    for row in timed_rows():
        seconds, mins = seconds_of(row[3])
        assert minutes(seconds) == mins, row
    for row in top_rows():
        m = re.fullmatch(r"(\*\*)?([\d.]+) min(\*\*)?(?: \(([\d,]+) s\))?", row[3])
        assert m and m.group(1) == m.group(3), row
        if m.group(4):
            assert minutes(m.group(4)) == m.group(2), row


@pytest.mark.parametrize(
    "row",
    [
        0,
        1,
        2,
        3,
        4,
    ],
)
def test_the_timings_tables_seconds_are_written_with_the_thousands_comma(row):
    cell = top_rows()[row][3]
    for seconds in re.findall(r"\(([\d,]+) s\)", cell):
        assert seconds == num(int(seconds.replace(",", "")), 0, sign=False), cell


def test_the_timings_tables_commit_rows_are_the_sections_runs_rounded_to_the_second():
    rows = [r for r in top_rows() if "commit " in r[0]]
    assert len(rows) == 3
    for row in rows:
        (commit,) = re.findall(r"commit ([0-9a-f]{7})", row[0])
        (section,) = [r for r in timed_rows() if r[1] == commit]
        seconds, mins = seconds_of(section[3])
        assert row[2] == section[2], commit
        assert row[3].replace("**", "") == f"{mins} min ({whole(seconds)} s)", (row[3], section[3])


def test_the_timings_tables_rows_run_the_configs_eight_experts_on_two_supernodes_of_four():
    n = config().num_experts
    assert all(r[4] == f"{n}/{n}" for r in top_rows())
    (row,) = [r for r in top_rows() if f"commit {commit(PREVIOUS)}" in r[0]]
    assert f"each SuperNode training its {n // 2} experts two at a time (commit" in row[0]
    assert f"plain `flwr run . --stream` (2 SuperNodes × {n // 2} experts, trained two at a time)" in timing()
    assert f"for the two SuperNodes' experts (each {n // 2} × {config().expert.steps} steps, two at a time" in timing()


def test_the_timings_tables_versions_are_within_the_projects_pins():
    pins = {}
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if m := re.match(r'\s*"((torch|flwr|diffusers)\b[^"]*)"', line):
            pins[m.group(2)] = Requirement(m.group(1)).specifier
    named = [(n, v) for r in top_rows() for n, v in re.findall(r"\b(torch|flwr|diffusers) (\d[\d.]*)", r[1])]
    assert {n for n, _ in named} == {"torch", "flwr", "diffusers"}
    assert all(v in pins[n] for n, v in named), (named, pins)


def test_each_timed_run_is_dated_on_or_after_its_commit_and_the_commits_follow_each_other():
    commits = [r[1] for r in timed_rows()]
    need(*commits)
    for row in timed_rows():
        assert git("log", "-1", "--format=%cs", row[1]).stdout.strip() <= row[2], row
    for a, b in zip(commits, commits[1:]):
        assert git("merge-base", "--is-ancestor", a, b).returncode == 0, (a, b)


def test_the_timed_rows_describe_the_default_config_at_their_commits():
    commits = [r[1] for r in timed_rows()]
    need(*commits)
    previous, cur, *same = timed_rows()
    assert len(same) == 2
    assert previous[0] == f"previous: {timed_label(config_at(previous[1]))}"
    assert cur[0] == f"current: {timed_label(config_at(cur[1]))}" and config_at(cur[1]) == config()
    for row in same:
        assert row[0].startswith("current, the same settings") and config_at(row[1]) == config_at(cur[1])


def test_the_previous_default_is_the_config_at_its_commit_and_the_overrides_line_reproduces_it():
    need(commit(PREVIOUS))
    prev = config_at(commit(PREVIOUS))
    e = prev.expert
    assert e.ema_decay == 0 and e.fm_time_sampling == "uniform"
    modes = prev.evaluation.routing_modes
    assert (
        f"The previous default trained {e.steps} steps at {lr_text(e.optim.lr)} with uniform times and no EMA and "
        f"evaluated {WORDS[len(modes)]} routing modes."
    ) in timing()
    (overrides,) = re.findall(r'`overrides="([^"]+)"`', text_from(TOP, TOP_END))
    assert load_config(CONFIG, parse_overrides(overrides)) == prev
    (sets,) = re.findall(r'^SETS="([^"]+)"$', raw_from(QUALITY, EARLIER), flags=re.M)
    assert sets.startswith("--set ")
    by_sets = load_config(CONFIG, parse_overrides(" ".join(sets.split("--set ")[1:])))
    assert by_sets.expert == prev.expert


def test_the_current_default_is_the_configs_460_steps_ema_and_logit_normal_times_evaluated_top_2_only():
    cfg = config()
    e = cfg.expert
    assert list(cfg.evaluation.routing_modes) == ["top2"] and e.fm_time_sampling == "logit_normal"
    assert (
        f"The default `flwr run .` trains each expert for {e.steps} steps at learning rate {lr_text(e.optim.lr)} with "
        f"an EMA of the weights (diffusers' `EMAModel`, decay {e.ema_decay:g}) and logit-normal training times for the "
        f"FM experts (SD3's `t = sigmoid(z)`, z ~ N({e.fm_logit_mean:g}, {e.fm_logit_std:g}), "
        "`expert.fm_time_sampling`), and evaluates top-2 routing only"
    ) in timing()
    assert "ema = EMAModel(params, decay=ema_decay)" in (ROOT / "hddm_flower" / "training.py").read_text()
    assert "return torch.sigmoid(mean + std * z)" in (ROOT / "hddm_flower" / "objectives.py").read_text()
    (modes,) = re.findall(r"\(the full protocol: `hddm evaluate --run-dir RUN --modes ([a-z0-9,]+)`\)", timing())
    args = build_parser().parse_args(["evaluate", "--run-dir", "RUN", "--modes", modes])
    full = load_config(CONFIG, parse_overrides(f"evaluation.routing_modes=[{args.modes}]"))
    assert set(full.evaluation.routing_modes) > set(cfg.evaluation.routing_modes)


def test_the_runs_exported_the_five_variables_of_the_readme():
    text = README.read_text()
    block = re.search(r"^export (?:.*\\\n)*.*$", text, flags=re.M).group(0)  # the quick start's first export
    names = re.findall(r"\b([A-Z][A-Z0-9_]+)=", block)
    assert len(names) == len(set(names)) == 5
    assert f"the {WORDS[len(names)]} variables of the README exported, idle machine:" in timing()
    assert f"the same machine idle, the {WORDS[len(names)]} variables exported" in timing()


def stage(pattern: str) -> int:
    (x,) = re.findall(pattern, timing())
    return int(x)


def test_the_stages_of_each_timed_run_add_up_to_its_wall_time():
    seconds = Decimal(timed(CURRENT)[0])
    assert f"Where the current default's {whole(str(seconds))} s go" in timing()
    first = stage(r"(\d+) s from `flwr run` to the first training")
    a, b = (int(x) for x in re.search(r"; (\d+) s and (\d+) s for the two SuperNodes' experts", timing()).groups())
    after = stage(rf"where it took ≈ (\d+) s at {commit(CURRENT)}")
    assert abs(first + a + b + after - seconds) <= 1  # 33 + 223 + 221 + 117 against 593.9
    plain = Decimal(timed(PLAIN)[0])
    assert f"The same settings at commit {commit(PLAIN)} ({timed_rows()[PLAIN][2]}, the same machine idle" in timing()
    assert f"reach the report in **{plain} s**" in timing()
    first, both = stage(r"≈ (\d+) s to the first training"), stage(r"≈ (\d+) s for both SuperNodes")
    after, out = stage(r"The stage after the experts takes ≈ (\d+) s"), stage(r"≈ (\d+) s to exit")
    assert abs(first + both + after + out - plain) <= 1  # 24 + 416 + 86 + 6 against 532.0
    assert f"s router ({config().router.steps} steps)" in timing()


def test_the_percentages_under_ten_minutes_and_under_540_s_are_the_timed_seconds():
    text = timing()
    seconds = float(timed(CURRENT)[0])
    assert f"It is {100 * (600 - seconds) / 600:.0f} % under the ten minutes" in text
    plain = float(timed(PLAIN)[0])
    assert f"The run is {100 * (540 - plain) / 540:.1f} % under 540 s" in text


def test_the_per_expert_seconds_of_the_plain_run_are_the_ones_the_epyc_row_compares_with():
    (low, high) = re.search(
        r"; (\d+)–(\d+) s per expert, two at a time, ≈ \d+ s for both SuperNodes", timing()
    ).groups()
    assert f"against {low}–{high} s at {commit(PLAIN)})" in timed_rows()[EPYC][0]


def test_what_it_shows_opens_with_the_timed_minutes_of_the_two_defaults():
    assert (
        f"the current default reaches its report in {timed(CURRENT)[1]} minutes where the previous one took "
        f"{timed(PREVIOUS)[1]}, and its samples are better"
    ) in quality()


def test_readmes_sentence_gives_the_timed_runs_record_and_the_sections_avx2_row():
    """README's run time: the record of ``benchmarks/flwr_run.py`` (its file named in the sentence), then the doc's
    AVX2 row, which no result file holds (said so)."""
    name = re.search(r"`benchmarks/results/(flwr_run-[\d-]+)\.md`", readme())[1]
    record = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    assert (ROOT / "benchmarks" / "results" / f"{name}.md").is_file()
    assert "AVX-512" in record["machine"] and record["report"]["experts"] == record["report"]["num_experts"]
    assert record["load_average"]["start"] < 1.0  # "idle": the run's own processes only at its start
    prepared = ", the\ndataset's preparation included" if record["dataset_prepared_in_run"] else ""
    assert (
        f"the run took {record['seconds'] / 60:.1f} minutes to its report{prepared} ({record['seconds']:.1f} s, "
        f"{record['date'][:10]}, `python -m benchmarks.flwr_run`"
    ).replace("\n", " ") in readme().replace("\n", " ")
    epyc = timed_rows()[EPYC]
    e_seconds, e_mins = timed(EPYC)
    assert (
        f"on a 2-core AVX2 EPYC {e_mins} minutes ({whole(e_seconds)} s, {epyc[2]}, timed by hand, no result file"
    ) in readme().replace("\n", " ")
    assert "on a 2-core AMD EPYC (AVX2)" in epyc[0] and minutes(e_seconds) == e_mins


# --- the yardstick: the run, its protocol and its commands


def test_the_jsons_intervals_are_the_student_t_intervals_of_its_per_seed_values_paired_by_seed():
    for key, p in points().items():
        pairs = [(p["summary"][m], level(key, m)) for m in METRICS]
        if "minus_baseline" in p:
            pairs += [(p["minus_baseline"][m], diff(key, m)) for m in METRICS]
        for theirs, mine in pairs:
            for field in ("mean", "half", "n"):
                assert math.isclose(theirs[field], mine[field], rel_tol=1e-9, abs_tol=1e-12), (key, field)


def test_the_shared_classifier_and_protocol_are_the_jsons_and_the_configs():
    r, cfg = ftm(), config()
    steps, accuracy = re.search(r"64-d, (\d+) steps, shared by every run .*?, ([\d.]+) on the validation split\)",
                                r["feature_network"]).groups()  # fmt: skip
    seeds, prompts, samples = map(
        int,
        re.fullmatch(
            r"(\d+) seeds; per seed (\d+) held-out prompts × (\d+) samples \(top-2, the config's evaluation steps\) "
            r"and the sample grid \(sampling.prompts × sampling.samples_per_prompt\)",
            r["protocol"],
        ).groups(),
    )
    assert {len(v) for p in points().values() for v in p["per_seed"].values()} == {seeds}
    (scale,) = {points()[k]["cfg_scale"] for k in table_keys()}
    s = cfg.sampling
    assert scale == s.cfg_scale and {len(p["rows_per_prompt"]) for p in points().values()} == {len(s.prompts)}
    assert (
        f"measured by `benchmarks/first_ten_minutes.py` with **one shared feature classifier** "
        f"({num(int(steps), 0, sign=False)} steps; {accuracy} accuracy on the validation split, the ceiling of "
        f"adherence) on **the same prompts and noise**: per seed {prompts} held-out captions × {samples} samples in "
        f"top-2 routing ({cfg.evaluation.num_steps} Euler steps, CFG {scale:g}) for FID, KID and adherence, and the "
        f"samples.png grid ({len(s.prompts)} prompts × {s.samples_per_prompt} samples, {s.num_steps} steps) for "
        f"adherence per row; {seeds} seeds, each a paired comparison with the previous default."
    ) in quality()
    ev = cfg.evaluation
    assert f"each run retrains its feature classifier and scores {ev.num_prompts * ev.samples_per_prompt} samples" in (
        quality()
    )
    assert (RESULTS.parent / "first_ten_minutes.py").is_file()


def test_chance_adherence_is_one_cluster_of_the_configs_experts():
    assert f"(chance {1 / config().num_experts:.3f})" in quality()
    assert {len(p["rows_per_prompt"]) for p in points().values()} == {config().num_experts}


def test_the_commands_of_the_block_parse_and_run_the_jsons_benchmark_with_its_baseline_and_seeds():
    block = raw_from(QUALITY, EARLIER).split("```bash\n", 1)[1].split("```", 1)[0]
    (sets,) = re.findall(r'^SETS="([^"]+)"$', block, flags=re.M)
    (train,) = re.findall(r"^seq 0 (\d+) \| xargs -P (\d+) -I\{\} hddm (train-expert .*) \$SETS$", block, flags=re.M)
    last, jobs, train_args = train
    assert int(last) + 1 == config().num_experts and int(jobs) == 2
    args = build_parser().parse_args([*train_args.replace("{}", "0").split(), *sets.split()])
    assert args.command == "train-expert" and args.threads == 1 and len(args.set) == sets.count("--set ")
    assert "one thread each, two at a time, then `hddm assemble`" in quality()
    (assemble,) = re.findall(r"^hddm (assemble .*) \$SETS$", block, flags=re.M)
    assert build_parser().parse_args([*assemble.split(), *sets.split()]).run_dir == "RUN"
    (bench,) = re.findall(r"^python -m (benchmarks\.first_ten_minutes) --runs (.*) --baseline (\S+) --seeds (\d+)$",
                          block, flags=re.M)  # fmt: skip
    module, runs, base, seeds = bench
    assert ftm()["command"].split(" --runs ")[0].replace("/", ".").removesuffix(".py").endswith(module)
    assert runs.split()[0].split("=")[0] == base  # the baseline is the first run, as in the json's command
    (their_base,) = re.findall(r"--baseline (\S+)", ftm()["command"])
    assert ftm()["command"].split(" --runs ")[1].split()[0].split("=")[0] == their_base
    assert their_base == points()[baseline()]["name"]
    assert int(seeds) == len(points()[baseline()]["per_seed"]["fid"])


# --- the yardstick table


def test_the_yardstick_tables_rows_are_the_jsons_runs_at_its_cfg_scale_but_the_cli_retraining():
    rows = quality_rows()
    assert len(rows) == len(table_keys())
    need(commit(PREVIOUS))
    previous = config_at(commit(PREVIOUS))
    labels = [re.sub(r"(at batch \d+) \([^)]*\)", r"\1", r[0]) for r in rows]
    assert labels == [quality_label(k, previous, config()) for k in table_keys()]
    assert settings(cli(), previous, config()) == settings(current(), previous, config())  # the same default


@pytest.mark.parametrize("row", range(6))
def test_each_yardstick_row_is_its_runs_intervals_and_its_paired_differences_from_the_previous_default(row):
    key, cells = table_keys()[row], quality_rows()[row][1:]
    assert cells[:4] == [level_cell(level(key, m), DIGITS[m]) for m in METRICS]
    if key == baseline():
        assert cells[4:] == ["—"] * 3
    else:
        assert cells[4:] == [diff_cell(diff(key, m), DIGITS[m]) for m in ("fid", "adherence", "adherence_rows")]


def test_the_table_pairs_by_seed_against_the_previous_default():
    assert points()[baseline()]["name"] == "previous-default" and table_keys()[0] == baseline()
    assert (
        "Δ: paired by seed, run − previous default (an interval that excludes 0 is a resolved difference)." in quality()
    )


@pytest.mark.parametrize(
    "phrase",
    [
        "row",
        "prose",
    ],
)
def test_the_batch_16_run_spends_the_compute_the_doc_says(phrase):
    now = config()
    (key,) = [k for k in table_keys() if re.search(r"batch(\d+)-", points()[k]["name"])]
    batch = int(re.search(r"batch(\d+)-", points()[key]["name"]).group(1))
    images = batch * points()[key]["expert_steps"]
    default = now.expert.batch_size * points()[current()]["expert_steps"]
    share = "same compute" if images == default else f"{100 * images / default:.0f} % of the compute"
    steps = points()[key]["expert_steps"]
    if phrase == "row":
        assert f"{steps} steps at batch {batch} ({share})" in [r[0] for r in quality_rows()][table_keys().index(key)]
    else:
        assert f"{share[0].upper()}{share[1:]} spent as {steps} steps at batch {batch} (" in quality()


def test_the_timed_run_and_its_cli_retraining_score_the_same_to_the_last_digit_of_the_md():
    a, b = points()[current()], points()[cli()]
    assert max(abs(x - y) for x, y in zip(a["ensemble_velocity_mse"], b["ensemble_velocity_mse"], strict=True)) < 1e-7
    assert "the timed run's experts give the same held-out velocity MSE to 10⁻⁷ and the same metrics below" in quality()
    levels = md_rows("| run | expert steps | CFG |")
    assert levels[current()] == levels[cli()]
    assert levels[current()][2:6] == [
        f"{level_cell(level(current(), m), 2 if m in ('fid', 'kid') else 3)}" for m in METRICS
    ]
    assert levels[current()][6] == " / ".join(f"{v:.3f}" for v in a["ensemble_velocity_mse"])
    diffs = md_rows("| run − baseline | FID | KID |")
    assert diffs[f"{current()} − {baseline()}"] == diffs[f"{cli()} − {baseline()}"]
    assert diffs[f"{current()} − {baseline()}"][1] == diff_cell(diff(current(), "kid"), 2)  # the KID differences
    assert (
        "The current default trained by `hddm train-expert` + `hddm assemble` scores the same to the last digit as "
        "the timed `flwr run .` (both rows in `benchmarks/results/first_ten_minutes.md`, with KID differences and "
        "the held-out velocity MSE of every report)."
    ) in quality()


def test_the_yardsticks_timed_run_is_the_current_defaults_first_timed_run_by_the_benchmarks_date():
    commits = [r[1] for r in timed_rows()]
    need(*commits)
    ran = datetime.strptime(ftm()["date"], "%Y-%m-%d %H:%M UTC").replace(tzinfo=UTC).timestamp()

    def committed(c: str) -> int:
        return int(git("log", "-1", "--format=%ct", c).stdout)

    assert committed(commit(CURRENT)) <= ran < committed(commit(PLAIN))  # the 9.9-minute run, not the 8.9-minute one
    assert "the current default reaches its report in" in quality()


# --- what it shows


def test_fid_and_kid_of_the_current_default_are_resolved_better_and_lower_on_every_seed():
    cur, prev = points()[current()]["per_seed"], points()[baseline()]["per_seed"]
    for m in ("fid", "kid"):
        assert resolved(diff(current(), m)) and diff(current(), m)["mean"] < 0
        assert all(a < b for a, b in zip(cur[m], prev[m], strict=True)), m
    f1, f0 = (level(k, "fid") for k in (current(), baseline()))
    k1, k0 = (level(k, "kid") for k in (current(), baseline()))
    assert (
        f"its samples are better by FID and KID, resolved and lower on every seed (FID {num(f1['mean'], 1, sign=False)} "
        f"against {num(f0['mean'], 1, sign=False)}, KID {num(k1['mean'], 1, sign=False)} against "
        f"{num(k0['mean'], 1, sign=False)};"
    ) in quality()


def test_the_reports_held_out_velocity_mse_is_lower_from_the_second_time_on_and_higher_at_the_first():
    cur, prev = points()[current()], points()[baseline()]
    assert cur["times"] == prev["times"]
    d = [a - b for a, b in zip(cur["ensemble_velocity_mse"], prev["ensemble_velocity_mse"], strict=True)]
    assert d[0] > 0 and all(x < 0 for x in d[1:])
    t = cur["times"]
    assert (
        f"the held-out velocity MSE of its report is lower at t ≥ {t[1]:g} and {num(d[0], 2, sign=False)} higher at "
        f"t = {t[0]:g})"
    ) in quality()


def test_the_current_defaults_adherence_is_not_resolved_one_point_estimate_below_one_above():
    held, rows = diff(current(), "adherence"), diff(current(), "adherence_rows")
    assert not resolved(held) and not resolved(rows)
    assert held["mean"] < 0 < rows["mean"]
    assert (
        f"Its adherence is not resolved from the previous default's: {shown(held, 3)} on the held-out prompts and "
        f"{shown(rows, 3)} on the grid's rows (point estimates one below, one above)."
    ) in quality()


def test_the_partial_combinations_at_460_steps_lose_resolved_held_out_adherence_and_all_three_together_none():
    losses = {name: diff(key_of(name), "adherence") for name in PARTIAL}
    assert all(resolved(x) and x["mean"] < 0 for x in losses.values())
    assert {points()[key_of(n)]["expert_steps"] for n in PARTIAL} == {config().expert.steps}
    resolved_losses = [
        -diff(k, "adherence")["mean"]
        for k in table_keys()
        if k != baseline() and resolved(diff(k, "adherence")) and diff(k, "adherence")["mean"] < 0
    ]
    assert sorted(resolved_losses) == sorted(-x["mean"] for x in losses.values())  # found in those three only
    listed = ", ".join(f"{PARTIAL[n]} ({shown(x, 3)})" for n, x in losses.items())
    assert (
        f"The same protocol does resolve adherence losses of {min(resolved_losses):.2f}–{max(resolved_losses):.2f}, "
        f"and finds them in the partial combinations at {config().expert.steps} steps: {listed}; only all three "
        "together leave no resolved loss."
    ) in quality()
    assert not any(resolved(diff(current(), m)) and diff(current(), m)["mean"] < 0 for m in METRICS[2:])


def test_the_batch_16_runs_adherence_difference_and_fid_are_the_jsons():
    (key,) = [k for k in table_keys() if points()[k]["name"].startswith("batch")]
    held, fid = diff(key, "adherence"), level(key, "fid")
    assert not resolved(held)
    assert f"gives adherence {shown(held, 3)} and FID {num(fid['mean'], 1, sign=False)}, both point estimates" in (
        quality()
    )


def test_the_batch_16_runs_point_estimates_stand_where_the_doc_says_against_the_current_defaults():
    (key,) = [k for k in table_keys() if points()[k]["name"].startswith("batch")]
    adherence_lower = diff(key, "adherence")["mean"] < diff(current(), "adherence")["mean"]
    fid_lower = level(key, "fid")["mean"] < level(current(), "fid")["mean"]
    # lower adherence is worse, lower FID better: "below" holds if both are lower, "worse than" if FID is higher
    word = {(True, True): "below", (True, False): "worse than", (False, False): "above"}.get(
        (adherence_lower, fid_lower)
    )
    assert word, "one better, one worse"
    assert f"both point estimates {word} the current default's." in quality()


def test_the_cfg_scale_does_not_buy_adherence_on_the_same_seeds_of_the_same_run():
    base = key_of("ema+logit-normal")
    same = [k for k, p in points().items() if p["run_dir"] == points()[base]["run_dir"]]
    assert same[0] == base and len(same) == 3
    for k in same[1:]:
        gain = diff(k, "adherence", against=base)
        assert gain["mean"] < 0 and level(k, "adherence")["mean"] < level(base, "adherence")["mean"], k
    seeds = {len(points()[k]["per_seed"]["adherence"]) for k in same}
    (n,) = seeds
    held = [level(k, "adherence")["mean"] for k in same]
    scales = [points()[k]["cfg_scale"] for k in same]
    fid = [level(k, "fid")["mean"] for k in same]
    assert (
        f"The CFG scale does not buy adherence either (the EMA + logit-normal run, same {n} seeds): "
        f"{held[0]:.3f} at {scales[0]:g}, {held[1]:.3f} at {scales[1]:g} and {held[2]:.3f} at {scales[2]:g} on the "
        f"held-out prompts; FID {fid[0]:.1f}, {fid[1]:.1f} and {fid[2]:.1f} (all points in "
        "`benchmarks/results/first_ten_minutes.md`)."
    ) in quality()
    assert set(same) <= set(md_rows("| run | expert steps | CFG |"))


def test_what_is_left_one_training_per_candidate_and_differences_below_005_beyond_the_seeds_and_samples():
    trainings = {}
    for p in points().values():
        trainings.setdefault(p["run_dir"], set()).add(p["name"].split(",cfg")[0])
    assert all(len(names) == 1 for names in trainings.values())  # one training per candidate, one run per training
    r = ftm()
    seeds, prompts, samples = map(
        int, re.match(r"(\d+) seeds; per seed (\d+) held-out prompts × (\d+)", r["protocol"]).groups()
    )
    held = [diff(k, "adherence") for k, p in points().items() if "minus_baseline" in p]
    assert (
        max(abs(x["mean"]) for x in held if not resolved(x)) < 0.05 <= min(abs(x["mean"]) for x in held if resolved(x))
    )
    assert (
        "Left: one training per candidate (the intervals cover sampling seeds, not training seeds), and adherence "
        f"differences below about 0.05 are beyond {seeds} seeds × {prompts * samples} samples."
    ) in quality()


def test_the_samples_png_is_drawn_with_the_configs_grid_settings():
    s = config().sampling
    assert s.routing == "top_k" and s.top_k == 2
    assert (
        f"samples.png of the current default's timed run ({s.num_steps} steps, CFG {s.cfg_scale:g}, top-{s.top_k}; "
        "rows as in [Samples](#samples)):"
    ) in quality()


# --- earlier candidates


def test_earlier_candidates_were_scored_by_the_previous_defaults_own_report_protocol():
    need(commit(PREVIOUS))
    ev, s = config_at(commit(PREVIOUS)).evaluation, config_at(commit(PREVIOUS)).sampling
    assert (
        f"(the run's own classifier, {ev.num_prompts} held-out prompts × {ev.samples_per_prompt} samples, CFG "
        f"{s.cfg_scale:g})"
    ) in earlier()


def test_the_500_step_cosine_candidates_seconds_are_performance_mds_timing_of_the_same_settings():
    perf = re.sub(r"\s+", " ", (ROOT / "docs" / "performance.md").read_text())
    (overrides,) = re.findall(r'`overrides="(expert\.steps=500 [^"]+)"`', perf)
    o = parse_overrides(overrides)
    cfg = load_config(CONFIG, o)
    assert cfg.expert.optim.schedule == "cosine" and cfg.expert.ema_decay > 0
    (plain,) = re.findall(
        r"\| `flwr run \. --stream` \| 2 × 4 \(one Ray actor\) \| [^|]+ \| \*\*([\d.]+) s\*\* \|", perf
    )
    assert (
        f"{cfg.expert.steps} steps with a cosine learning-rate decay and EMA ({whole(plain)} s) scored adherence"
    ) in earlier()
