"""benchmarks/gmm_equal_compute.py: a training step's multiply-adds and the compute ratio counted by hand; a record is
the monolith gmm_trained_floor trains at the same N, t, budget and training, scored on every cluster; the summary's
weighting, intervals, every pair of trainings and separation with two standard errors against hand-made records;
the command's files, kept records, inherited setting and refusals."""

from types import SimpleNamespace

import pytest
import torch

import benchmarks.gmm_equal_compute as eq
import benchmarks.gmm_trained_floor as floor
from hddm_flower.gmm.yardsticks import width_floor


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from hddm_flower.data import Dataset
    from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm

    spec = GMMSpec(3, 2, image_size=4, channels=1, rank=2, num_samples=90, covariance="cluster")
    return load_reference(Dataset.open(prepare_gmm(tmp_path_factory.mktemp("equal"), spec, max_caption_tokens=8)))


def test_the_multiply_adds_are_the_two_layers_forward_and_backward_counted_by_hand(ref):
    # forward d·n + (d + C + n)·d; backward the two weight gradients (the same again) and the output layer's input
    # gradient ((d + C + n)·d once more)
    assert eq.training_macs(192, 16, 4) == 2 * 192 * 16 + 3 * (192 + 4 + 16) * 192 == 128_256
    assert eq.training_macs(192, 128, 32) == 2 * 24_576 + 3 * 67_584
    assert eq.training_macs(5, 0, 1) == 90  # no hidden units: the output layer over [x, caption]
    # d = 16; the monolith of 12 units over 6 captions 2·16·12 + 3·34·16 = 2016, an expert of 4 over 2:
    # 2·64 + 3·22·16 = 1184, three of them
    assert eq.compute_ratio(ref, 12, 100, 4, 50) == pytest.approx(100 * 2016 / (50 * 3 * 1184), rel=1e-15)
    assert eq.compute_ratio(ref, 4, 50, 4, 50) == pytest.approx((2 * 64 + 3 * 26 * 16) / (3 * 1184), rel=1e-15)


def test_a_record_is_the_trained_floors_monolith_scored_on_every_cluster(ref):
    args = SimpleNamespace(lr=1e-2, batch=64, draws_per_feature=16, samples=256, eval_seed=3)
    mine = eq.record(ref, 4, 0.5, 20, 1, args)
    theirs = floor.record(ref, [0, 1, 2], 4, 0.5, 20, 1, args)
    assert (mine["features"], mine["t"], mine["steps"], mine["training"]) == (4, 0.5, 20, 1)
    assert mine["training_loss"] == theirs["training_loss"]["monolith"]
    assert set(mine["per_cluster"]) == {"0", "1", "2"}
    for k, scores in mine["per_cluster"].items():
        assert scores == {who: theirs["per_cluster"][k][who] for who in scores}  # the same network, the same draws
        assert set(scores) == {f"monolith{what}" for what in ("", "_se", "_start", "_start_se")}


def _entry(mono: dict[int, tuple[float, float]], t: float = 0.5) -> dict:
    # one cluster's value per training; cluster "1" at 3× cluster "0" (weights ¼, ¾) with the same standard error
    def per_cluster(v, se, who):
        return {"0": {who: v, f"{who}_se": se}, "1": {who: 3 * v, f"{who}_se": se}}

    return {
        "name": "x",
        "setting": {"experts": "e", "expert_features": 2, "expert_steps": 10},
        "compute_ratio": {"8@40": 1.5},
        "width_floor": {f"8@{t}": 0.01},
        "records": [
            {"features": 8, "t": t, "steps": 40, "training": i, "per_cluster": per_cluster(v, se, "monolith")}
            | {"training_loss": v}
            for i, (v, se) in mono.items()
        ],
    }


