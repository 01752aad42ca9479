"""Claims in docs/results.md checked against the committed results: what the GMM evidence set costs and where the
training time goes (from the table "| set | machine | date | wall (the ladder alone) | …" to the bullet "- Not shown:
a `hddm reproduce` rung above 3,200"). Every number of the passage that a committed file holds is recomputed from
``benchmarks/results/`` — the two sets' cost files (``gmm_ladder_cost.json``, the AVX-512 set of 2026-12-05, and
``gmm_ladder_cost-2026-12-04.json``, the AVX2 set; ``gmm_ladder_cost-2026-12-02.json``, the runs by hand of
2026-12-02), the two ``gmm_train_step`` files, ``freed_memory.json`` and the
committed ``hddm reproduce`` manifests — and written as the doc writes it (thousands with a comma, the unicode minus),
then looked up in the passage with its whitespace folded; so a rerun that moves a number, or an edit that moves the
text away from the files, fails here."""

import re
import statistics
from pathlib import Path

from . import doc_claims
from .doc_claims import RESULTS, iv, load, num

START = "| set | machine | date | wall (the ladder alone) | es-800 · ei-800 · es-3200 · ei-3200 · colour, s |"
END = "- Not shown: each side's best learning rate over more than three trainings"

AVX512 = "gmm_ladder_cost.json"  # the set of 2026-12-05
AVX2 = "gmm_ladder_cost-2026-12-04.json"
BY_HAND = "gmm_ladder_cost-2026-12-02.json"  # the same five runs by hand, vector unit not recorded
STEP_AVX512 = "gmm_train_step.json"
STEP_AVX2 = "gmm_train_step-2026-12-04.json"
LADDER = ("es-800", "ei-800", "es-3200", "ei-3200")  # the ladder alone: the set without the colour variant
ES_800_MANIFEST = "reproduce-gmm-subspace-800-text-manifest.json"  # the 2026-12-02 set's es-800 run


def raw_passage() -> str:
    return doc_claims.raw_passage(START, END)


def passage() -> str:
    return doc_claims.passage(START, END)


def runs(name: str) -> dict[str, dict]:
    """A cost file's runs by label, in the file's order."""
    return {r["label"]: r for r in load(name)["runs"]}


def seconds(x: float) -> str:
    return num(x, 0, sign=False)


def minutes(s: float) -> str:
    return f"{s / 60:.1f}"


def ratio(x: float) -> str:
    return f"{x:.2f}"


def span(xs) -> str:
    xs = list(xs)
    return f"{min(xs):.2f}–{max(xs):.2f}"


def percent(x: float) -> str:
    return f"{100 * x:.0f}"


def small(x: float) -> str:
    """A largest difference as the passage writes it: 0; below 10⁻³ one digit times a power of ten (2×10⁻¹³); below
    0.01 one significant digit; below 1 two decimals; else three significant digits."""
    if x == 0:
        return "0"
    if x < 1e-3:
        mantissa, exponent = f"{x:.0e}".split("e")
        return f"{mantissa}×10{str(int(exponent)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"
    if x < 0.01:
        return f"{x:.1g}"
    if x < 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def table() -> tuple[list[str], dict[str, list[str]]]:
    """The passage's table: its header's cells, and each row's cells by its date."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in raw_passage().splitlines()
        if line.strip().startswith("|") and not line.strip().startswith("|---")
    ]
    return rows[0], {r[2]: r for r in rows[1:]}


def ladder_seconds(name: str) -> float:
    return sum(runs(name)[label]["seconds"] for label in LADDER)


def load_range(name: str) -> str:
    """The one-minute load averages at every run's start and end, lowest to highest, one decimal."""
    loads = [r["load_average"][when][0] for r in runs(name).values() for when in ("start", "end")]
    return f"{min(loads):.1f}–{max(loads):.1f}"


def compile_ratios(name: str) -> list[float]:
    return [r["compiled_ms"] / r["eager_ms"] for r in load(name)["repetitions"]]


