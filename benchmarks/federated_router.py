"""Benchmark: the federated router against the central one, trained with the same budget on the same data.

Central: ``fit_router`` on the coordinator's copy of all clusters (``router.steps`` AdamW steps of
``router.batch_size`` images). Federated: ``run_router_rounds`` — Flower's FedAdam/FedAvg strategy and the
ClientApp's real ``train.router`` / ``evaluate.router`` handlers — over one node per cluster (each holds a single
class), delivered in-process (``strategies.inprocess_grid.FakeGrid``: no Ray, no network; the bytes are counted from the
records that would travel). The default variant spends the central budget (rounds × nodes × local batch =
steps × batch images); the others trade rounds for local steps.

Measured per router: held-out top-1 accuracy at ``evaluation.times`` on the pooled validation split with the same
seeded noise for every router (and, for a federated router, the federated counts its nodes reported), the wall
time of the router phase and the bytes on the wire. With ``--experts DIR`` (expert folders ``expert-<k>``, e.g.
from ``hddm train-expert``), the ensemble's FID under top-2 routing with the run's feature classifier, over
``--fid-seeds`` sampling seeds (mean ± std: the FID's own noise).

    python -m benchmarks.federated_router --experts /tmp/experts --out benchmarks/results/federated_router.json

Writes the JSON and a markdown table beside it (``.md``) with the command, the machine and the date.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, machine, write_result
from clients.client_app import app as client_app
from hddm_flower.checkpoints import load_router, save_router
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.data import Dataset
from hddm_flower.evaluation import metrics as M
from hddm_flower.evaluation.evaluate import FEATURE_NET, all_images, choose_prompts, feature_network, sample_mode
from hddm_flower.federation.local import accuracy_from_confusion, router_confusion
from hddm_flower.models import router_config
from hddm_flower.provenance import versions
from hddm_flower.stages.assemble import load_ensemble
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.stages.rounds import node_sizes
from hddm_flower.stages.router import fit_router
from strategies.inprocess_grid import FakeGrid
from strategies.router_rounds import run_router_rounds

VARIANTS = {
    "fedadam-1step": {},  # the default: FedAdam, one SGD step per node and round, rounds = router.steps
    "fedavg-10steps": {"server_optimizer": "avg", "local_steps": 10, "local_lr": 0.05},
    "fedavg-10steps-fedrs": {"server_optimizer": "avg", "local_steps": 10, "local_lr": 0.05, "restricted_softmax": 0.5},
    # Flower's robust aggregations and server-side DP clipping, at fedavg-10steps' settings (docs/deployment.md)
    "fedmedian-10steps": {"server_optimizer": "median", "local_steps": 10, "local_lr": 0.05},
    "fedtrimmedavg-10steps": {"server_optimizer": "trimmed_avg", "local_steps": 10, "local_lr": 0.05, "robust_f": 1},
    "krum-10steps": {"server_optimizer": "krum", "local_steps": 10, "local_lr": 0.05, "robust_f": 1},
    "fedavg-10steps-dp": {
        "server_optimizer": "avg",
        "local_steps": 10,
        "local_lr": 0.05,
        "dp_noise_multiplier": 0.1,
        "dp_clipping_norm": 1.0,
    },
    # the same noise and norm, each node clipping its own update (Flower's client-side fixed clipping)
    "fedavg-10steps-dpclient": {
        "server_optimizer": "avg",
        "local_steps": 10,
        "local_lr": 0.05,
        "dp_noise_multiplier": 0.1,
        "dp_clipping_norm": 1.0,
        "dp_clipping": "client",
    },
}


def heldout(router, val, times, seed) -> list[float]:
    conf, _ = router_confusion(router, val.images, val.labels, times, seed=seed)
    return accuracy_from_confusion(conf)


def prior_gap(router, dataset: Dataset, k: int, n: int = 4096) -> dict:
    """The router at t = 1, where x_t is pure noise and the exact posterior p(k | x_1) is the clusters' training
    frequencies: its mean probabilities over ``n`` noise draws and their total-variation distance to them."""
    freq = torch.tensor([dataset.size([c], "train") for c in range(k)], dtype=torch.float64)
    freq = freq / freq.sum()
    g = torch.Generator().manual_seed(7)
    shape = (n, router.config.in_channels, router.config.sample_size, router.config.sample_size)
    with torch.no_grad():
        probs = router(torch.randn(shape, generator=g), torch.ones(n)).softmax(-1).double().mean(0)
    return {"mean_probs": probs.tolist(), "frequencies": freq.tolist(), "tv": 0.5 * float((probs - freq).abs().sum())}


def fid(cfg, run_dir: Path, router, dataset: Dataset, seeds: int, feature_dir: Path) -> dict:
    """Top-2 ensemble FID (the run's feature classifier, the dataset's images as reference) per sampling seed."""
    ensemble, _ = load_ensemble(cfg, run_dir, router)
    fx, _, _ = feature_network(cfg, dataset, feature_dir, decode=dataset.decoder(cfg))
    ref = fx(all_images(dataset).images)
    ev = cfg.evaluation
    prompts = choose_prompts(dataset, ev.num_prompts, ev.seed)
    values = []
    for s in range(seeds):
        images, _ = sample_mode(
            ensemble,
            "top2",
            prompts,
            dataset.uncond,
            samples_per_prompt=ev.samples_per_prompt,
            num_steps=ev.num_steps or cfg.sampling.num_steps,
            cfg_scale=cfg.sampling.cfg_scale,
            threshold=cfg.sampling.threshold,
            seed=1000 + s,
        )
        values.append(M.frechet_distance(ref, fx(images.flatten(0, 1))))
    return {
        "feature_network": fx.name,
        "values": values,
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    p.add_argument("--experts", default=None, help="folder with expert-<k> folders: adds the ensemble FID")
    p.add_argument("--fid-seeds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "federated_router.json"))
    p.add_argument("--keep", default=None, help="save the trained routers and their results here (for --fid-from)")
    p.add_argument("--fid-from", default=None, help="skip training: the routers and results of an earlier --keep")
    args = p.parse_args()
    started = time.time()
    cfg = load_config(Path(args.config), parse_overrides(" ".join(args.set)))
    dataset = prepare_data(cfg, args.cache_dir)
    meta = dataset.meta
    rc = router_config(
        cfg.router.preset, num_experts=cfg.num_experts, sample_size=meta["image_size"], in_channels=meta["channels"]
    )
    val = dataset.split(None, "val")
    times, seed = list(cfg.evaluation.times), 12345
    work = Path(tempfile.mkdtemp(prefix="hddm-fedrouter-"))
    feature_dir = work / FEATURE_NET

    def run_dir_with(name: str) -> Path:
        d = work / name
        (d / "experts").mkdir(parents=True)
        if args.experts:
            for f in sorted(Path(args.experts).glob("expert-*")):
                os.symlink(f.resolve(), d / "experts" / f.name)
        return d

    load, trained_by = os.getloadavg(), None
    if args.fid_from:  # the routers of an earlier run: only the FID is computed now
        kept = json.loads((Path(args.fid_from) / "results.json").read_text())
        results, trained_by = kept["results"], kept["command"]  # the load is this run's: the FID is measured now
        for name, r in results.items():
            name_cfg = cfg if name == "central" else _federated(cfg, name)
            r["fid"] = fid(
                name_cfg,
                run_dir_with(name),
                load_router(Path(args.fid_from) / name),
                dataset,
                args.fid_seeds,
                feature_dir,
            )
            r["prior_at_t1"] = prior_gap(load_router(Path(args.fid_from) / name), dataset, cfg.num_experts)
            print(json.dumps({name: r["fid"]}), flush=True)
    else:
        results = train_all(args, cfg, dataset, rc, val, times, seed, run_dir_with, feature_dir, load)
    shutil.rmtree(work, ignore_errors=True)
    write(args, cfg, results, times, load, started, trained_by)


def _federated(cfg, name: str):
    fcfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, training="federated", **VARIANTS[name]))
    return fcfg.validate()


def train_all(args, cfg, dataset, rc, val, times, seed, run_dir_with, feature_dir, load) -> dict:
    results = {}

    def keep(name: str, router, meta: dict) -> None:  # after each router: a long run can be stopped and reused
        if args.keep:
            save_router(Path(args.keep) / name, router, meta)
            command = "python -m benchmarks.federated_router " + " ".join(sys.argv[1:])
            (Path(args.keep) / "results.json").write_text(
                json.dumps({"results": results, "load": load, "command": command})
            )

    d = run_dir_with("central")
    t0 = time.perf_counter()
    router = fit_router(cfg, dataset, d)
    results["central"] = {
        "training": "central (AdamW on all clusters)",
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "images_seen": cfg.router.steps * cfg.router.batch_size,
        "rounds": 0,
        "bytes_total": 0,
        "top1": heldout(router, val, times, seed),
        "prior_at_t1": prior_gap(router, dataset, cfg.num_experts),
    }
    if args.experts:
        results["central"]["fid"] = fid(cfg, d, router, dataset, args.fid_seeds, feature_dir)
    print(json.dumps({"central": results["central"]}), flush=True)
    keep("central", router, {"training": "central"})
    clusters = {100 + k: [k] for k in range(cfg.num_experts)}  # one node per cluster: single-class nodes
    for name in [v for v in args.variants.split(",") if v]:
        fcfg = _federated(cfg, name)
        grid = FakeGrid(client_app, {n: {"cache-dir": args.cache_dir or ""} for n in clusters})
        t0 = time.perf_counter()
        router, record = run_router_rounds(
            grid, fcfg, clusters, rc, sizes=node_sizes(dataset, clusters), timeout=3600, cache_dir=args.cache_dir or ""
        )
        wall = time.perf_counter() - t0
        d = run_dir_with(name)
        results[name] = {
            "training": f"{record['strategy']}, {record['local_steps']} local SGD step(s) per round",
            "settings": VARIANTS[name],
            "wall_seconds": round(wall, 1),
            "slowest_node_seconds": record["slowest_node_seconds"],
            "images_seen": record["images_seen"],
            "rounds": record["rounds"],
            "bytes_per_round": record["bytes_per_round"],
            "bytes_total": record["bytes_sent"] + record["bytes_received"],
            "top1": heldout(router, val, times, seed),
            "top1_federated_counts": record["heldout"].get("top1"),
            "top1_per_round": record["heldout_per_round"],
            "prior_at_t1": prior_gap(router, dataset, cfg.num_experts),
        }
        if args.experts:
            results[name]["fid"] = fid(fcfg, d, router, dataset, args.fid_seeds, feature_dir)
        print(json.dumps({name: results[name]}), flush=True)
        keep(name, router, {"training": "federated", **VARIANTS[name]})
    return results


def write(args, cfg, results: dict, times: list, load, started: float, trained_by: str | None) -> None:
    command = "python -m benchmarks.federated_router " + " ".join(sys.argv[1:])
    if trained_by:  # the routers came from an earlier run
        command = f"{trained_by}` then `{command}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = {
        "command": command,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit.strip(),
        "machine": f"{machine()}, load {load[0]:.1f} at start",
        "minutes": round((time.time() - started) / 60, 1),
        "times": times,
        "config": {"router": dataclasses.asdict(cfg.router), "num_experts": cfg.num_experts},
        "versions": versions(),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out), out)
    Path(args.out).with_suffix(".md").write_text(render(out))
    print(render(out))


def render(out: dict) -> str:
    t = out["times"]
    lines = [
        f"Federated vs central router ({out['date']}, commit {out['commit']}, {out['machine']}; "
        f"{out['minutes']} min). Produced by `{out['command']}`.",
        "",
        "| router | rounds | images seen | wall s | bytes on the wire | "
        + " | ".join(f"top-1 t={x:g}" for x in t)
        + " | TV to the prior at t=1 | top-2 FID (mean ± std) |",
        "|---" * (7 + len(t)) + "|",
    ]
    for name, r in out["results"].items():
        f = r.get("fid")
        fid_cell = f"{f['mean']:.2f} ± {f['std']:.2f}" if f else "–"
        tv = f"{r['prior_at_t1']['tv']:.3f}" if r.get("prior_at_t1") else "–"
        lines.append(
            f"| {name}: {r['training']} | {r['rounds']} | {r['images_seen']} | {r['wall_seconds']:.0f} "
            f"| {r['bytes_total'] / 2**20:.0f} MiB | "
            + " | ".join(f"{a:.3f}" for a in r["top1"])
            + f" | {tv} | {fid_cell} |"
        )
    fx = next((r["fid"]["feature_network"] for r in out["results"].values() if r.get("fid")), None)
    if fx:
        lines += ["", f"FID features: {fx}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