EXPERTS = {
    "cluster_weights": {"0": 0.25, "1": 0.75},
    "records": [
        {"features": 2, "steps": 10, "t": 0.5, "training": 0, "per_cluster": {"0": {"expert": 1.0, "expert_se": 0.1}}},
        {"features": 2, "steps": 10, "t": 0.5, "training": 1, "per_cluster": {"0": {"expert": 2.0, "expert_se": 0.1}}},
        {"features": 2, "steps": 99, "t": 0.5, "training": 0, "per_cluster": {"0": {"expert": 9.0, "expert_se": 0.1}}},
    ],
}
for _r in EXPERTS["records"]:
    _r["per_cluster"]["1"] = {"expert": 5 * _r["per_cluster"]["0"]["expert"], "expert_se": 0.2}


def test_the_summary_weighs_the_clusters_and_compares_every_pair_of_trainings():
    # experts weighted: ¼·e + ¾·5e = 4e → 4 and 8 (the 99-step record is another budget); SE √(¼²·0.01 + ¾²·0.04)
    # monolith weighted: ¼·m + ¾·3m = 2.5m → 25, 50, 75
    (row,) = eq.summarise(_entry({0: (10.0, 0.4), 1: (20.0, 0.4), 2: (30.0, 0.4)}), EXPERTS)["rows"]
    assert row["monolith"]["mean"] == pytest.approx(50) and row["experts"]["mean"] == pytest.approx(6)
    assert row["monolith"]["half"] == pytest.approx(4.302653 * 25 / 3**0.5, rel=1e-6)  # t(0.975, 2)·s/√3
    assert row["experts"]["half"] == pytest.approx(12.706205 * 2**0.5 * 2 / 2**0.5, rel=1e-6)  # t(0.975, 1)·s/√2
    assert row["ratio_of_means"] == pytest.approx(50 / 6)
    assert row["ratio_every_pair"] == {"min": pytest.approx(25 / 8), "max": pytest.approx(75 / 4)}
    se = (0.25**2 * 0.01 + 0.75**2 * 0.04) ** 0.5
    assert row["experts_per_training"]["1"] == {"experts": pytest.approx(8), "experts_se": pytest.approx(se)}
    assert row["per_training"]["2"]["monolith_se"] == pytest.approx((0.25**2 + 0.75**2) ** 0.5 * 0.4)
    assert row["below_in_every_pair_with_2se"] == "experts below"
    assert (row["compute_ratio"], row["monolith_width_floor"], row["expert_trainings"]) == (1.5, 0.01, [0, 1])
    assert row["monolith_training_loss"]["mean"] == pytest.approx(20)
    # a monolith training within two standard errors of an experts' one: neither side below in every pair
    near = eq.summarise(_entry({0: (3.3, 0.4), 1: (20.0, 0.4)}), EXPERTS)["rows"][0]  # 8.25 ± 2·0.32 against 8 ± …
    assert near["below_in_every_pair_with_2se"] == "neither"
    # 8.8 ± 2·0.32 against 8 ± 2·0.15: apart by one standard error of each, or by both in quadrature, not by two
    two = eq.summarise(_entry({0: (3.52, 0.4), 1: (20.0, 0.4)}), EXPERTS)["rows"][0]
    assert two["below_in_every_pair_with_2se"] == "neither"
    low = eq.summarise(_entry({0: (0.1, 0.01), 1: (0.2, 0.01)}), EXPERTS)["rows"][0]
    assert low["below_in_every_pair_with_2se"] == "monolith below"
    assert eq.summarise(_entry({0: (1.0, 0.1)}, t=0.9), EXPERTS)["rows"] == []  # no experts at that t