def medians_ratio(name: str, a: str, b: str) -> float:
    m = load(name)["median"]
    return m[a] / m[b]


def kernel_ratio(where: str, kernel: str) -> float:
    k = load(STEP_AVX512)["kernels_ms"][where]
    return k[kernel] / k["as trained"]


def test_the_passage_and_its_table_of_three_sets_are_in_the_doc():
    assert passage().startswith(START) and "Where the training time goes" in passage()
    header, rows = table()
    assert header[4] == "es-800 · ei-800 · es-3200 · ei-3200 · colour, s"
    assert set(rows) == {"2026-12-05", "2026-12-04", "2026-12-02"}
    for name in (AVX512, AVX2):  # the column order is each cost file's
        assert tuple(runs(name)) == (*LADDER, "colour") == tuple(header[4].removesuffix(", s").split(" · "))


def test_each_committed_sets_row_is_its_cost_files_machine_date_wall_ladder_and_seconds_of_each_run():
    _, rows = table()
    for name in (AVX512, AVX2):
        cost = load(name)
        cells = rows[cost["date"][:10]]
        unit, cores, memory = re.fullmatch(r"AMD EPYC \((.+)\), (\d+) cores, (\d+) GiB RAM", cost["machine"]).groups()
        assert cells[1] == (
            f"{cores}-core AMD EPYC ({unit}), {memory} GiB, idle but for the runs' own processes "
            f"(load {load_range(name)})"
        )
        assert round(sum(r["seconds"] for r in cost["runs"]), 1) == cost["total_seconds"]
        assert cells[3] == f"**{minutes(cost['total_seconds'])} min** ({minutes(ladder_seconds(name))})"
        assert cells[4] == " · ".join(seconds(r["seconds"]) for r in cost["runs"])
    by_hand, cells = load(BY_HAND), rows["2026-12-02"]
    assert cells[0].startswith("the same five runs by hand") and by_hand["date"].startswith("2026-12-02")
    assert cells[1].endswith(f", 24 GiB, idle (load {load_range(BY_HAND)})") and "24 GiB" in by_hand["machine"]
    assert cells[3] == f"{minutes(by_hand['total_seconds'])} min ({minutes(ladder_seconds(BY_HAND))})"
    assert cells[4] == " · ".join(seconds(r["seconds"]) for r in by_hand["runs"])
    assert tuple(runs(BY_HAND)) == (*LADDER, "colour")
    # "its differences from the committed manifests are the AVX-512 set's"
    assert {k: r.get("against") for k, r in runs(BY_HAND).items()} == {
        k: r.get("against") for k, r in runs(AVX512).items() if k != "es-800"
    } | {"es-800": None}


def test_the_set_fits_the_60_minute_goal_on_the_avx512_machine_not_the_avx2_one_and_the_ladder_alone_on_both():
    fast, slow, by_hand = (load(name)["total_seconds"] for name in (AVX512, AVX2, BY_HAND))
    assert fast < 3600 < min(slow, by_hand)
    assert max(ladder_seconds(name) for name in (AVX512, AVX2, BY_HAND)) < 3600
    assert (
        "**The set fits the 60-minute goal on one of the three machines measured "
        f"({minutes(fast)} min on the AVX-512 one), not on the AVX2 one ({minutes(slow)} min) nor on the 2026-12-02 "
        f"one ({minutes(by_hand)})**"
    ) in passage()
    assert f"the 2026-12-02 machine computed the same bits as the AVX-512 one and took {minutes(by_hand)} minutes" in (
        passage()
    )
    assert "**; the ladder alone fits it on all three." in passage()


def test_the_first_two_sets_are_the_same_command_with_the_same_settings():
    fast, slow = runs(AVX512), runs(AVX2)
    assert load(AVX512)["command"] == load(AVX2)["command"]
    for label in fast:
        assert fast[label]["command"] == slow[label]["command"]
        assert fast[label]["budget"] == slow[label]["budget"]
    _, rows = table()
    assert rows["2026-12-05"][0].split(" (commit")[0] == rows["2026-12-04"][0].split(" (commit")[0]
    assert "The first two sets are the same command with the same settings" in passage()


