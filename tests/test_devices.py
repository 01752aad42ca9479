"""Devices that agree: the coordinator's path with every module on an emulated CUDA device
(:mod:`tests.device_emulation`), which raises on any operation mixing device and host tensors as CUDA does."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hddm_flower.config.sections import CoordinatorConfig
from hddm_flower.data import Dataset
from hddm_flower.devices import glibc_version

from .device_emulation import DeviceMismatch, emulated_cuda, on_device
from .malloc_books import BLOCK, large_block

ROOT = Path(__file__).resolve().parent.parent
PRESENT = (0, 1, 3)  # expert 2 lost, as in the pipeline tests


def test_the_emulated_device_raises_where_cuda_does():
    with emulated_cuda() as mode:
        host = torch.ones(4, 3)
        dev = host.to("cuda")
        assert dev.device == torch.device("cuda", 0) and host.device.type == "cpu" and on_device(dev)
        assert not on_device(host)  # moving copies: the host tensor stays on the host
        with pytest.raises(DeviceMismatch, match="same device"):
            dev + host
        assert on_device(dev * torch.tensor(2.0))  # a 0-dim host tensor is a scalar
        assert on_device(dev[torch.tensor([0, 2])])  # a host index may index a device tensor
        with pytest.raises(DeviceMismatch, match="indices"):
            host[torch.tensor([0, 2]).to("cuda")]
        with pytest.raises(TypeError, match="numpy"):
            dev.numpy()
        with pytest.raises(DeviceMismatch, match="generator"):
            torch.randn(3, generator=torch.Generator().manual_seed(0), device="cuda")
        net = torch.nn.Linear(3, 2).to(torch.device("cuda"))
        assert next(net.parameters()).device.type == "cuda" and on_device(net(dev))
        with pytest.raises(DeviceMismatch):
            net(host)
        assert not on_device(dev.cpu()) and on_device(torch.zeros(2, device=dev.device))
        reads = {  # every way of making the host wait for the device is recorded, under its name
            "item": lambda: dev.sum().item(), "__int__": lambda: int(dev.sum()), "__float__": lambda: float(dev.sum()),
            "__bool__": lambda: bool(dev.sum() > 0), "__index__": lambda: ([0] * 13)[(dev > 0).sum()],
            "tolist": dev.tolist, "nonzero": lambda: (dev > 0).nonzero(), "where": lambda: torch.where(dev > 0),
            "argwhere": lambda: torch.argwhere(dev > 0), "__getitem__": lambda: dev[dev > 0],
            "masked_select": lambda: dev.masked_select(dev > 0), "bincount": lambda: (dev > 0).long().flatten().bincount(),
            "repeat_interleave": lambda: dev.repeat_interleave((dev[:, 0] > 0).long(), 0), "cpu": dev.cpu,
            "to": lambda: dev.to("cpu"), "unique": dev.unique, "synchronize": torch.cuda.synchronize,
        }  # fmt: skip
        for name, read in reads.items():
            mode.host_reads.clear()
            read()
            assert mode.host_reads == [name], (name, mode.host_reads)
        mode.host_reads.clear()
        (dev * 2).sum(0).topk(2).indices.sort().values.cumsum(0)  # device work reads nothing back
        torch.where(dev > 0, dev, 0)
        assert mode.host_reads == []


def test_the_classifier_fallback_distance_takes_host_images():
    """The offline diversity fallback (no AlexNet file) with its classifier on the device and host images."""
    from hddm_flower.evaluation.metrics import FeatureClassifier, classifier_distance

    net = FeatureClassifier(num_classes=2, text_dim=4).eval()
    a, b = torch.rand(3, 3, 8, 8) * 2 - 1, torch.rand(3, 3, 8, 8) * 2 - 1
    expected = classifier_distance(net, "test")(a, b)
    with emulated_cuda():
        net.to("cuda")
        got = classifier_distance(net, "test")(a, b)
    assert not on_device(got)
    torch.testing.assert_close(got, expected)


def test_the_text_encoder_takes_its_models_device():
    """Tokens go to the encoder's device (the pipeline's ``pipe.to(device)`` moves it); states come back to the
    host."""
    from hddm_flower.text import TextEncoder

    enc = TextEncoder(max_length=8)
    cond, pooled = enc.encode(["a red apple", "dog face"])
    with emulated_cuda():
        enc.model.to("cuda")
        dev_cond, dev_pooled = enc.encode(["a red apple", "dog face"])
        assert not any(on_device(t) for t in (dev_cond.states, dev_cond.mask, dev_pooled))  # back on the host
    torch.testing.assert_close(dev_cond.states, cond.states)
    torch.testing.assert_close(dev_pooled, pooled)


@pytest.fixture(scope="module")
def device_run(tiny_config, dataset_dir, tmp_path_factory):
    """A tiny run whose experts were trained on the host and whose coordinator stages all ran on the emulated
    device: router training, reference statistics, the feature classifier, diagnostics, every routing mode and
    the per-expert pass, samples.png through HDDMPipeline, the report."""
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.rundir import write_config
    from hddm_flower.stages.assemble import finish_run
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives

    cfg = dataclasses.replace(tiny_config, coordinator=CoordinatorConfig(device="cuda", mixed_precision="auto"))
    cfg = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, routing_modes=["top2", "oracle"]))
    run = tmp_path_factory.mktemp("device-run")
    write_config(run / "config.yaml", cfg, "the tiny test config on an emulated CUDA coordinator")
    objectives = assign_objectives(cfg, Dataset.open(dataset_dir))
    for k in PRESENT:
        save_expert(
            run / "experts" / f"expert-{k}", *train_one_expert(cfg, Dataset.open(dataset_dir), k, objectives[k])
        )
    with emulated_cuda() as mode:
        report = finish_run(cfg, run, Dataset.open(dataset_dir), [{"expert_id": 2, "reason": "lost"}])
    return run, report, mode.ops


def test_every_coordinator_stage_runs_on_the_device(device_run):
    run, report, ops = device_run
    assert ops > 10_000  # the stages' work ran on the (emulated) device, not around it
    router = json.loads((run / "router" / "hddm_router.json").read_text())
    assert (router["device"], router["mixed_precision"]) == ("cuda", "bf16")  # auto precision on a CUDA device
    m = report["metrics"]
    assert set(m["evaluation"]["modes"]) == {"top2", "oracle"} and set(m["evaluation"]["per_expert"]) == {"0", "1", "3"}
    assert all(v is not None for v in m["ensemble_velocity_mse"])
    assert m["evaluation"]["diversity_distance"].startswith("FALLBACK")  # the classifier distance on the device
    assert (run / "samples.png").is_file()


def test_hddm_sample_on_the_device(device_run, tmp_path):
    from hddm_flower.cli import main

    run, _, _ = device_run
    out = tmp_path / "grid.png"
    with emulated_cuda() as mode:
        assert main(["sample", "--run-dir", str(run), "--prompt", "red apple", "--out", str(out)]) == 0
    assert out.is_file() and mode.ops > 1000


@pytest.mark.parametrize(
    "routing, dispatch, clean, per_step",
    [
        ("top_k", "dense", "shrink", 0),
        ("full", "auto", "clamp", 0),
        ("sample", "dense", "clamp", 0),
        ("top_k", "auto", "shrink", 1),
        ("threshold", "auto", "clamp", 1),
    ],
)
def test_the_sampling_step_loop_reads_nothing_back(device_run, routing, dispatch, clean, per_step):
    """No host read in the step loop (no .item(), nonzero(), int(tensor), bool mask, copy to the host: every read
    the emulated device records, see the first test) with the counts on (clamps, shrink, velocity scaling,
    hand-over): dense dispatch reads nothing; gathering each expert's rows reads the row counts once per step (a
    network's batch size must be known to launch it: docs/paper-scale.md says why), never once per expert. The
    counts are read once, after the batch."""
    from hddm_flower.counts import read_counts
    from hddm_flower.ensemble import VelocityScaling, sample_ensemble
    from hddm_flower.hddm_pipeline import HDDMPipeline
    from hddm_flower.models import TextCond

    pipe = HDDMPipeline.from_pretrained(device_run[0])
    pipe = HDDMPipeline.from_pretrained(device_run[0], sampling=dict(pipe.config.sampling, clean_estimate=clean))
    steps = 4
    with emulated_cuda() as mode:
        pipe.to("cuda")
        cond, uncond = pipe.encode_prompt(["dog face", "red apple", "japan flag"])
        ens = pipe.ensemble(routing, 2)
        ens.dispatch, ens.velocity_scaling, ens.handover_t = dispatch, VelocityScaling("fm_rms", 0.5), 0.8
        ens._has_fm, ens.handover_counts, counts = True, {}, {}
        converted = [e for e in ens.experts.values() if e.converted]
        assert converted and all(e.shrinks == (clean == "shrink") for e in converted)
        for e in converted:
            e.clamp_counts = counts
        uncond = TextCond(uncond.states.expand(3, -1, -1), uncond.mask.expand(3, -1))
        noise = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        reads = []
        sample_ensemble(
            ens, noise, cond, uncond, num_steps=steps, cfg_scale=2.0, generator=torch.Generator().manual_seed(1),
            on_step=lambda i, x: reads.append(list(mode.host_reads)),
        )  # fmt: skip
        during = [r[len(reads[0]) :] for r in reads[1:]]  # steps 2…4: what the loop itself read
        mode.host_reads.clear()
        clamps, handover = read_counts(counts), read_counts(ens.handover_counts)
        assert mode.host_reads == ["tolist", "tolist"]  # one read per dict of counts
    assert [len(r) for r in during] == [per_step * (i + 1) for i in range(steps - 1)], during
    assert clamps["rows"] > 0 and handover["rows"] == 3 * steps and handover["late_rows"] == 3
    assert ("shrink_rows" in clamps) == (clean == "shrink") and clamps["velocity_scaling_rows"] > 0


def test_the_evaluations_sampling_reads_once_per_step(device_run, dataset_dir, monkeypatch):
    """The evaluation's own sampler (its ensemble with the traced router, the conversion's counts on): one host
    read per step and batch for top-2 (the gathered row counts), none for full routing; the trace and the counts
    are read after the mode's last batch."""
    from hddm_flower.data import Dataset
    from hddm_flower.evaluation import evaluate
    from hddm_flower.hddm_pipeline import HDDMPipeline

    real, per_step = evaluate.sample_ensemble, []

    def watched(*a, **k):  # the real sampler, its reads noted after every step
        seen = []
        out = real(*a, **k, on_step=lambda i, x: seen.append(len(mode.host_reads)))
        per_step.append([b - a for a, b in zip(seen, seen[1:])])
        return out

    monkeypatch.setattr(evaluate, "sample_ensemble", watched)
    pipe = HDDMPipeline.from_pretrained(device_run[0])
    prompts = evaluate.choose_prompts(Dataset.open(dataset_dir), 3, seed=0)
    with emulated_cuda() as mode:
        pipe.to("cuda")
        _, uncond = pipe.encode_prompt([""])
        for name, reads in (("top2", 1), ("full", 0)):
            per_step.clear()
            _, trace = evaluate.sample_mode(
                pipe.ensemble(), name, prompts, uncond, samples_per_prompt=2, num_steps=4, cfg_scale=2.0,
                threshold=0.2, seed=0, batch_size=4,
            )  # fmt: skip
            assert per_step == [[reads] * 3] * 2, (name, per_step)  # 6 samples in batches of 4 and 2
            assert trace["clamps"]["rows"] > 0


