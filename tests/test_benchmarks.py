"""The benchmarks run (tiny settings, CPU), so they do not rot between the runs that measure; each is a module of
the ``benchmarks`` package, imported here as ``python -m benchmarks.NAME`` runs it."""

import json
import time
from pathlib import Path

import pytest

from benchmarks import bench, convert_init, gpu, gpu_xl_step, sampling, train_step
from benchmarks.common import add_record, results_file, write_result

ROOT = Path(__file__).parent.parent


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    result = gpu_xl_step.main(
        ["--device", "cpu", "--preset", "test", "--batch-size", "2", "--steps", "1", "--out", str(out)]
    )
    assert json.loads(out.read_text())["model_flops_per_step"] == result["model_flops_per_step"] > 0


def test_convert_init_benchmark_smoke(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    r = convert_init.main(
        [
            "--config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
            "--pretrain-steps",
            "3",
            "--steps",
            "4",
            "--out",
            str(tmp_path / "ci"),
        ]
    )
    assert set(r["runs"]) == {"fm/random", "fm/converted", "ddpm/random", "ddpm/converted"}
    assert r["runs"]["ddpm/converted"]["conversion_check"]["max_output_diff"] < 1e-4
    assert (tmp_path / "ci.md").read_text().startswith("Expert init from a converted tiny DiT")


def test_train_step_benchmark_runs_both_loops(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    r = train_step.main(
        [
            "--config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
            "--objective",
            "ddpm",
            "--steps",
            "2",
            "--reps",
            "2",
            "--out",
            str(tmp_path / "t.json"),
        ]
    )
    assert r["samples_per_s"]["ours"] > 0 and r["samples_per_s"]["plain"] > 0
    assert len(r["ratios"]) == 2 and json.loads((tmp_path / "t.json").read_text())["objective"] == "ddpm"


def test_sampling_benchmark_grouped_matches_the_per_sample_loop(tiny_config_path, tmp_path):
    r = sampling.main(
        [
            "--config",
            str(tiny_config_path),
            "--batch-size",
            "6",
            "--steps",
            "2",
            "--reps",
            "2",
            "--set",
            "sampling.cfg_scale=1.0",
            "--out",
            str(tmp_path / "s.json"),
        ]
    )
    assert r["max_abs_diff_grouped_vs_per_sample"] < 1e-5  # same velocities, only the batching differs
    assert set(r["seconds_median"]) == {"grouped", "per_sample", "one_expert"}


def test_gpu_benchmark_dry_run(tmp_path, tiny_config_path, dataset_dir, cache_dir):
    r = gpu.main(
        [
            "--dry-run",
            "--out-dir",
            str(tmp_path),
            "--stages-config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
        ]
    )
    stage4 = r["coordinator_pipeline"]  # finish_run (router, evaluate_and_report) and HDDMPipeline ran
    assert stage4["router"]["device"] == "cpu" and stage4["modes"] and stage4["samples"][0] > 0
    assert r["training"]["test"]["model_flops_per_step"] > 0
    assert r["sampling"]["grouped_vs_per_sample"]["max_abs_diff_grouped_vs_per_sample"] < 1e-3
    assert r["sampling"]["grouped_vs_dense"]["max_abs_diff_grouped_vs_dense"] < 1e-5
    assert (tmp_path / "gpu-dry-run.json").exists()
    k = r["coordinator_kernels"]  # router steps, VAE decode and Inception features run (tiny shapes on the CPU)
    assert k["router"]["steps_per_s"] > 0 and k["inception"]["features"] == 2048 and k["vae_decode"]["images_per_s"] > 0


def test_bench_runner_writes_the_table(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    r = bench.main(
        [
            "--quick",
            "--skip",
            "federation",
            "--config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
            "--out-dir",
            str(tmp_path),
        ]
    )
    md = (tmp_path / "bench.md").read_text()
    assert "training samples/s" in md and "grouped top-2 vs one expert" in md
    assert json.loads((tmp_path / "bench.json").read_text())["machine"] == r["machine"]


def _within(committed: dict, mine: dict) -> bool:
    """Every key of a committed config has the same value in ``mine`` (keys added since keep their defaults)."""
    return all(_within(v, mine.get(k, {})) if isinstance(v, dict) else mine.get(k) == v for k, v in committed.items())


def test_the_gmm_evidence_set_reruns_its_committed_runs_and_reuses_what_they_share(tmp_path):
    from benchmarks import gmm_ladder_set
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.reproduce.training import expert_fingerprint, monolith_fingerprint

    commands = gmm_ladder_set.main(["--out", str(tmp_path), "--dry-run"])
    outs, configs = {}, {}
    for run, cmd in zip(gmm_ladder_set.RUNS, commands, strict=True):
        overrides = {k: v for s in run.sets for k, v in parse_overrides(s).items()}
        cfg = configs[run.label] = load_config(ROOT / run.config, overrides)
        assert cfg.evaluation.training_seeds == 3  # every interval over independent trainings
        committed = json.loads((ROOT / "benchmarks" / "results" / f"{run.committed}-manifest.json").read_text())
        assert _within(committed["config"], cfg.to_dict()), run.label  # the set reruns the committed run
        if run.reuse:
            assert cmd[cmd.index("--reuse") + 1] == outs[run.reuse]  # an earlier run of the set
            donor = configs[run.reuse]
            same_experts = expert_fingerprint(cfg, {}) == expert_fingerprint(donor, {})
            # an equal-images rung trains nothing but its monoliths: its experts are its donor's
            assert same_experts == (cfg.reproduce.budget == "equal_images")
            assert monolith_fingerprint(cfg, {}) != monolith_fingerprint(donor, {})
        outs[run.label] = cmd[cmd.index("--out") + 1]


def test_the_capacity_pilot_summary_is_over_trainings_and_its_change_is_per_doubling():
    """Trainings at three budgets (given out of order): the intervals are over the trainings (Student-t with 1
    degree of freedom), the difference is paired by training, each t is its own column and the clusters are
    averaged, the change per doubling is (m₂ / m₁)^(1 / doublings) − 1 per training since the budget just before,
    a record without ``training`` is training 0, and records that cannot be put side by side are refused."""
    import pytest

    from benchmarks.gmm_capacity_pilot import TIMES, render_summary, summarise

    ramp = [1.0 + j for j in range(len(TIMES))]  # × the value at TIMES[j]: each t its own number

    def record(steps, training, expert, monolith, **extra):
        per = {
            k: {"expert": [expert * f * (1 + k) for f in ramp], "monolith": [monolith * f * (1 + k) for f in ramp]}
            for k in (0, 1)  # cluster 1's values twice cluster 0's: the mean over the clusters is 1.5×
        }
        return (
            {"label": "x", "steps": steps, "per_cluster": {str(k): v for k, v in per.items()}}
            | ({"training": training} if training else {})
            | extra
        )

    records = [
        record(400, 0, 0.05, 0.10),
        record(100, 0, 0.10, 0.40),
        record(100, 1, 0.20, 0.80),
        record(400, 1, 0.05, 0.20),
        record(400, 2, 0.05, 0.30),  # not at 200 steps: not in the change since 200
        record(200, 0, 0.08, 0.20),
        record(200, 1, 0.10, 0.40),
        record(100, 0, 1.0, 1.0) | {"label": "other"},
    ]
    s = summarise(records, "x")
    assert list(s) == [100, 200, 400] and s[100]["trainings"] == [0, 1] and s[400]["trainings"] == [0, 1, 2]
    t3 = 3  # TIMES[3]: factor ramp[3] = 4, mean over the two clusters 1.5
    first = s[100][f"t={TIMES[t3]}"]
    assert abs(first["monolith"]["mean"] - 0.6 * 4 * 1.5) < 1e-12
    # monolith 0.4 and 0.8 (× 6): sample standard deviation 0.2·√2 · 6, so half = t(0.975, 1) · 0.2 · 6
    assert abs(first["monolith"]["half"] - 12.706204736174707 * 0.2 * 6) < 1e-9
    # the gap paired by training: 0.3 and 0.6 (× 6), half = t(0.975, 1) · 0.15 · 6 (unpaired pairs give 0.7, 0.2)
    assert abs(first["gap"]["mean"] - 0.45 * 6) < 1e-12 and abs(first["gap"]["half"] - 12.706 * 0.15 * 6) < 1e-3
    over_t = s[100]["mean_over_t"]["monolith"]["mean"]
    assert abs(over_t - 0.6 * 1.5 * sum(ramp) / len(ramp)) < 1e-12
    assert "monolith_change_per_doubling" not in first
    change = s[400][f"t={TIMES[t3]}"]["monolith_change_per_doubling"]  # since 200: 0.2 → 0.1, 0.4 → 0.2, one doubling
    assert change["n"] == 2 and change["since"] == 200 and abs(change["mean"] + 0.5) < 1e-12 and change["half"] < 1e-12
    expert = s[200]["mean_over_t"]["expert_change_per_doubling"]  # since 100: 0.1 → 0.08 and 0.2 → 0.1
    assert abs(expert["mean"] - (-0.2 - 0.5) / 2) < 1e-12
    table = render_summary(s, "x", "RECORDS")
    assert "| 400 | 3 | mean |" in table and "(2 trainings)" in table and "RECORDS" in table
    with pytest.raises(ValueError, match="differs .* in \\['clusters'\\]"):
        summarise([*records, record(800, 0, 0.1, 0.1) | {"per_cluster": {"0": records[0]["per_cluster"]["0"]}}], "x")
    with pytest.raises(ValueError, match="in \\['samples'\\]"):
        summarise([*records, record(800, 0, 0.1, 0.1, samples=64)], "x")
    with pytest.raises(ValueError, match="in \\['target'\\]"):  # a probe's networks never mix with the data's
        summarise([*records, record(800, 0, 0.1, 0.1, target="exact")], "x")
    assert list(summarise([*records, record(800, 0, 0.1, 0.1, target="data")], "x")) == [100, 200, 400, 800]
    with pytest.raises(ValueError, match="two different records of 400 steps, training 1"):
        summarise([*records, record(400, 1, 0.07, 0.2)], "x")
    assert summarise([*records, record(400, 1, 0.05, 0.20)], "x") == s  # the same scores twice: one record


def test_the_capacity_pilots_comparison_puts_labels_side_by_side_each_over_its_own_trainings():
    """``--summarise RECORDS --label A B --name N``: one row per label and budget, each label's values over its own
    trainings (± only where there are several, paired by training), its ``--set`` beside it; the command that
    regenerates the table is in its header."""
    from benchmarks.gmm_capacity_pilot import TIMES, render_comparison, summarise

    def record(label, training, expert, monolith):
        per = {"0": {"expert": [expert] * len(TIMES), "monolith": [monolith] * len(TIMES)}}
        return {"label": label, "steps": 6400, "training": training, "per_cluster": per}

    records = [record("a", 0, 0.07, 0.15), record("a", 1, 0.09, 0.19), record("b", 0, 0.04, 0.13)]
    summaries = {k: summarise(records, k) for k in ("a", "b")}
    md = render_comparison(summaries, {"a": "x=1", "b": "x=2"}, "sweep", "RECORDS", [6400])
    assert "--summarise RECORDS --label a b --name sweep --steps 6400" in md
    # a over 2 trainings: half = t(0.975, 1) · s / √2 with s = spread / √2, i.e. 12.706 · spread / 2; the gap
    # paired by training (0.08 and 0.10: spread 0.02), unpaired it would be 0.12 and 0.06; b: one training, no ±
    h = 12.706204736174707 / 2
    assert (
        f"| a | `x=1` | 6,400 | 2 | 0.080 ± {h * 0.02:.3f} | 0.170 ± {h * 0.04:.3f} | +0.090 ± {h * 0.02:.3f} |" in md
    )
    assert "| b | `x=2` | 6,400 | 1 | 0.040 | 0.130 | +0.090 | 0.040 / 0.130 | 0.040 / 0.130 |" in md
    # a label trained on the exact velocity says so beside its name
    marked = render_comparison(summaries, {"a": "x=1", "b": "x=2"}, "sweep", "R", None, {"a": "exact", "b": "data"})
    assert "| a (exact target) | `x=1` |" in marked and "| b | `x=2` |" in marked


def test_the_capacity_pilots_independent_trainings_are_those_of_hddm_reproduce():
    """What docs/results.md says of the pilot's trainings 1 and 2: at 3,200 steps their networks (monolith and
    the experts of clusters 0, 3, 4) are, tensor for tensor, the ones the committed 3,200-step ``hddm reproduce``
    rung trained as its trainings 1 and 2 (the records' hashes against the rung's manifest)."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    records = json.loads((results / "gmm_capacity_pilot.json").read_text())["records"]
    pilot = {r.get("training", 0): r for r in records if r["label"] == "clu-r8-nano" and r["steps"] == 3200}
    manifest = json.loads((results / "reproduce-gmm-subspace-3200-text-manifest.json").read_text())
    rung = manifest["artefacts"]["trainings"]
    for i in (1, 2):
        hashes = pilot[i]["tensor_sha256"]
        assert len(hashes) == 4 and hashes["monolith"] == rung[i]["monolith"]["tensor_sha256"]
        for k in (0, 3, 4):
            assert hashes[f"experts/cluster-{k}-fm"] == rung[i]["experts"][f"cluster-{k}-fm"]["tensor_sha256"]


def test_the_committed_3200_step_rungs_hold_their_shared_rows_from_two_machines():
    """What docs/results.md says of the committed 3,200-step rungs: the equal-images manifest computes the same 26
    rows as the equal-steps one besides its monolith's, and the two hold them apart (AVX2 and AVX-512 arithmetic)
    by up to 1.44 nats of Δ log p and 35.2 in a log-deficit percentile — the same largest difference as the AVX-512
    set's es-3200 run from the committed es-3200 manifest; and the set's cost file's total is the 43.5 minutes
    quoted."""
    from benchmarks.gmm_ladder_cost import largest_difference

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    es, ei = (
        json.loads((results / f"reproduce-gmm-subspace-{r}-text-manifest.json").read_text())["results"]
        for r in ("3200", "ei-3200")
    )
    shared = sorted(set(es) & set(ei) - {"monolith (equal compute)"})
    assert len(shared) == 26 and set(ei) - set(shared) == {"monolith (equal compute)"}
    a, b = ({"results": {k: rows[k] for k in shared}} for rows in (es, ei))
    (worst, where), (worst_dlp, _) = largest_difference(a, b), largest_difference(a, b, "delta_log_density")
    assert round(worst, 1) == 35.2 and "log_deficit_p" in where and round(worst_dlp, 2) == 1.44
    cost = json.loads((results / "gmm_ladder_cost.json").read_text())
    assert round(cost["total_seconds"] / 60, 1) == 43.5 and "AVX-512" in cost["machine"]
    rerun = {r["label"]: r["against"] for r in cost["runs"]}["es-3200"]
    assert rerun["largest_difference"] == worst and rerun["largest_delta_log_density_difference"] == worst_dlp


def test_the_capacity_pilot_at_high_noise_shows_no_resolved_change_and_excludes_t07s_fall_only_at_09():
    """What docs/results.md concludes from the pilot's records over four trainings: at t = 0.9 and 1 the monolith's
    change per doubling is indistinguishable from 0 at each of the last three doublings while the experts' falls,
    and monolith − expert is above 0 from 12,800 steps on; from 6,400 to 51,200 a fall as fast as t = 0.7's is
    excluded at t = 0.9 (by a hair) but not at t = 1; at t = 0.7 and averaged over t the monolith still falls (a
    resolved change below 0 at 51,200). The committed summary is the one the records give."""
    from benchmarks.gmm_capacity_pilot import summarise

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    records = json.loads((results / "gmm_capacity_pilot.json").read_text())["records"]
    s = summarise(records, "clu-r8-nano")
    committed = json.loads((results / "gmm_capacity_pilot-clu-r8-nano.json").read_text())["summary"]
    assert json.loads(json.dumps(s)) == committed
    assert s[3200]["trainings"] == [0, 1, 2] and all(
        s[k]["trainings"] == [0, 1, 2, 3] for k in (6400, 12800, 25600, 51200)
    )
    ends = summarise([r for r in records if r["label"] == "clu-r8-nano" and r["steps"] in (6400, 51200)], "clu-r8-nano")
    slow = ends[51200]["t=0.7"]["monolith_change_per_doubling"]
    assert slow["hi"] < 0 and slow["n"] == 4
    assert ends[51200]["t=0.9"]["monolith_change_per_doubling"]["lo"] > slow["mean"]  # excluded at 0.9
    assert ends[51200]["t=1.0"]["monolith_change_per_doubling"]["lo"] < slow["mean"]  # not at 1
    for key in ("t=0.9", "t=1.0"):
        for steps in (12800, 25600, 51200):
            cell = s[steps][key]
            assert cell["monolith"]["n"] == 4 and cell["monolith_change_per_doubling"]["n"] == 4
            assert cell["monolith_change_per_doubling"]["lo"] < 0 < cell["monolith_change_per_doubling"]["hi"]
            assert cell["expert_change_per_doubling"]["hi"] < 0
            assert cell["gap"]["lo"] > 0
    for key in ("t=0.7", "mean_over_t"):
        assert s[51200][key]["monolith_change_per_doubling"]["hi"] < 0 and s[51200][key]["gap"]["lo"] > 0


def test_the_kernel_swaps_change_the_network_and_the_baseline_arm_is_the_trained_one():
    """gmm_train_step's kernel arms: each swap changes the output (it measures another kernel), and switching back
    to the trained kernels gives the trained network's output bit for bit (the baseline arm is not contaminated)."""
    import torch

    from benchmarks.gmm_train_step import KERNELS, batch, net, set_kernels

    s = {"preset": "test", "batch": 4, "channels": 3, "image_size": 8, "text_dim": 16, "caption_tokens": 5}
    model = net(s, 0).eval()
    x, cond = batch(s, torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 250.0, 500.0, 999.0])
    with torch.no_grad():
        trained = model(x, t, cond)
        outputs = {}
        for name, math_attention, exact_gelu in KERNELS[1:] + KERNELS[:1]:
            set_kernels(model.transformer, math_attention, exact_gelu)
            outputs[name] = model(x, t, cond)
    assert torch.equal(outputs["as trained"], trained)
    assert not torch.equal(outputs["exact GELU"], trained) and not torch.equal(outputs["both"], trained)
    # attention by matmul-softmax computes the same function: equal to rounding, not necessarily to the bit
    torch.testing.assert_close(outputs["math attention"], trained, rtol=1e-5, atol=1e-5)


def test_a_results_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "results" / "r.json"
    write_result(path, {"kept": [1, 2]})
    assert json.loads(path.read_text()) == {"kept": [1, 2]}

    def killed(src, dst):  # the process dies between writing the new text and putting it in place
        raise KeyboardInterrupt

    monkeypatch.setattr("benchmarks.common.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_result(path, {"kept": [1, 2], "new": 3})
    assert json.loads(path.read_text()) == {"kept": [1, 2]}  # the records trained before are all there
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # no temporary file left behind
    monkeypatch.undo()
    write_result(path, {"kept": [1, 2], "new": 3})
    assert json.loads(path.read_text()) == {"kept": [1, 2], "new": 3}


def test_processes_adding_to_one_results_file_side_by_side_each_keep_the_others_records(tmp_path):
    import threading

    path = tmp_path / "r.json"
    inside, wrote = threading.Event(), []

    def first():
        with results_file(path) as store:
            store["a"] = 1
            inside.set()
            time.sleep(0.5)  # the second writer arrives while this one holds the file
            wrote.append("a")  # inside the block: the order of the two blocks, not of the threads after them

    def second():
        inside.wait()
        with results_file(path) as store:  # waits for the first, then reads what it wrote
            store["b"] = 2
            wrote.append("b")

    threads = [threading.Thread(target=f) for f in (first, second)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrote == ["a", "b"] and json.loads(path.read_text()) == {"a": 1, "b": 2}
    with pytest.raises(RuntimeError), results_file(path) as store:  # a block that fails writes nothing
        store["c"] = 3
        raise RuntimeError
    assert json.loads(path.read_text()) == {"a": 1, "b": 2}


def test_a_record_is_added_in_place_of_its_key_and_not_under_another_setting(tmp_path):
    path = tmp_path / "r.json"

    def key(r):
        return r["steps"], r["training"]

    def keys(store):
        return {key(r) for r in store["x"]["records"]}

    assert keys(add_record(path, "x", {"lr": 1}, {"steps": 1, "training": 0, "v": 1}, key)) == {(1, 0)}
    assert keys(add_record(path, "x", {"lr": 1}, {"steps": 2, "training": 0, "v": 2}, key)) == {(1, 0), (2, 0)}
    assert keys(add_record(path, "x", {"lr": 1}, {"steps": 1, "training": 0, "v": 3}, key)) == {(1, 0), (2, 0)}
    kept = json.loads(path.read_text())
    assert kept == {
        "x": {
            "name": "x",
            "records": [{"steps": 2, "training": 0, "v": 2}, {"steps": 1, "training": 0, "v": 3}],
            "setting": {"lr": 1},
        }
    }
    with pytest.raises(ValueError, match="--name x: its records were trained with {'lr': 1}"):
        add_record(path, "x", {"lr": 2}, {"steps": 4, "training": 0, "v": 4}, key)
    assert json.loads(path.read_text()) == kept  # nothing written
    written = add_record(path, "x", {"lr": 1}, {"steps": 4, "training": 0, "v": 4}, key)
    assert written == json.loads(path.read_text()) and len(written["x"]["records"]) == 3  # returns the file as written


def test_a_record_added_while_another_process_holds_the_file_waits_and_keeps_its_records(tmp_path):
    import threading

    path = tmp_path / "r.json"
    inside, added = threading.Event(), []

    def other():  # another process adds its own entry and holds the file a while
        with results_file(path) as store:
            store["y"] = {"name": "y", "records": [{"steps": 9, "training": 1}]}
            inside.set()
            time.sleep(0.5)

    def ours():
        inside.wait()
        added.append(add_record(path, "x", {}, {"steps": 1, "training": 0}, lambda r: (r["steps"], r["training"])))

    threads = [threading.Thread(target=f) for f in (other, ours)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    (store,) = added  # it waited for the other, read what it wrote, and returns it
    assert store == json.loads(path.read_text()) and set(store) == {"x", "y"}


def test_a_rate_picked_over_trainings_is_the_lowest_mean_and_the_others_are_paired_against_it():
    """Three rates over trainings 3 and 7 (closed forms: the excess loss constant over t, one cluster): the best is
    the lowest mean, each other rate − the best is paired by training (Student-t, 1 degree of freedom), the count of
    trainings a rate is lowest in, the interior flag, and a training a label lacks is refused."""
    import pytest

    from benchmarks.gmm_capacity_pilot import TIMES
    from benchmarks.gmm_rate_pick import markdown, pick

    def record(label, training, expert, monolith):
        per = {"0": {"expert": [expert] * len(TIMES), "monolith": [monolith] * len(TIMES)}}
        return {"label": label, "steps": 800, "training": training, "per_cluster": per}

    values = {"a": ((0.30, 0.20), (0.40, 0.10)), "b": ((0.20, 0.25), (0.24, 0.30)), "c": ((0.25, 0.26), (0.22, 0.40))}
    records = [record(k, t, *v[i]) for k, v in values.items() for i, t in enumerate((3, 7))]
    records.append(record("a", 8, 0.1, 0.1))  # a training the other labels lack: not read
    expert = pick(records, ["a", "b", "c"], 800, "expert")
    assert expert["trainings"] == [3, 7] and expert["best"] == "b" and expert["interior"]
    assert expert["means"]["b"] == pytest.approx(0.22) and expert["lowest_in"] == {"a": 0, "b": 1, "c": 1}
    c = expert["minus_best"]["c"]  # c − b: 0.05 and −0.02, mean 0.015, sd 0.035·√2
    assert c["mean"] == pytest.approx(0.015) and c["half"] == pytest.approx(12.706204736174707 * 0.035)
    assert not c["resolved"] and "b" not in expert["minus_best"]
    monolith = pick(records, ["a", "b", "c"], 800, "monolith")
    assert monolith["best"] == "a" and not monolith["interior"] and monolith["lowest_in"]["a"] == 2
    table = markdown([expert, monolith], "CMD", {"machine": "M", "date": "D", "commit": "C"})
    assert "| b | 0.2000 | 0.2400 | 0.2200 | – | 1 |" in table and "at an end of the rates tried" in table
    with pytest.raises(ValueError, match="label b: no record of 800 steps, training 8"):
        pick(records, ["a", "b"], 800, "expert", trainings=[3, 8])
    with pytest.raises(ValueError, match="label a: no record of 400 steps"):
        pick(records, ["a", "b"], 400, "expert")
    with pytest.raises(ValueError, match="each label once"):
        pick(records, ["a", "b", "a"], 800, "expert")
    with pytest.raises(ValueError, match="trainings 3 3 7: each training once"):  # a repeat would narrow the interval
        pick(records, ["a", "b"], 800, "expert", trainings=[3, 3, 7])
    other = [r | {"label": "d", "per_cluster": r["per_cluster"] | {"1": r["per_cluster"]["0"]}} for r in records[:2]]
    with pytest.raises(ValueError, match=r"labels a and d differ in more than the learning rate: \['clusters'\]"):
        pick(records + other, ["a", "d"], 800, "expert")
    rates = [r | {"set": f"data.gmm_rank=8 expert.optim.lr={r['label']}"} for r in records]  # only the rate differs
    assert pick(rates, ["a", "b", "c"], 800, "expert")["best"] == "b"
    images = [
        r | {"label": "e", "set": "data.gmm_rank=8 expert.optim.lr=e reproduce.budget=equal_images"}
        for r in rates
        if r["label"] == "a"
    ]
    with pytest.raises(ValueError, match="differ in more than the learning rate: \\['set without the rate'\\]"):
        pick(rates + images, ["a", "e"], 800, "expert")