def test_the_machines_ratio_is_the_two_sets_wall_times_and_its_range_by_run():
    fast, slow = runs(AVX512), runs(AVX2)
    whole = load(AVX512)["total_seconds"] / load(AVX2)["total_seconds"]
    by_run = [fast[label]["seconds"] / slow[label]["seconds"] for label in fast]
    assert f"so their {ratio(whole)}× (by run {span(by_run)}×) is the machine" in passage()


def test_the_avx512_training_step_is_its_eager_median_over_the_avx2_ones_measured_with_the_other_core_busy():
    r = load(STEP_AVX512)["median"]["eager_ms"] / load(STEP_AVX2)["median"]["eager_ms"]
    assert f"its training step is {ratio(r)}× the AVX2 one's (`gmm_train_step`, below; the AVX2 figure" in passage()
    busy = float(re.fullmatch(r"load ([\d.]+) at start", load(STEP_AVX2)["load_at_start"]).group(1))
    idle = float(re.fullmatch(r"load ([\d.]+) at start", load(STEP_AVX512)["load_at_start"]).group(1))
    assert idle < 1 < busy, "of two cores, one busy at the AVX2 run's start"
    assert "measured with the other core busy" in passage()


def test_es_800_took_its_committed_manifests_seconds_on_the_2026_12_02_machine_and_the_same_bits_as_avx512():
    m, fast = load(ES_800_MANIFEST), runs(AVX512)["es-800"]
    assert m["created_at"].startswith("2026-12-02") and m["command"].endswith("--jobs 2")
    assert m["command"].replace("/work/runs/es-800-text", "DIR") == fast["command"].replace(
        "/work/runs/set/es-800", "DIR"
    )
    assert fast["against"]["file"].endswith(ES_800_MANIFEST)
    assert fast["against"]["largest_difference"] == 0.0  # "computed the same bits as the AVX-512 one"
    assert (
        f"(es-800, run alike in both but for the malloc setting: {seconds(m['seconds'])} s against "
        f"{seconds(fast['seconds'])})"
    ) in passage()


def test_the_avx2_sets_training_and_evaluation_seconds_against_the_runs_by_hand_are_their_cost_files():
    slow, by_hand = runs(AVX2), runs(BY_HAND)
    t = {label: slow[label]["timings_s"]["training"] / by_hand[label]["timings_s"]["training"] for label in slow}
    assert (
        f"(es-3200: {seconds(slow['es-3200']['timings_s']['training'])} s against "
        f"{seconds(by_hand['es-3200']['timings_s']['training'])} s; by run {span(t.values())}×)"
    ) in passage()
    ev = {
        label: (seconds(slow[label]["timings_s"]["evaluation"]), seconds(by_hand[label]["timings_s"]["evaluation"]))
        for label in slow
    }
    assert (
        f"evaluation took about the same time there (es-3200 {ev['es-3200'][0]} against {ev['es-3200'][1]} s, "
        f"es-800 {ev['es-800'][0]} against {ev['es-800'][1]}, colour {ev['colour'][0]} against {ev['colour'][1]})"
    ) in passage()
    # the es-800 run by hand is the committed manifest's
    assert by_hand["es-800"]["timings_s"]["evaluation"] == load(ES_800_MANIFEST)["timings_s"]["evaluation"]


