"""The ``hddm`` command line: every stage of a run without Flower.

hddm prepare [--out DIR]                       encode image + caption shards (or the embedded dataset)
hddm cluster [--encoded DIR] [--out DIR]       DINOv2 (or offline) features → K per-cluster shard sets
hddm train-expert --expert-id 3 --out DIR      train one expert on its cluster (objective from the config)
hddm train-router --run-dir RUN                train the router into RUN/router
hddm assemble --run-dir RUN                    router + evaluation + samples + report for RUN/experts
hddm evaluate --run-dir RUN                    metrics for every routing mode, report.md/json, grids, plots
hddm reproduce --out DIR                       8FM, 2DDPM:6FM, 4:4 and a monolith: the paper's two tables
hddm tables OUT/manifest.json --trainings 0 2  a Gaussian-mixture run's tables over some of its trainings
hddm sample --run-dir RUN --prompt "dog face"  sample a grid from an assembled run
hddm add-expert RUN EXPERT_DIR                 add a late (or replacement) expert to an assembled run
hddm convert-dit DiT-XL-2-256x256.pt --out DIR convert an ImageNet DiT into an expert initialisation

Its length is the parser: one subcommand per stage with its options and help text, each command a few lines over its
stage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .choices import OBJECTIVES
from .config.io import load_config, parse_overrides
from .config.rules import ConfigError
from .config.schema import Config, shipped_configs
from .rundir import CONFIG, EXPERTS, ROUTER

if TYPE_CHECKING:  # the command line imports the data package when a command needs it
    from .data import Dataset

DEFAULT_CONFIG = shipped_configs() / "default.yaml"


def _config(args, run_dir: Path | None = None) -> Config:
    overrides = parse_overrides(" ".join(args.set or []))
    if getattr(args, "coordinator_device", None):
        from .devices import resolve_device

        resolve_device(args.coordinator_device)  # a device this machine lacks fails here, before any work
        overrides["coordinator.device"] = args.coordinator_device
    if args.config is None and run_dir is not None and (run_dir / CONFIG).is_file():
        return load_config(run_dir / CONFIG, overrides)  # the run's resolved config
    if args.config is None and not DEFAULT_CONFIG.exists():
        from .config.io import config_from_dict

        return config_from_dict({}, "built-in defaults")
    return load_config(args.config or DEFAULT_CONFIG, overrides)


def _dataset(args, cfg: Config):
    from .stages.prepare import prepare_data

    return prepare_data(cfg, args.cache_dir)


def _print_clusters(dataset: Dataset) -> None:
    """What a prepared dataset holds, cluster by cluster (``dataset``: a :class:`~hddm_flower.data.Dataset`)."""
    d, meta = dataset.root, dataset.meta
    print(f"dataset: {d}  ({meta['num_images']} images, {meta['num_clusters']} clusters, {meta['text_encoder']})")
    for c in meta["clusters"]:
        print(
            f"  cluster {c['id']}: {c['size']:5d} images, detail {c['detail']:.4f}, "
            f"{', '.join(list(c['categories'])[:3])}"
        )


def _embedded(cfg: Config) -> bool:
    d = cfg.data
    return d.name == "twemoji" and not d.vae and d.cluster_features != "dinov2"


def _encoded_dir(args, cfg: Config) -> Path:
    from .data import default_cache_dir
    from .stages.prepare import scaled_data_dirs

    cache = Path(args.cache_dir or cfg.data.cache_dir or default_cache_dir())
    return scaled_data_dirs(cfg, cache)[0]


def cmd_prepare(args) -> None:
    from .ingest import prepare_from_config

    cfg = _config(args)
    if args.skip_bad_shards:
        cfg.data.skip_bad_shards = True
    if cfg.data.partition == "institution":  # one institution's own data, one cluster (no clustering)
        from .stages.prepare import prepare_institution

        d = prepare_institution(cfg, args.cache_dir or None, progress=True)
        _print_clusters(d)
        print(f"  one institution's data: pass {d.root} as this SuperNode's --node-config data-dir")
        return
    if _embedded(cfg) and args.out is None and args.repeat == 1:  # the embedded default, clustered in one go
        _print_clusters(_dataset(args, cfg))
        return
    out = Path(args.out) if args.out else _encoded_dir(args, cfg)
    m = prepare_from_config(cfg.data, out, repeat=args.repeat, progress=True)
    skipped = ", ".join(f"{k} {v}" for k, v in m["skipped"].items() if v) or "none"
    print(
        f"encoded: {out}  ({m['num_samples']} samples in {len(m['shards'])} shards; skipped: {skipped}; "
        f"{len(m['skipped_shards'])} shards skipped)"
    )
    latent = m["latent"]["name"] if m["latent"] else "pixels"
    print(f"  {m['pixel_size']}px → {latent} {m['channels']}×{m['image_size']}², text {m['text_encoder']['name']}")


def cmd_cluster(args) -> None:
    from .data import Dataset, check_clusters, default_cache_dir
    from .ingest import prepare_from_config
    from .stages.prepare import cluster_with_config, scaled_data_dirs

    cfg = _config(args)
    d = cfg.data
    if args.encoded:
        encoded = [Path(e) for e in args.encoded]
    else:
        encoded = _encoded_dir(args, cfg)
        if not (encoded / "manifest.json").exists():
            prepare_from_config(d, encoded, progress=True)
    cache = Path(args.cache_dir or d.cache_dir or default_cache_dir())
    out = Path(args.out) if args.out else scaled_data_dirs(cfg, cache)[1]
    cluster_with_config(cfg, encoded, out, progress=True)
    dataset = Dataset.open(out)
    check_clusters(dataset.meta, cfg.num_experts, str(out))
    _print_clusters(dataset)
    print(f"  shard sets: {out}/cluster-*/  assignments: {out / 'assignments.csv'}  report: {out / 'report.md'}")


def cmd_train_expert(args) -> None:
    from .checkpoints import save_expert
    from .data import Dataset
    from .stages.expert import train_one_expert
    from .stages.prepare import assign_objectives

    cfg = _config(args)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads}: expected at least 1")
        import torch

        torch.set_num_threads(args.threads)
    cluster = None
    if args.cluster_data:  # a new institution's own shard set (it joins with hddm add-expert --cluster-data)
        d = Dataset.open(args.cluster_data)
        meta = d.meta
        if "cluster_set" not in meta:
            raise ConfigError(
                f"--cluster-data {d.root} is not one cluster's shard set (its meta.json has no cluster_set)"
            )
        if args.objective is None:
            raise ConfigError(
                "--cluster-data needs --objective (fm or ddpm): the config's assignment covers only "
                "the run's own clusters"
            )
        if args.expert_id < 0:
            raise ConfigError(f"--expert-id {args.expert_id} is negative")
        cluster = meta["cluster_set"]
    else:
        d = _dataset(args, cfg)
        if not 0 <= args.expert_id < cfg.num_experts:
            raise ConfigError(f"--expert-id {args.expert_id} is outside 0..{cfg.num_experts - 1}")
    objective = args.objective or assign_objectives(cfg, d)[args.expert_id]
    state, model_config, meta = train_one_expert(
        cfg,
        d,
        args.expert_id,
        objective,
        device=args.device,
        checkpoint=args.checkpoint,
        progress=True,
        cluster=cluster,
    )
    out = Path(args.out)
    digest = save_expert(out, state, model_config, meta, dtype=cfg.expert.weights_dtype)
    print(f"expert {args.expert_id} ({objective}) written to {out} (sha256 {digest[:12]}…)")


def cmd_train_router(args) -> None:
    from .stages.router import fit_router

    cfg = _config(args)
    run_dir = Path(args.run_dir)
    fit_router(cfg, _dataset(args, cfg), run_dir, progress=True)
    print(f"router written to {run_dir / ROUTER} (device {cfg.coordinator.device})")


def cmd_assemble(args) -> None:
    from .devices import coordinator_threads
    from .rundir import write_config
    from .stages.assemble import finish_run

    cfg = _config(args)
    run_dir = Path(args.run_dir)
    missing = _missing(cfg, run_dir)
    dataset = _dataset(args, cfg)
    coordinator_threads(cfg.coordinator.threads)
    write_config(run_dir / CONFIG, cfg, f"resolved from {args.config or DEFAULT_CONFIG} by hddm assemble")
    report = finish_run(cfg, run_dir, dataset, missing, progress=True)
    print(f"report: {run_dir / 'report.md'}  ({len(report['experts'])} experts, {len(missing)} missing)")


def _missing(cfg: Config, run_dir: Path) -> list[dict]:
    from .rundir import experts_dir, missing_experts, present_experts

    if not present_experts(run_dir):
        raise FileNotFoundError(f"no expert folders in {experts_dir(run_dir)}")
    return missing_experts(run_dir, cfg.num_experts)


def cmd_evaluate(args) -> None:
    from .devices import coordinator_threads
    from .evaluation.evaluate import parse_mode
    from .rundir import read_report
    from .stages.assemble import evaluate_and_report

    run_dir = Path(args.run_dir)
    if not (run_dir / ROUTER).is_dir():
        raise FileNotFoundError(f"{run_dir / ROUTER} does not exist: train the router first (hddm train-router)")
    cfg = _config(args, run_dir)
    coordinator_threads(cfg.coordinator.threads)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    for m in modes or []:
        parse_mode(m)
    missing = _missing(cfg, run_dir)
    extra = {k: v for k, v in read_report(run_dir).items() if k == "flower"}
    report = evaluate_and_report(cfg, run_dir, _dataset(args, cfg), missing, extra=extra, modes=modes, progress=True)
    ev = report["metrics"]["evaluation"]
    print(f"report: {run_dir / 'report.md'}  (features: {ev['feature_network']})")
    for mode, x in ev["modes"].items():
        kid = "–" if x["kid"] is None else f"{x['kid']:.4f}"
        print(
            f"  {mode:>10}: FID {x['fid']:.2f}  KID {kid}  adherence {x['adherence']:.3f}  "
            f"diversity {x['lpips']['mean']:.3f}"
        )
    rows = report["metrics"]["sampling"]["adherence"]
    print(f"  sample rows: adherence {' '.join('–' if a is None else f'{a:.2f}' for a in rows['per_prompt'])}")


def cmd_reproduce(args) -> None:
    from .devices import keep_freed_memory
    from .reproduce.run import reproduce

    keep_freed_memory()  # this process's tensors reuse the memory they free (its workers': run_jobs)
    cfg = _config(args)
    out = Path(args.out)
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be ≥ 1, got {args.jobs}")
    result = reproduce(
        cfg, out, _dataset(args, cfg), jobs=args.jobs, command=args.command_line, progress=True, reuse=args.reuse
    )
    print(f"tables: {out / 'tables.md'}  manifest: {out / 'manifest.json'}  ({result['seconds']:.0f} s)")


def cmd_tables(args) -> None:
    from .gmm.reading import read_over_trainings
    from .provenance import source
    from .safeio import write_atomic

    path = Path(args.manifest)
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if args.out is not None:  # checked before any work: nothing but an earlier reading is ever replaced
        out = Path(args.out)
        record_path = out.with_suffix(".json")
        if out.suffix != ".md":
            raise ValueError(f"--out {out}: name a .md file (the paired differences go beside it as .json)")
        for target in (out, record_path):
            if target.exists() and not _an_earlier_reading(record_path):
                raise ValueError(f"--out {out}: {target} exists and is not an earlier `hddm tables` reading")
    tables, record = read_over_trainings(manifest, args.trainings, str(path), args.command_line)
    if args.out is None:
        print(tables)
        return
    write_atomic(record_path, json.dumps(record | {"source": source()}, indent=2))
    try:
        write_atomic(out, tables)
    except OSError:
        record_path.unlink(missing_ok=True)  # no record without its tables
        raise
    print(f"tables: {out}  paired differences: {record_path}")


def _an_earlier_reading(record_path: Path) -> bool:
    """Whether ``record_path`` is the record an earlier ``hddm tables --out`` wrote (so its pair may be replaced)."""
    try:
        return json.loads(record_path.read_text()).get("command", "").startswith("hddm tables ")
    except (OSError, ValueError, AttributeError):
        return False


def cmd_add_expert(args) -> None:
    from .stages.add_expert import add_expert

    run_dir = Path(args.run_dir)
    if not (run_dir / EXPERTS).is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {EXPERTS}/ folder)")
    overrides = parse_overrides(" ".join(args.set or []))
    if args.coordinator_device:
        overrides["coordinator.device"] = args.coordinator_device
    cfg = load_config(args.config or run_dir / CONFIG, overrides)
    report = add_expert(
        run_dir,
        Path(args.checkpoint),
        cfg=cfg,
        cache_dir=args.cache_dir,
        replace=args.replace,
        cluster_data=args.cluster_data,
        progress=True,
    )
    added = report["added_experts"][-1]
    print(
        f"expert {added['expert_id']} ({added['objective']}) added to {run_dir}: {len(report['experts'])} of "
        f"{report['num_experts']} experts, router retrained, report {run_dir / 'report.md'}"
    )


def _check_run(run_dir: Path) -> list[int]:
    """The expert ids present in an assembled run directory; a ConfigError if it is not one."""
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} does not exist")
    from .rundir import MODEL_INDEX, present_experts

    lacks = [n for n in (CONFIG, MODEL_INDEX, ROUTER, EXPERTS) if not (run_dir / n).exists()]
    if lacks:
        hint = f"; `hddm evaluate --run-dir RUN` writes {MODEL_INDEX}" if lacks == [MODEL_INDEX] else ""
        raise ConfigError(f"--run-dir {run_dir} is not an assembled run (no {', '.join(lacks)}){hint}")
    ids = sorted(present_experts(run_dir))
    if not ids:
        raise ConfigError(f"--run-dir {run_dir} holds no expert folders (experts/expert-*)")
    return ids


def _check_png_out(out: Path) -> None:
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out} must be a .png file")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory")
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise ConfigError(f"--out {out}: the folder {out.parent} does not exist or is not writable")


def cmd_sample(args) -> None:
    run_dir = Path(args.run_dir)
    cfg = _config(args) if args.config else None  # an explicit --config is checked first
    present = _check_run(run_dir)
    cfg = cfg or _config(args, run_dir)  # the run's own config.yaml, with the --set overrides
    s = cfg.sampling
    prompts = args.prompt or s.prompts
    empty = [p for p in prompts if not p.strip()]
    if empty:
        raise ConfigError(f"--prompt {empty[0]!r} is empty; give the text to sample")
    out = Path(args.out) if args.out else run_dir / "samples-cli.png"
    _check_png_out(out)
    if s.routing == "top_k" and not 1 <= s.top_k <= len(present):
        raise ConfigError(f"sampling.top_k={s.top_k} but this run has {len(present)} experts ({present})")
    # every argument checked: now load the pipeline (progress bars on the terminal)
    from .devices import resolve_device
    from .evaluation.report import save_grid
    from .hddm_pipeline import load_pipeline, sample_images, sampling_defaults

    pipe = load_pipeline(run_dir, progress=True, sampling=sampling_defaults(cfg))
    pipe.to(resolve_device(cfg.coordinator.device))
    images = sample_images(pipe, prompts, samples_per_prompt=s.samples_per_prompt, seed=s.seed)
    save_grid(images, len(prompts), out)
    record = {
        "grid": str(out),
        "run_dir": str(run_dir),
        "config": str(args.config or run_dir / "config.yaml"),
        "overrides": args.set or [],
        "prompts": prompts,
        "samples_per_prompt": s.samples_per_prompt,
        "seed": s.seed,
        "experts": present,
        **pipe.config.sampling,
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record))


def cmd_convert_dit(args) -> None:
    from .convert import convert_dit, read_dit, write_converted

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} exists and is not empty")
    src = read_dit(args.source, num_heads=args.num_heads)
    state, config, report = convert_dit(
        src,
        objective=args.objective,
        caption_channels=args.caption_channels,
        reference_timestep=args.reference_timestep,
        seed=args.seed,
    )
    write_converted(out, state, config, report)
    print(
        f"{src.format} DiT ({src.arch['depth']} blocks, width {src.arch['hidden_size']}) → {args.objective} "
        f"expert init in {out}; check at τ={args.reference_timestep:g}: {report['check']}"
    )


def build_parser() -> argparse.ArgumentParser:
    usage = __doc__.rsplit("\n\n", 1)[0]  # the docstring's last paragraph is for readers of the code
    p = argparse.ArgumentParser(prog="hddm", description=usage, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--version", action="version", version=_versions())
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help: str, config_default: str = str(DEFAULT_CONFIG)) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--config", type=Path, default=None, help=f"experiment YAML (default {config_default})")
        sp.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a config key, e.g. --set expert.steps=100 (repeatable)",
        )
        sp.add_argument("--cache-dir", default=None, help="dataset cache (default $HDDM_CACHE or ~/.cache/hddm-flower)")
        sp.set_defaults(fn=fn)
        return sp

    def device_option(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--device",
            dest="coordinator_device",
            default=None,
            help="where router training, sampling, decoding and features run: auto (cuda when present), cpu, "
            "cuda or cuda:N (default: coordinator.device)",
        )

    sp = add(
        "prepare",
        cmd_prepare,
        "encode images + captions (webdataset shards, a folder, or the embedded "
        "dataset) into encoded shards; the embedded default is also clustered",
    )
    sp.add_argument("--out", default=None, help="encoded output folder (default: in the cache); rerun to resume")
    sp.add_argument("--repeat", type=int, default=1, help="embedded dataset only: repeat it N times (benchmarks)")
    sp.add_argument(
        "--skip-bad-shards",
        action="store_true",
        help="skip a missing or unreadable input shard (listed in the manifest) instead of stopping",
    )
    sp = add("cluster", cmd_cluster, "features + hierarchical k-means → one shard set per cluster/institution")
    sp.add_argument(
        "--encoded",
        action="append",
        default=None,
        help="`hddm prepare` output (default: prepared in the cache); repeat it to cluster the outputs "
        "of several machines together",
    )
    sp.add_argument("--out", default=None, help="clustered dataset folder to write (default: in the cache)")
    sp = add("train-expert", cmd_train_expert, "train one expert on its cluster, in isolation")
    sp.add_argument("--expert-id", type=int, required=True, help="expert = cluster id")
    sp.add_argument("--objective", choices=OBJECTIVES, help="override the objective the config assigns")
    sp.add_argument("--out", required=True, help="expert folder to write (diffusers layout + hddm_expert.json)")
    sp.add_argument(
        "--cluster-data",
        default=None,
        metavar="DIR",
        help="train on this shard set (a cluster-k folder) instead of the config's cluster --expert-id: "
        "an institution joining an assembled run with data it never had (needs --objective)",
    )
    sp.add_argument("--device", default="cpu")
    sp.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of torch (default: torch's own, one per core); give each of several trainings that "
        "share one machine its share, e.g. --threads 1 for two on 2 cores (else they spin against each other)",
    )
    sp.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="training-state file: saved every expert.checkpoint_every steps, resumed from if present",
    )
    sp = add("train-router", cmd_train_router, "train the router on all clusters into RUN/router")
    sp.add_argument("--run-dir", required=True)
    device_option(sp)
    sp = add("assemble", cmd_assemble, "train the router, evaluate and sample the experts in RUN/experts")
    sp.add_argument("--run-dir", required=True)
    device_option(sp)
    sp = add(
        "evaluate",
        cmd_evaluate,
        "evaluate an assembled run (RUN/experts + RUN/router): every routing mode, "
        "per-expert quality, router accuracy vs t; writes report.md/json, grids, plots",
    )
    sp.add_argument("--run-dir", required=True)
    device_option(sp)
    sp.add_argument(
        "--modes",
        help="comma-separated routing modes, e.g. top1,top2,full,threshold,oracle "
        "(default: evaluation.routing_modes; --config defaults to RUN/config.yaml)",
    )
    sp = add(
        "reproduce",
        cmd_reproduce,
        "train (or reuse) the experts of 8FM, 2DDPM:6FM and 4DDPM:4FM and a "
        "monolith of equal compute; write the paper's two tables side by side",
    )
    sp.add_argument("--out", required=True, help="output folder (experts are reused from it on a second run)")
    device_option(sp)
    sp.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="train the experts and the monolith in this many processes (one torch thread each); default 1",
    )
    sp.add_argument(
        "--reuse",
        nargs="+",
        default=[],
        metavar="DIR",
        help="other --out folders: their experts, monoliths and routers are copied in where the fingerprints match "
        "(e.g. another budget protocol whose experts train alike), and on a gmm dataset their rows' results",
    )
    sp = sub.add_parser(
        "tables",
        help="a Gaussian-mixture reproduce run's tables read again from its manifest, over the trainings named",
        description="Render the tables of an `hddm reproduce` run on a Gaussian mixture from its manifest.json, "
        "over some of its trainings (e.g. leaving out the one a learning rate was picked on): each interval over "
        "trainings and each paired difference recomputed over those.",
    )
    sp.add_argument("manifest", metavar="MANIFEST", help="OUT/manifest.json of a finished hddm reproduce run")
    sp.add_argument(
        "--trainings",
        type=int,
        nargs="+",
        metavar="I",
        help="the trainings to read over, e.g. 0 1 2 4 5 6 (default: all)",
    )
    sp.add_argument("--out", help="FILE.md to write, the paired differences beside it as FILE.json (default: print)")
    sp.set_defaults(fn=cmd_tables)
    sp = add(
        "add-expert",
        cmd_add_expert,
        "validate a late or replacement expert, add it to an assembled run, "
        "retrain the router and re-evaluate (no other expert is retrained)",
        config_default="RUN_DIR/config.yaml",
    )
    sp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (experts/, config.yaml, report.json)")
    sp.add_argument("checkpoint", metavar="CHECKPOINT", help="an expert folder (hddm train-expert --out)")
    sp.add_argument("--replace", action="store_true", help="replace the run's expert with the same id")
    device_option(sp)
    sp.add_argument(
        "--cluster-data",
        default=None,
        metavar="DIR",
        help="for a new expert id (= num_experts): its cluster's shard set (a cluster-k folder prepared "
        "like the run's data), added to the run as a new cluster for the router and evaluation",
    )
    sp = add(
        "sample",
        cmd_sample,
        "sample a prompt grid from an assembled run with its own settings (RUN/config.yaml; --set overrides "
        "them, e.g. --set sampling.num_steps=20, and the grid's .json records them)",
        config_default="RUN/config.yaml",
    )
    sp.add_argument("--run-dir", required=True)
    device_option(sp)
    sp.add_argument("--prompt", action="append", help="a prompt (repeatable; default: the config's prompts)")
    sp.add_argument("--out", help="PNG path (default RUN/samples-cli.png); the settings go beside it as .json")
    sp = sub.add_parser(
        "convert-dit",
        help="ImageNet DiT checkpoint → PixArt AdaLN-Single expert initialisation",
        description="Convert an original DiT .pt (or .safetensors) or a diffusers DiTTransformer2DModel "
        "folder into a diffusers PixArt folder usable as expert.init.",
    )
    sp.add_argument("source", help="DiT-XL-2-256x256.pt, a .safetensors file, or a diffusers DiT folder")
    sp.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    sp.add_argument("--objective", choices=OBJECTIVES, default="fm")
    sp.add_argument("--caption-channels", type=int, default=768, help="width of the text states (CLIP L/14: 768)")
    sp.add_argument(
        "--reference-timestep",
        type=float,
        default=500.0,
        help="DiT timestep at which the converted modulations equal the source's (null class)",
    )
    sp.add_argument("--num-heads", type=int, default=None, help="attention heads (original .pt files do not say)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the re-initialised text path")
    sp.set_defaults(fn=cmd_convert_dit)
    return p


def _versions() -> str:
    """``hddm-flower X (flwr …, torch …, diffusers …)`` from the installed metadata (nothing is imported)."""
    from .provenance import package_version

    found = ", ".join(f"{name} {package_version(name)}" for name in ("flwr", "torch", "diffusers", "transformers"))
    return f"hddm-flower {__version__} ({found})"


def _close_progress_bars() -> None:
    """Close every open tqdm bar (a bar left open would print after, or glue itself to, the error line)."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["hddm", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bars from transformers
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    try:
        args.fn(args)
    except (ConfigError, ValueError, OSError) as e:
        _close_progress_bars()
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"hddm {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _close_progress_bars()
        print(f"hddm {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