def test_diagnostics_stream_a_bounded_seeded_subsample(device_run, dataset_dir):
    """The velocity diagnostics read at most ``evaluation.diagnostic_images`` held-out samples, in batches, seeded:
    the same numbers from the same seed whatever the batch size's effect on memory."""
    from hddm_flower.data import read_meta, split_size
    from hddm_flower.hddm_pipeline import HDDMPipeline
    from hddm_flower.stages.diagnostics import evaluate, heldout_batches

    ens = HDDMPipeline.from_pretrained(device_run[0]).ensemble()
    sizes = [len(x) for x, _, _ in heldout_batches(Dataset.open(dataset_dir), 7, 3, seed=0)]
    assert sizes == [3, 3, 1]
    val = split_size(read_meta(dataset_dir), None, "val")
    assert sum(len(x) for x, _, _ in heldout_batches(Dataset.open(dataset_dir), 10**6, 64, seed=0)) == val
    a = evaluate(ens, heldout_batches(Dataset.open(dataset_dir), 7, 3, seed=0), seed=0, times=(0.0, 0.5, 1.0))
    b = evaluate(ens, heldout_batches(Dataset.open(dataset_dir), 7, 3, seed=0), seed=0, times=(0.0, 0.5, 1.0))
    assert a == b and a["num_images"] == 7 and len(a["router_top1_accuracy"]) == 3
    first = [y for _, y, _ in heldout_batches(Dataset.open(dataset_dir), 7, 3, seed=0)]
    other = [y for _, y, _ in heldout_batches(Dataset.open(dataset_dir), 7, 3, seed=1)]
    assert not all(torch.equal(p, q) for p, q in zip(first, other))  # the seed picks the subsample