def test_keep_freed_memory_on_an_experts_forward_passes_is_freed_memorys_median_ratio_and_range_with_the_same_bits():
    f = load("freed_memory.json")
    reps = f["reps"]
    ratios = [r["kept"]["ms_per_forward"] / r["default"]["ms_per_forward"] for r in reps]
    assert statistics.median(ratios) == f["ratio_kept_over_default"]
    assert len(reps) == f["args"]["reps"]
    kept, default = (
        {k: statistics.median(r[arm][k] for r in reps) for k in ("sys_s", "minor_faults")}
        for arm in ("kept", "default")
    )
    assert round(kept["sys_s"], 2) == 0 < default["sys_s"]  # "the kernel time … to about zero"
    assert kept["minor_faults"] < 0.05 * default["minor_faults"]  # "and page faults"
    assert f["outputs_identical"] and len({r[arm]["outputs_sha256"] for r in reps for arm in r}) == 1
    assert (
        f"on an expert's forward passes at batch {f['args']['batch']} it takes the kernel time and page faults to "
        f"about zero and the wall time to a median {ratio(f['ratio_kept_over_default'])}× over {len(reps)} "
        f"repetitions, {span(ratios)} by repetition, with the same bits: `benchmarks/results/freed_memory.md`"
    ) in passage()


def test_an_equal_images_rung_adopts_experts_routers_and_all_rows_but_its_monoliths_and_es_3200_the_routers():
    for name in (AVX512, AVX2):
        r = runs(name)
        for label in ("ei-800", "ei-3200"):
            ei = r[label]
            assert ei["experts_adopted"] == ei["experts"] and ei["routers_adopted"] == ei["trainings"]
            assert ei["monoliths_adopted"] == 0 and ei["rows_reused"] == ei["rows"] - 1
            assert (
                f"An equal-images rung adopts all {ei['experts']} experts and {ei['routers_adopted']} routers and "
                f"{ei['rows_reused']} of its {ei['rows']} rows and trains and samples only its monoliths"
            ) in passage()
        es = r["es-3200"]
        assert "--reuse /work/runs/set/es-800 " in es["command"]
        assert es["experts_adopted"] == es["monoliths_adopted"] == 0 and es["routers_adopted"] == es["trainings"]
        assert f"the 3,200 equal-steps rung adopts the routers and the {es['rows_reused']} rows" in passage()
        assert f"es-3200, which adopts es-800's routers and {es['rows_reused']} rows" in passage()


def test_without_reuse_the_four_rungs_took_their_committed_manifests_minutes():
    names = ("800", "3200", "ei-800-text", "ei-3200-text")  # text-free equal steps, prompt-aware equal images
    ms = [load(f"reproduce-gmm-subspace-{n}-manifest.json") for n in names]
    for m, protocol, text in zip(ms, ("equal_steps",) * 2 + ("equal_images",) * 2, (False, False, True, True)):
        assert m["budget"]["protocol"] == protocol and (m["config"]["router"]["conditioning"] == "text") == text
        assert "--reuse" not in m["command"] and not m.get("reused_from")
    total = sum(m["seconds"] for m in ms) / 60
    assert (
        f"took {' + '.join(minutes(m['seconds']) for m in ms)} = {total:.0f} minutes on shared machines"
    ) in passage()


def test_the_committed_es_3200_manifest_ran_without_reuse_on_the_text_free_runs_artefacts_and_the_avx2_set_repeats_it():
    es, text_free = (load(f"reproduce-gmm-subspace-{n}-manifest.json")["artefacts"] for n in ("3200-text", "3200"))
    assert "--reuse" not in load("reproduce-gmm-subspace-3200-text-manifest.json")["command"]
    for mine, theirs in zip(es["trainings"], text_free["trainings"], strict=True):
        assert mine["monolith"]["reused"] and mine["monolith"]["tensor_sha256"] == theirs["monolith"]["tensor_sha256"]
        for k, e in mine["experts"].items():
            assert e["reused"] and e["tensor_sha256"] == theirs["experts"][k]["tensor_sha256"]
    against = runs(AVX2)["es-3200"]["against"]
    assert against["file"].endswith("reproduce-gmm-subspace-3200-text-manifest.json")
    assert against["largest_difference"] == against["largest_delta_log_density_difference"] == 0.0
    assert (
        "repeated its committed manifest (a run without `--reuse`, whose experts and monoliths came from the text-free "
        "3,200-step run) to the bit in the AVX2 set"
    ) in passage()