def test_equal_compute_pairs_each_monolith_budget_with_the_experts_budget_of_its_compute(ref):
    # d = 16: the 12-unit monolith 2016 multiply-adds a step, the three 4-unit experts 3 · 1184 = 3552: 370 monolith
    # steps are 210 of the experts' (370 · 2016 = 210 · 3552) exactly; 209 and 211 are 0.5 % off, 371 steps 0.27 %
    assert eq.equal_budget(ref, 12, 370, 4, {100, 209, 210, 211}) == 210
    assert eq.equal_budget(ref, 12, 370, 4, {209, 211}) is None and eq.equal_budget(ref, 12, 371, 4, {210}) is None
    assert eq.equal_budget(ref, 12, 740, 4, {210, 420}) == 420
    # 37,000 steps are 21,000 of the experts' exactly; 21,001 and 21,010 are within 0.1 %: the nearest wins
    assert eq.equal_budget(ref, 12, 37000, 4, {21010, 21001, 21000}) == 21000
    assert eq.equal_budget(ref, 12, 37000, 4, {21010, 21001}) == 21001


def test_a_record_is_adopted_only_from_the_same_setting_training_and_budget_and_never_from_a_copy():
    setting = {"experts": "a", "expert_features": 2, "expert_steps": 10, "lr": 0.01, "batch": 8}
    mine = {"features": 4, "t": 0.5, "steps": 40, "training": 1}
    store = {"other": {"setting": setting | {"experts": "b", "expert_steps": eq.EQUAL}, "records": [mine]}}
    assert eq.adoptable(store, setting, (4, 0.5, 40, 1)) == ("other", mine)  # the experts alone differ
    for changed in ({"lr": 0.03}, {"batch": 16}):
        assert eq.adoptable(store, setting | changed, (4, 0.5, 40, 1)) is None, changed
    for key in ((4, 0.5, 40, 0), (4, 0.5, 80, 1), (8, 0.5, 40, 1), (4, 0.9, 40, 1)):
        assert eq.adoptable(store, setting, key) is None, key
    copied = {"copy": {"setting": setting, "records": [mine | {"adopted_from": "gone"}]}}
    assert eq.adoptable(copied, setting, (4, 0.5, 40, 1)) is None
    # the summary reads the experts at each row's own budget: the 40-step monolith against the 10-step experts
    # (weighted 4 and 8), the 80-step one against the 99-step training (36)
    entry = _entry({0: (10.0, 0.4), 1: (20.0, 0.4)})
    entry["setting"]["expert_steps"] = eq.EQUAL
    entry["records"] += [r | {"steps": 80} for r in entry["records"]]
    entry |= {"expert_budget": {"8@40": 10, "8@80": 99}, "compute_ratio": {"8@40": 1.0, "8@80": 1.0}}
    first, second = eq.summarise(entry, EXPERTS)["rows"]
    assert (first["steps"], first["expert_steps"], first["expert_trainings"]) == (40, 10, [0, 1])
    assert first["experts"]["mean"] == pytest.approx(6)
    assert (second["steps"], second["expert_steps"], second["expert_trainings"]) == (80, 99, [0])
    assert second["experts"]["mean"] == pytest.approx(36)
    assert "expert_steps" not in eq.summarise(_entry({0: (10.0, 0.4)}), EXPERTS)["rows"][0]  # one budget: none


def test_the_multiply_adds_are_what_autograd_counts_for_a_training_step():
    # one step of the trained floor's network as gmm_trained_floor.train computes it, counted by torch's FLOP counter
    from torch.utils.flop_counter import FlopCounterMode

    for d, n, captions, batch in ((192, 16, 4, 512), (192, 128, 32, 512), (16, 5, 3, 64)):
        g = torch.Generator().manual_seed(0)
        x, v = torch.randn(batch, d, generator=g), torch.randn(batch, d, generator=g)
        c = torch.randint(captions, (batch,), generator=g)
        shift, scale = torch.randn(d, generator=g), 1.5
        R, q, beta, W = (
            torch.randn(shape, generator=g).requires_grad_()
            for shape in ((d, n), (captions, n), (n,), (d + captions + n, d))
        )
        with FlopCounterMode(display=False) as counter:
            hidden = torch.relu((x - shift) / scale @ R + q[c] + beta)
            onehot = torch.nn.functional.one_hot(c, captions).float()
            ((torch.cat([x, onehot, hidden], 1) @ W - v) ** 2).mean().backward()
        assert counter.get_total_flops() == 2 * batch * eq.training_macs(d, n, captions), (d, n, captions)