def test_coordinator_threads_follow_the_processes_cpus(tmp_path):
    """0 = the CPUs of the process's affinity mask (not every core of the machine); a configured count as given;
    a negative one is refused naming the key and the file."""
    import os

    from hddm_flower.config.io import load_config
    from hddm_flower.config.rules import ConfigError
    from hddm_flower.devices import coordinator_threads

    before = torch.get_num_threads()
    try:
        assert coordinator_threads(0) == len(os.sched_getaffinity(0)) == torch.get_num_threads()
        assert coordinator_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    bad = tmp_path / "bad.yaml"
    bad.write_text("coordinator:\n  threads: -1\n")
    with pytest.raises(ConfigError, match=r"coordinator\.threads.*bad\.yaml|bad\.yaml.*coordinator\.threads"):
        load_config(bad)


@pytest.mark.parametrize("threads", [1, 0])
def test_the_server_apps_stage_4_runs_on_the_coordinators_threads(
    tiny_config_path, dataset_dir, cache_dir, tmp_path, monkeypatch, threads
):
    """The ServerApp reaches stage 4 (``finish_federated``, once the experts arrived) with torch's CPU threads set
    from ``coordinator.threads`` (0: the CPUs of the process's affinity mask), whatever torch had before. The
    federation is cut short: ``OneShotExperts.start`` hands over at once, and stage 4 notes the thread count."""
    import os

    from flwr.app import Context, RecordDict

    import strategies.server_app as server_app
    from strategies.one_shot import OneShotExperts

    expected = threads or len(os.sched_getaffinity(0))
    seen = []

    def arrived(self, grid, *, timeout, ensemble_fn):  # every expert already here: stage 4 starts
        return ensemble_fn({}, {})

    def stage_4(rounds, cfg, run_dir, dataset, clusters, missing, *, extra):
        seen.append((cfg.coordinator.threads, torch.get_num_threads()))
        return {"metrics": {"times": []}}

    monkeypatch.setattr(OneShotExperts, "start", arrived)
    monkeypatch.setattr(server_app, "finish_federated", stage_4)
    run_config = {
        "config": str(tiny_config_path),
        "run-dir": str(tmp_path / "run"),
        "cache-dir": str(cache_dir),
        "overrides": f"coordinator.threads={threads}",
    }
    before = torch.get_num_threads()
    torch.set_num_threads(expected + 1)  # not what the config asks for
    try:
        server_app.main(None, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    finally:
        torch.set_num_threads(before)
    assert seen == [(threads, expected)]


def test_hddm_assemble_runs_stage_4_on_the_coordinators_threads(
    tiny_config_path, dataset_dir, cache_dir, tmp_path, monkeypatch
):
    """``hddm assemble`` (stage 4 outside a federation: ``finish_run``) runs with torch's CPU threads set from
    ``coordinator.threads``, whatever torch had before."""
    from hddm_flower.cli import main
    from hddm_flower.stages import assemble

    seen = []

    def stage_4(cfg, run_dir, dataset, missing, *, progress):
        seen.append((cfg.coordinator.threads, torch.get_num_threads()))
        return {"experts": []}

    monkeypatch.setattr(assemble, "finish_run", stage_4)
    run = tmp_path / "run"
    (run / "experts" / "expert-0").mkdir(parents=True)
    argv = ["assemble", "--config", str(tiny_config_path), "--cache-dir", str(cache_dir), "--run-dir", str(run)]
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not what the config asks for
    try:
        assert main([*argv, "--set", "coordinator.threads=1"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [(1, 1)]


NEEDS_MALLINFO2 = pytest.mark.skipif((glibc_version() or (0, 0)) < (2, 33), reason="glibc ≥ 2.33 (mallinfo2) only")


def large_block_in_a_process(keep: bool) -> tuple[bool, dict]:
    code = (
        "import json, sys; from hddm_flower.devices import keep_freed_memory; from tests.malloc_books import large_block;"
        "kept = keep_freed_memory() if sys.argv[1] == 'keep' else False; print(json.dumps([kept, large_block()]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", code, "keep" if keep else "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    kept, books = json.loads(out.stdout.splitlines()[-1])
    return kept, books


@NEEDS_MALLINFO2
def test_keep_freed_memory_serves_a_large_block_from_the_heap_and_keeps_it_when_freed():
    """A 20 MiB block in a fresh process: glibc maps it by default; after keep_freed_memory it comes from the heap
    and stays there, free, once freed (what the next batch's tensors reuse instead of faulting pages in)."""
    kept, books = large_block_in_a_process(keep=False)
    assert not kept and books["mapped"] >= BLOCK and books["heap"] < BLOCK
    kept, books = large_block_in_a_process(keep=True)
    assert kept and books["mapped"] == 0 and books["heap"] >= BLOCK and books["free"] >= BLOCK


@NEEDS_MALLINFO2
def test_the_reproduce_workers_keep_freed_memory():
    from hddm_flower.reproduce.training import run_jobs

    for books in run_jobs(large_block, [(), ()], jobs=2, progress=False, what="malloc probe"):
        assert books["mapped"] == 0 and books["heap"] >= BLOCK and books["free"] >= BLOCK