def differences(name: str, notes: dict[str, str] | None = None) -> str:
    """Each run's largest difference of any metric from its committed manifest, Δ log p's in brackets (and a note
    after it), as the passage lists them."""
    return ", ".join(
        f"{label} {small(r['against']['largest_difference'])} "
        f"({small(r['against']['largest_delta_log_density_difference'])}{(notes or {}).get(label, '')})"
        for label, r in runs(name).items()
    )


def test_the_largest_differences_from_the_committed_manifests_are_each_cost_files_by_machine():
    for r in (*runs(AVX512).values(), *runs(AVX2).values()):
        assert (RESULTS / Path(r["against"]["file"]).name).is_file()
    ei = runs(AVX2)["ei-3200"]
    assert ei["against"]["where"].startswith("monolith (equal compute), ")
    assert ei["against"]["where_delta_log_density"].startswith("monolith (equal compute), ")
    committed = next(
        e["delta_log_density"]
        for e in load("reproduce-gmm-subspace-ei-3200-text-manifest.json")["paired"]
        if e["what"] == "8FM: top2 − monolith"
    )
    note = (
        f", both in the {num(ei['budget']['monolith_steps'], 0, sign=False)}-step monolith, whose committed 8FM "
        f"top-2 − monolith is {iv(committed, 1)}"
    )
    assert (
        f"on the AVX-512 machine: {differences(AVX512)}; on the AVX2 machine: {differences(AVX2, {'ei-3200': note})}."
    ) in passage()


def test_the_committed_es_3200_holds_avx2_arithmetic_and_three_of_the_other_four_repeat_on_avx512_to_the_bit():
    fast, slow = runs(AVX512), runs(AVX2)
    assert slow["es-3200"]["against"]["largest_difference"] == 0 < fast["es-3200"]["against"]["largest_difference"]
    others = [label for label in fast if label != "es-3200"]
    assert [label for label in others if fast[label]["against"]["largest_difference"] == 0] == [
        "es-800",
        "ei-800",
        "ei-3200",
    ]
    colour = small(fast["colour"]["against"]["largest_difference"])
    assert (
        "So the committed es-3200 manifest holds AVX2 arithmetic; three of the other four repeat on the AVX-512 "
        f"machine to the bit and colour to {colour}."
    ) in passage()


def test_the_committed_ei_3200_holds_its_shared_rows_apart_from_the_committed_es_3200_by_the_avx512_difference():
    from benchmarks.gmm_ladder_cost import largest_difference

    es, ei = (load(f"reproduce-gmm-subspace-{r}-text-manifest.json") for r in ("3200", "ei-3200"))
    assert "--reuse" not in ei["command"] and ei["seeds"] == es["seeds"]
    assert ei["config"]["router"] == es["config"]["router"]
    shared = sorted(set(es["results"]) & set(ei["results"]) - {"monolith (equal compute)"})
    assert set(ei["results"]) - set(shared) == {"monolith (equal compute)"}
    a, b = ({"results": {k: m["results"][k] for k in shared}} for m in (es, ei))
    (worst, where), (worst_dlp, where_dlp) = largest_difference(a, b), largest_difference(a, b, "delta_log_density")
    against = runs(AVX512)["es-3200"]["against"]
    assert (against["largest_difference"], against["largest_delta_log_density_difference"]) == (worst, worst_dlp)
    assert all(w.startswith("8FM ") and " · top1 · " in w for w in (where, where_dlp))
    for t in ei["artefacts"]["trainings"]:  # "a run of its own": it trains its experts and routers
        assert not any(e["reused"] for e in t["experts"].values()) and not t["router"].get("reused")
    assert (
        "The committed ei-3200, a run of its own without `--reuse` that trains the same experts and routers (the same "
        f"configuration and seeds) and computes the same {len(shared)} rows besides its monolith's, holds those rows "
        f"as the AVX-512 arithmetic computes them: apart from the committed es-3200's by the same {small(worst)} "
        f"({small(worst_dlp)} nats of Δ log p, in 8FM top-1 rows;"
    ) in passage()