def test_the_command_writes_records_and_summaries_and_refuses_bad_input(ref, tmp_path, monkeypatch, capsys):
    for module in (floor, eq):
        monkeypatch.setattr(module, "prepare_data", lambda cfg: None)
        monkeypatch.setattr(module, "load_reference", lambda dataset: ref)
    experts = tmp_path / "floor" / "t.json"
    made = ["--config", "configs/reproduce-gmm-nano.yaml", "--features", "2", "--times", "0.5", "--steps", "20", "40"]
    made += ["--samples", "64", "--batch", "32", "--results", str(experts)]
    floor.main([*made, "--clusters", "0", "1", "2", "--name", "every"])
    floor.main([*made, "--clusters", "0", "--name", "one"])  # not every cluster: no weights
    out = tmp_path / "out" / "e.json"
    argv = ["--experts", "every", "--expert-features", "2", "--expert-steps", "20", "--features", "6"]
    argv += ["--times", "0.5", "--steps", "20", "40", "--name", "m", "--experts-file", str(experts)]
    argv += ["--results", str(out)]
    summary = eq.main(argv)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "e.json",
        "gmm_equal_compute-m.json",
        "gmm_equal_compute-m.md",
    ]
    stored = eq.json.loads(out.read_text())["m"]
    trained = eq.json.loads(experts.read_text())["every"]["setting"]
    assert stored["setting"] == {"experts": "every", "expert_features": 2, "expert_steps": 20} | {
        k: v for k, v in trained.items() if k != "clusters"
    }  # the experts' own learning rate, batch, fit and scoring draws
    assert [r["steps"] for r in summary["rows"]] == [20, 40]
    assert [r["compute_ratio"] for r in summary["rows"]] == [
        pytest.approx(eq.compute_ratio(ref, 6, s, 2, 20), rel=1e-15) for s in (20, 40)
    ]
    assert stored["width_floor"] == {"6@0.5": width_floor(ref.mixture, torch.arange(6), (0.5,), 6)[0]}
    assert eq.main(argv) == summary and eq.json.loads(out.read_text())["m"]["records"] == stored["records"]  # kept
    assert "| 6 | 0.5 | 40 |" in (out.parent / "gmm_equal_compute-m.md").read_text()
    files = {f: f.read_bytes() for f in out.parent.iterdir()}
    for i, (bad, why) in enumerate(
        (
            (["--experts", "nope"], "--experts nope: no such entry"),
            (["--experts-file", str(tmp_path / "none.json")], "no such file"),
            (["--experts", "one"], "its records do not score every cluster"),
            (["--expert-steps", "80"], "no records at N = 2, 80 steps"),
            (["--times", "0.2"], "--times [0.2]: t must be one of"),
            (["--features", "0"], "must be ≥ 1"),
            (["--lr", "0"], "--lr 0.0: must be > 0"),
        )
    ):
        with pytest.raises(SystemExit):
            eq.main([*argv, *bad, "--name", f"bad{i}"])  # a fresh name: the refusal is this input's own
        assert why in capsys.readouterr().err, bad
    for bad in (["--expert-steps", "40"], ["--lr", "0.5"]):  # another setting under the same name
        with pytest.raises(SystemExit):
            eq.main([*argv, *bad])
        assert "--name m: its records were trained with" in capsys.readouterr().err, bad
    assert {f: f.read_bytes() for f in out.parent.iterdir()} == files  # nothing written by a refusal
    eq.main([*argv, "--steps", "40", "40", "--name", "twice"])  # a budget given twice is one record
    twice = eq.json.loads(out.read_text())["twice"]["records"]
    assert [r["steps"] for r in twice] == [40] and "adopted_from" not in twice[0]  # its own entry's: no adoption
    # another entry in the same setting but for the experts adopts the monolith "m" trained, naming it; the
    # experts' 2 units over two components are 1024 multiply-adds a step, the three 3072, the monolith's 6 units
    # over six 1536: its 40 steps are the experts' 20, its 80 their 40
    same = ["--experts", "every", "--expert-features", "2", "--equal-compute", "--features", "6", "--times", "0.5"]
    same += ["--experts-file", str(experts), "--results", str(out)]
    summary = eq.main([*same, "--steps", "40", "80", "--name", "equal"])
    equal = eq.json.loads(out.read_text())["equal"]
    by = {r["steps"]: r for r in equal["records"]}
    assert by[40] == next(r for r in stored["records"] if r["steps"] == 40) | {"adopted_from": "m"}
    assert "adopted_from" not in by[80] and by[80]["commit"]
    # at another learning rate or another training nothing is adopted
    faster = eq.main([*same, "--steps", "40", "--lr", "0.5", "--name", "equal-fast"])
    assert "adopted_from" not in eq.json.loads(out.read_text())["equal-fast"]["records"][0] and faster["rows"]
    eq.main([*same, "--steps", "40", "--training", "1", "--name", "equal-one"])
    assert "adopted_from" not in eq.json.loads(out.read_text())["equal-one"]["records"][0]
    assert [(r["steps"], r["expert_steps"], r["compute_ratio"]) for r in summary["rows"]] == [
        (40, 20, 1.0),
        (80, 40, 1.0),
    ]
    assert equal["setting"]["expert_steps"] == eq.EQUAL and equal["expert_budget"] == {"6@40": 20, "6@80": 40}
    assert "| 6 | 0.5 | 40 | 1.00 |" in (out.parent / "gmm_equal_compute-equal.md").read_text()
    assert " (20) | " in (out.parent / "gmm_equal_compute-equal.md").read_text()
    files = {f: f.read_bytes() for f in out.parent.iterdir()}
    for bad, why in (
        (["--steps", "50"], "no budget of N = 2 of the compute of N = 6 at 50 steps; train the experts for 25 steps"),
        (["--steps", "3"], "at 3 steps; no whole number of the experts' steps is within 0.1 % of it"),  # 1.5 steps
        (["--steps", "40", "--expert-steps", "20"], "not allowed with argument"),
    ):
        with pytest.raises(SystemExit):
            eq.main([*same, *bad, "--name", "refused"])
        assert why in capsys.readouterr().err, bad
    assert {f: f.read_bytes() for f in out.parent.iterdir()} == files
    eq.main([*argv, "--lr", "0.5", "--steps", "20", "--name", "fast"])  # the monolith's own learning rate, named
    assert eq.json.loads(out.read_text())["fast"]["setting"] == stored["setting"] | {"lr": 0.5} != stored["setting"]


