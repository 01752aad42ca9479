"""The ``hddm`` command line: every stage of a run without Flower.

    hddm prepare                                   build the embedded dataset's cluster shards
    hddm train-expert --expert-id 3 --out DIR      train one expert on its cluster (objective from the config)
    hddm train-router --run-dir RUN                train the router into RUN/router
    hddm assemble --run-dir RUN                    router + evaluation + samples + report for RUN/experts
    hddm sample --run-dir RUN --prompt "dog face"  sample a grid from an assembled run
    hddm add-expert RUN EXPERT_DIR                 add a late (or replacement) expert to an assembled run
    hddm convert-dit DiT-XL-2-256x256.pt --out DIR convert an ImageNet DiT into an expert initialisation
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .config import OBJECTIVES, Config, ConfigError, load_config, parse_overrides

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def _config(args) -> Config:
    overrides = parse_overrides(" ".join(args.set or []))
    if args.config is None and not DEFAULT_CONFIG.exists():
        from .config import config_from_dict

        return config_from_dict({}, "built-in defaults")
    return load_config(args.config or DEFAULT_CONFIG, overrides)


def _dataset(args, cfg: Config) -> Path:
    from .pipeline import prepare_data

    return prepare_data(cfg, args.cache_dir)


def cmd_prepare(args) -> None:
    from .data import read_meta

    cfg = _config(args)
    d = _dataset(args, cfg)
    meta = read_meta(d)
    print(f"dataset: {d}  ({meta['num_images']} images, {meta['num_clusters']} clusters, {meta['text_encoder']})")
    for c in meta["clusters"]:
        print(f"  cluster {c['id']}: {c['size']:5d} images, detail {c['detail']:.3f}, "
              f"{', '.join(list(c['categories'])[:3])}")


def cmd_train_expert(args) -> None:
    from .checkpoints import save_expert
    from .pipeline import assign_objectives, train_one_expert

    cfg = _config(args)
    d = _dataset(args, cfg)
    if not 0 <= args.expert_id < cfg.num_experts:
        raise ConfigError(f"--expert-id {args.expert_id} is outside 0..{cfg.num_experts - 1}")
    objective = args.objective or assign_objectives(cfg, d)[args.expert_id]
    state, model_config, meta = train_one_expert(cfg, d, args.expert_id, objective, device=args.device,
                                                 checkpoint=args.checkpoint, progress=True)
    out = Path(args.out)
    digest = save_expert(out, state, model_config, meta)
    print(f"expert {args.expert_id} ({objective}) written to {out} (sha256 {digest[:12]}…)")


def cmd_train_router(args) -> None:
    from .pipeline import fit_router

    cfg = _config(args)
    run_dir = Path(args.run_dir)
    fit_router(cfg, _dataset(args, cfg), run_dir, progress=True)
    print(f"router written to {run_dir / 'router'}")


def cmd_assemble(args) -> None:
    from .checkpoints import read_expert_meta
    from .pipeline import finish_run

    cfg = _config(args)
    run_dir = Path(args.run_dir)
    folders = sorted((run_dir / "experts").glob("expert-*"))
    if not folders:
        raise FileNotFoundError(f"no expert folders in {run_dir / 'experts'}")
    metas = [read_expert_meta(f) for f in folders]
    have = {int(m["expert_id"]) for m in metas}
    missing = [{"expert_id": k, "reason": "no expert folder"} for k in range(cfg.num_experts) if k not in have]
    report = finish_run(cfg, run_dir, _dataset(args, cfg), missing, progress=True)
    print(f"report: {run_dir / 'report.md'}  ({len(report['experts'])} experts, {len(missing)} missing)")


def cmd_add_expert(args) -> None:
    from .pipeline import add_expert

    run_dir = Path(args.run_dir)
    if not (run_dir / "experts").is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no experts/ folder)")
    cfg = load_config(args.config or run_dir / "config.yaml", parse_overrides(" ".join(args.set or [])))
    report = add_expert(run_dir, Path(args.checkpoint), cfg=cfg, cache_dir=args.cache_dir, replace=args.replace,
                        progress=True)
    added = report["added_experts"][-1]
    print(f"expert {added['expert_id']} ({added['objective']}) added to {run_dir}: {len(report['experts'])} of "
          f"{report['num_experts']} experts, router retrained, report {run_dir / 'report.md'}")


def cmd_sample(args) -> None:
    from .data import TextEncoder, load_uncond, read_meta
    from .pipeline import load_ensemble, sample_grid, save_grid

    cfg = _config(args)
    d = _dataset(args, cfg)
    s = cfg.sampling
    ensemble, _ = load_ensemble(cfg, Path(args.run_dir))
    prompts = args.prompt or s.prompts
    encoder = TextEncoder(cfg.data.text_encoder or None, read_meta(d)["max_caption_tokens"])
    images = sample_grid(ensemble, encoder, prompts, load_uncond(d), samples_per_prompt=s.samples_per_prompt,
                         num_steps=s.num_steps, cfg_scale=s.cfg_scale, seed=s.seed)
    out = Path(args.out or Path(args.run_dir) / "samples-cli.png")
    save_grid(images, len(prompts), out)
    print(json.dumps({"grid": str(out), "prompts": prompts, "routing": s.routing, "steps": s.num_steps}))


def cmd_convert_dit(args) -> None:
    from .convert import read_dit, convert_dit, write_converted

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} exists and is not empty")
    src = read_dit(args.source, num_heads=args.num_heads)
    state, config, report = convert_dit(src, objective=args.objective, caption_channels=args.caption_channels,
                                        reference_timestep=args.reference_timestep, seed=args.seed)
    write_converted(out, state, config, report)
    print(f"{src.format} DiT ({src.arch['depth']} blocks, width {src.arch['hidden_size']}) → {args.objective} "
          f"expert init in {out}; check at τ={args.reference_timestep:g}: {report['check']}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hddm", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help: str, config_default: str = str(DEFAULT_CONFIG)) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--config", type=Path, default=None, help=f"experiment YAML (default {config_default})")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config key, e.g. --set expert.steps=100 (repeatable)")
        sp.add_argument("--cache-dir", default=None, help="dataset cache (default $HDDM_CACHE or ~/.cache/hddm-flower)")
        sp.set_defaults(fn=fn)
        return sp

    add("prepare", cmd_prepare, "build the embedded dataset's per-cluster shards (once per cache)")
    sp = add("train-expert", cmd_train_expert, "train one expert on its cluster, in isolation")
    sp.add_argument("--expert-id", type=int, required=True, help="expert = cluster id")
    sp.add_argument("--objective", choices=OBJECTIVES, help="override the objective the config assigns")
    sp.add_argument("--out", required=True, help="expert folder to write (diffusers layout + hddm_expert.json)")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--checkpoint", type=Path, default=None,
                    help="training-state file: saved every expert.checkpoint_every steps, resumed from if present")
    sp = add("train-router", cmd_train_router, "train the router on all clusters into RUN/router")
    sp.add_argument("--run-dir", required=True)
    sp = add("assemble", cmd_assemble, "train the router, evaluate and sample the experts in RUN/experts")
    sp.add_argument("--run-dir", required=True)
    sp = add("add-expert", cmd_add_expert, "validate a late or replacement expert, add it to an assembled run, "
                                           "retrain the router and re-evaluate (no other expert is retrained)",
             config_default="RUN_DIR/config.yaml")
    sp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (experts/, config.yaml, report.json)")
    sp.add_argument("checkpoint", metavar="CHECKPOINT", help="an expert folder (hddm train-expert --out)")
    sp.add_argument("--replace", action="store_true", help="replace the run's expert with the same id")
    sp = add("sample", cmd_sample, "sample a prompt grid from an assembled run (RUN/experts + RUN/router)")
    sp.add_argument("--run-dir", required=True)
    sp.add_argument("--prompt", action="append", help="a prompt (repeatable; default: the config's prompts)")
    sp.add_argument("--out", help="PNG path (default RUN/samples-cli.png)")
    sp = sub.add_parser("convert-dit", help="ImageNet DiT checkpoint → PixArt AdaLN-Single expert initialisation",
                        description="Convert an original DiT .pt (or .safetensors) or a diffusers DiTTransformer2DModel "
                                    "folder into a diffusers PixArt folder usable as expert.init.")
    sp.add_argument("source", help="DiT-XL-2-256x256.pt, a .safetensors file, or a diffusers DiT folder")
    sp.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    sp.add_argument("--objective", choices=OBJECTIVES, default="fm")
    sp.add_argument("--caption-channels", type=int, default=768, help="width of the text states (CLIP L/14: 768)")
    sp.add_argument("--reference-timestep", type=float, default=500.0,
                    help="DiT timestep at which the converted modulations equal the source's (null class)")
    sp.add_argument("--num-heads", type=int, default=None, help="attention heads (original .pt files do not say)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the re-initialised text path")
    sp.set_defaults(fn=cmd_convert_dit)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        args.fn(args)
    except (ConfigError, ValueError, OSError) as e:
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"hddm {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hddm {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