def test_the_exact_rows_of_the_two_committed_3200_step_manifests_are_apart_by_float_rounding_alone():
    from benchmarks.gmm_ladder_cost import largest_difference

    es, ei = (load(f"reproduce-gmm-subspace-{r}-text-manifest.json") for r in ("3200", "ei-3200"))
    exact = [k for k in es["results"] if k.startswith("exact ") and "trained router" not in k]  # they train nothing
    a, b = ({"results": {k: m["results"][k] for k in exact}} for m in (es, ei))
    worst, _ = largest_difference(a, b, "delta_log_density")
    assert 0 < worst < runs(AVX512)["es-3200"]["against"]["largest_delta_log_density_difference"]
    assert (
        f"finds the exact rows, which train nothing, already apart by up to {small(worst)} nats of Δ log p: the "
        "arithmetic differs, and training amplifies it."
    ) in passage()


def test_the_result_files_the_passage_names_are_committed():
    names = re.findall(r"`(?:benchmarks/results/)?([\w.-]+?)\.(md|json|\{md,json\})`", passage())
    assert len(names) >= 5
    for stem, ext in names:
        for e in ("md", "json") if ext == "{md,json}" else (ext,):
            assert (RESULTS / f"{stem}.{e}").is_file(), f"{stem}.{e}"


def test_the_training_step_files_are_the_machines_dates_and_shapes_the_passage_names():
    fast, slow = load(STEP_AVX512), load(STEP_AVX2)
    assert "AVX-512" in fast["machine"] and "1 torch thread" in fast["machine"] and "AVX2" in slow["machine"]
    assert (
        f"(`python -m benchmarks.gmm_train_step`, the AVX-512 machine, idle, one torch thread; {fast['date']}; "
        f"`benchmarks/results/gmm_train_step.{{md,json}}`; the AVX2 machine's run of {slow['date']}, its other core "
        f"busy, in `gmm_train_step-{slow['date']}.{{md,json}}`)"
    ) in passage()
    assert (
        f"one optimiser step of a `{fast['shapes']['preset']}` expert at batch {fast['shapes']['batch']}" in passage()
    )


def test_one_eager_step_is_its_median_and_its_matmul_flops_and_rate():
    fast, slow = load(STEP_AVX512), load(STEP_AVX2)
    md = (RESULTS / "gmm_train_step.md").read_text()
    reps, steps = re.search(r"Medians over (\d+) repetitions \((\d+) steps each", md).groups()
    assert int(reps) == len(fast["repetitions"])
    for s in (fast, slow):
        assert s["median"]["eager_ms"] == statistics.median(r["eager_ms"] for r in s["repetitions"])
    gflop = fast["matmul_gflop_per_step"]
    assert abs(gflop / fast["median"]["eager_ms"] * 1e3 - fast["gflop_per_s_eager"]) < 1e-9
    assert (
        f"takes {fast['median']['eager_ms']:.1f} ms eager (median of {reps} × {steps} steps; "
        f"{slow['median']['eager_ms']:.1f} ms on the AVX2 machine) for {gflop:.3f} GFLOP of matmuls "
        f"({fast['gflop_per_s_eager']:.1f} GFLOP/s, far below what a core can do)"
    ) in passage()


def test_the_compiled_step_is_its_median_and_its_ratio_to_eager_by_repetition_on_both_machines():
    fast = load(STEP_AVX512)
    assert (
        f"with its transformer under `torch.compile` {fast['median']['compiled_ms']:.1f} ms "
        f"({span(compile_ratios(STEP_AVX512))}× by repetition, interleaved with the eager arm; "
        f"{span(compile_ratios(STEP_AVX2))}× on the AVX2 machine)"
    ) in passage()