def _beside(ref, tmp_path, monkeypatch, steps: list[str], argv: list[str], other: list[str], name: str):
    """Experts trained for ``steps``; then this process runs ``argv`` while another, mid-training, writes the record
    that ``argv + other`` makes (``other``'s options replace ``argv``'s; made here first and set aside). Returns this
    run's summary, the stored entry, the other process's record and the experts' file."""
    from benchmarks.common import results_file

    for module in (floor, eq):
        monkeypatch.setattr(module, "prepare_data", lambda cfg: None)
        monkeypatch.setattr(module, "load_reference", lambda dataset: ref)
    experts, out = tmp_path / "floor.json", tmp_path / "e.json"
    made = ["--config", "configs/reproduce-gmm-nano.yaml", "--features", "2", "--times", "0.5", "--steps", *steps]
    made += ["--samples", "64", "--batch", "32", "--clusters", "0", "1", "2", "--name", "every"]
    floor.main([*made, "--results", str(experts)])
    argv = [*argv, "--name", name, "--experts-file", str(experts), "--results", str(out)]
    eq.main([*argv, *other])
    (theirs,) = eq.json.loads(out.read_text())[name]["records"]
    out.unlink()
    record = eq.record

    def beside(*args):  # the other process writes its record (and not yet its entry's fields) while this one trains
        with results_file(out) as store:
            store.setdefault(name, {"name": name, "records": []})["records"].append(theirs)
        return record(*args)

    monkeypatch.setattr(eq, "record", beside)
    summary = eq.main(argv)
    return summary, eq.json.loads(out.read_text())[name], theirs, experts