def test_the_vmapped_experts_take_as_long_as_one_after_another():
    fast = load(STEP_AVX512)
    by_rep = [r["vmap_ms"] / r["one_after_another_ms"] for r in fast["repetitions"]]
    assert min(by_rep) < 1 < max(by_rep)  # "as long as": neither is faster in every repetition
    assert (
        f"the {fast['shapes']['num_experts']} experts' forward + backward as one vmapped model take as long as one "
        f"after another ({fast['median']['vmap_ms']:.1f} against {fast['median']['one_after_another_ms']:.1f} ms; "
        f"{span(by_rep)}× by repetition)"
    ) in passage()


def test_no_operator_dominates_the_eager_step_and_its_shares_are_the_profilers():
    ops = load(STEP_AVX512)["top_ops_eager"]
    share = {
        kind: sum(o["share"] for o in ops if test(o["op"]))
        for kind, test in (
            ("matmuls", lambda op: op in ("aten::mm", "aten::addmm")),
            ("attention", lambda op: "attention" in op),
            ("GELU", lambda op: "gelu" in op),
        )
    }
    assert max(o["share"] for o in ops) < 0.25
    assert (
        f"No operator dominates the eager step (matmuls {percent(share['matmuls'])} % of its CPU time, attention "
        f"{percent(share['attention'])} %, GELU {percent(share['GELU'])} %, the rest many small operators)"
    ) in passage()


def test_the_two_kernel_swaps_are_kernels_ms_over_the_kernels_the_experts_train_with():
    fast = load(STEP_AVX512)
    where = list(fast["kernels_ms"])
    assert where == ["train_batch_32", "train_batch_256", "forward_batch_704"]
    b32, b256, b704 = (w.rsplit("_", 1)[1] for w in where)
    assert int(b256) == runs(AVX512)["es-800"]["budget"]["monolith_batch"]
    assert int(b704) == load("freed_memory.json")["args"]["batch"]  # the evaluation's batch
    attention = [ratio(kernel_ratio(w, "math attention")) for w in where]
    gelu = [kernel_ratio(w, "exact GELU") for w in where]
    assert f"(`kernels_ms`, medians of {len(fast['repetitions'])} interleaved repetitions)" in passage()
    assert (
        f"takes a training step to {attention[0]}× at batch {b32} and {attention[1]}× at the monolith's batch {b256}, "
        f"a forward pass at the evaluation's batch {b704} to {attention[2]}×; the exact (erf) GELU to "
        f"{ratio(gelu[0])}×, {ratio(gelu[1])}× and {ratio(gelu[2])}× — a {percent(1 - gelu[1])}–{percent(1 - gelu[2])} % "
        "gain at the large batches"
    ) in passage()


def test_compiling_on_the_medians_is_the_largest_lever_measured():
    compiled = medians_ratio(STEP_AVX512, "compiled_ms", "eager_ms")
    swaps = [v / k["as trained"] for k in load(STEP_AVX512)["kernels_ms"].values() for v in k.values()]
    assert compiled < min(swaps)
    assert f"Compiling ({ratio(compiled)}× on the medians) is the largest lever measured" in passage()


def test_training_and_evaluation_are_the_avx512_sets_timings_and_compiling_would_not_bring_the_avx2_set_under_60():
    fast, slow = runs(AVX512), runs(AVX2)
    total = load(AVX512)["total_seconds"]
    training, evaluation = (sum(r["timings_s"][k] for r in fast.values()) for k in ("training", "evaluation"))
    assert (
        f"Training is {seconds(training)} of the AVX-512 set's {seconds(total)} s ({percent(training / total)} %), "
        f"evaluation {seconds(evaluation)} s; no lever is needed there to bring the set under 60 minutes"
    ) in passage()
    assert total < 3600
    compiled = medians_ratio(STEP_AVX2, "compiled_ms", "eager_ms")
    slow_training = sum(r["timings_s"]["training"] for r in slow.values())
    compiled_set = load(AVX2)["total_seconds"] - (1 - compiled) * slow_training
    assert compiled_set > 3600  # "none is shown to"
    assert (
        f"on the AVX2 machine (at {ratio(compiled)}× for every training, the set about {compiled_set / 60:.0f} "
        "minutes) none is shown to."
    ) in passage()