def test_two_processes_adding_to_one_entry_side_by_side_keep_each_others_records(ref, tmp_path, monkeypatch):
    argv = ["--experts", "every", "--expert-features", "2", "--expert-steps", "20", "--features", "6", "--times"]
    argv += ["0.5", "--steps", "20"]
    summary, stored, theirs, experts = _beside(
        ref, tmp_path, monkeypatch, ["20"], [*argv, "--training", "0"], ["--training", "1"], "m"
    )
    assert sorted(r["training"] for r in stored["records"]) == [0, 1] and theirs in stored["records"]
    assert summary == eq.summarise(stored, eq.json.loads(experts.read_text())["every"])
    assert summary["rows"][0]["monolith"]["n"] == 2  # over both trainings


def test_processes_given_other_budgets_side_by_side_under_equal_compute_close_over_every_budget(
    ref, tmp_path, monkeypatch
):
    argv = ["--experts", "every", "--expert-features", "2", "--equal-compute", "--features", "6", "--times", "0.5"]
    # the other process: six units, 80 steps (the experts' 40); this one: 40 steps (their 20)
    summary, stored, _, _ = _beside(
        ref, tmp_path, monkeypatch, ["20", "40"], [*argv, "--steps", "40"], ["--steps", "80"], "q"
    )
    assert stored["expert_budget"] == {"6@40": 20, "6@80": 40}
    assert [(r["steps"], r["expert_steps"]) for r in summary["rows"]] == [(40, 20), (80, 40)]
    assert eq.json.loads((tmp_path / "gmm_equal_compute-q.json").read_text()) == summary


def test_a_record_another_entry_trained_beside_this_run_is_adopted_not_trained_again(ref, tmp_path, monkeypatch):
    from benchmarks.common import results_file

    for module in (floor, eq):
        monkeypatch.setattr(module, "prepare_data", lambda cfg: None)
        monkeypatch.setattr(module, "load_reference", lambda dataset: ref)
    experts, out = tmp_path / "floor.json", tmp_path / "e.json"
    made = ["--config", "configs/reproduce-gmm-nano.yaml", "--features", "2", "--times", "0.5", "--steps", "20"]
    floor.main(
        [
            *made,
            "--samples",
            "64",
            "--batch",
            "32",
            "--clusters",
            "0",
            "1",
            "2",
            "--name",
            "every",
            "--results",
            str(experts),
        ]
    )
    argv = ["--experts", "every", "--expert-features", "2", "--equal-compute", "--features", "6", "--times", "0.5"]
    argv += ["--steps", "40", "--experts-file", str(experts), "--results", str(out)]
    eq.main([*argv, "--training", "1", "--name", "b"])  # the other process's entry, made here and set aside
    theirs = eq.json.loads(out.read_text())["b"]
    out.unlink()
    record, calls = eq.record, []

    def beside(*args):  # while this process trains training 0 of "a", the other writes "b"'s training 1
        calls.append(args[4])
        with results_file(out) as store:
            store["b"] = theirs
        return record(*args)

    monkeypatch.setattr(eq, "record", beside)
    eq.main([*argv, "--training", "0", "1", "--name", "a"])
    assert calls == [0]
    (adopted,) = [r for r in eq.json.loads(out.read_text())["a"]["records"] if r["training"] == 1]
    assert adopted == theirs["records"][0] | {"adopted_from": "b"}
