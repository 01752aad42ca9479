"""HDDMPipeline over a run directory, and the experts driven by diffusers' own schedulers."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler, PixArtTransformer2DModel
from PIL import Image

from hddm_flower.checkpoints import SCHEDULER, scheduler_config, time_convention
from hddm_flower.data import Dataset
from hddm_flower.ensemble import euler_sample
from hddm_flower.experts import FlowMatchingExpert
from hddm_flower.hddm_pipeline import HDDMPipeline, read_uncond
from hddm_flower.models import ExpertNet, TextCond
from hddm_flower.objectives import FM_TIME_SCALE, ddpm_alpha_bar

PRESENT = (0, 1, 3)  # expert 2 lost: the pipeline must cope with gaps
WEIGHT_LOADS: list[str] = []  # the expert folders whose weights the run fixture's stage 4 read, in order


@pytest.fixture(scope="module")
def run(tiny_config, dataset_dir, tmp_path_factory):
    """A finished tiny run (4 expert ids, 3 present: FM 0 and 3, DDPM 1) assembled by the real stages; every
    expert transformer that stage 4 reads from disk is noted in WEIGHT_LOADS."""
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.rundir import write_config
    from hddm_flower.stages.assemble import finish_run
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives

    run = tmp_path_factory.mktemp("run")
    write_config(run / "config.yaml", tiny_config, "the tiny test config")
    objectives = assign_objectives(tiny_config, Dataset.open(dataset_dir))
    for k in PRESENT:
        save_expert(
            run / "experts" / f"expert-{k}", *train_one_expert(tiny_config, Dataset.open(dataset_dir), k, objectives[k])
        )
    load = PixArtTransformer2DModel.from_pretrained

    def noted(cls, folder, *args, **kwargs):
        WEIGHT_LOADS.append(Path(folder).name)
        return load(folder, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PixArtTransformer2DModel, "from_pretrained", classmethod(noted))
        finish_run(tiny_config, run, Dataset.open(dataset_dir), [{"expert_id": 2, "reason": "lost"}])
    return run


def test_stage_4_reads_each_expert_once(run):
    """The report evaluates the ensemble and samples its grid from the same loaded components."""
    assert WEIGHT_LOADS == [f"expert-{k}" for k in PRESENT]


@pytest.fixture(scope="module")
def pipe(run):
    return HDDMPipeline.from_pretrained(run)


def test_run_directory_is_a_diffusers_pipeline(run, pipe, tiny_config, dataset_dir):
    from hddm_flower.data import Dataset, read_meta
    from hddm_flower.ensemble import sample_ensemble
    from hddm_flower.models import TextCond
    from hddm_flower.stages.assemble import load_ensemble
    from hddm_flower.text import TextEncoder

    index = json.loads((run / "model_index.json").read_text())
    assert index["_class_name"] == "HDDMPipeline" and index["router"] == ["hddm_flower.models", "Router"]
    assert index["sampling"]["num_inference_steps"] == tiny_config.sampling.num_steps
    assert index["text"]["max_length"] == 8 and index["text"]["path"] is None  # the MiniLM in the wheel
    assert pipe.experts.ids == list(PRESENT) and pipe.experts.config.num_experts == 4
    assert type(pipe.feature_net).__name__ == "FeatureClassifier" and pipe.vae is None
    x = torch.randn(2, 3, 4, 4) * 3
    assert pipe.pixels(x) is x  # a pixel run's metrics read its samples unclamped, as the dataset's decoder gives them
    image = pipe("red apple", num_inference_steps=10).images[0]
    assert isinstance(image, Image.Image) and image.size == (16, 16)
    # the same images as the project's sampler: same noise, same ensemble, same CFG
    prompts, g = ["dog face", "japan flag"], torch.Generator().manual_seed(3)
    x = pipe(prompts, num_inference_steps=3, num_images_per_prompt=2, generator=g, output_type="latent").images
    ensemble, _ = load_ensemble(tiny_config, run)
    cond, _ = TextEncoder(None, read_meta(dataset_dir)["max_caption_tokens"]).encode(prompts)
    cond = TextCond(cond.states.repeat_interleave(2, 0), cond.mask.repeat_interleave(2, 0))  # prompt-major
    uncond = Dataset.open(dataset_dir).uncond
    un = TextCond(uncond.states.expand(4, -1, -1), uncond.mask.expand(4, -1))
    g_ref = torch.Generator().manual_seed(3)
    size = ensemble.router.config.sample_size
    noise = torch.randn(4, ensemble.router.config.in_channels, size, size, generator=g_ref)
    cfg_scale = tiny_config.sampling.cfg_scale
    ref = sample_ensemble(ensemble, noise, cond, un, num_steps=3, cfg_scale=cfg_scale, generator=g_ref)
    torch.testing.assert_close(x, ref, rtol=0, atol=0)
    pt = pipe(prompts, num_inference_steps=3, num_images_per_prompt=2, generator=g.manual_seed(3), output_type="pt")
    torch.testing.assert_close(pt.images, (ref.clamp(-1, 1) + 1) / 2)
    arr = pipe("dog face", num_inference_steps=2, output_type="np", routing="full").images
    assert arr.shape == (1, 16, 16, 3) and 0 <= arr.min() and arr.max() <= 1
    # the stored empty caption is what the text encoder gives for ""
    stored = read_uncond(run / "uncond.safetensors")
    fresh, _ = pipe.text_encoder_wrapper.encode([""])
    torch.testing.assert_close(stored.states, fresh.states, atol=1e-5, rtol=0)
    for k in PRESENT:
        assert (run / "experts" / f"expert-{k}" / "uncond.safetensors").is_file()
        ref_file = json.loads((run / "experts" / f"expert-{k}" / "text_encoder.json").read_text())
        assert ref_file["max_length"] == 8 and ref_file["name"].startswith("bert:")


def test_model_cards_in_the_run_and_every_expert_folder(run):
    card = (run / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "CC-BY 4.0" in card and "Twitter" in card  # data attribution
    assert "HDDMPipeline.from_pretrained" in card and "hddm sample --run-dir" in card
    assert "3 of 4 experts" in card and "device-hours" in card and "2 (lost)" in card
    # trust_remote_code: what it executes, and the safe route that executes nothing from the folder
    assert "`HDDMPipeline.from_pretrained` runs no code from the folder" in card
    assert 'custom_pipeline="pipeline", trust_remote_code=True)`, *executes* the folder\'s `pipeline.py`' in card
    assert "someone else wrote, that is their code running with your rights" in card
    assert "`hddm_flower.hddm_pipeline.load_with_diffusers(folder)`" in card and "refuses a `pipeline.py`" in card
    assert card.index("HDDMPipeline.from_pretrained") < card.index("trust_remote_code")  # the safe route first
    fm, ddpm = (
        (run / "experts" / "expert-0" / "README.md").read_text(),
        (run / "experts" / "expert-1" / "README.md").read_text(),
    )
    assert "FlowMatchEulerDiscreteScheduler" in fm and "linspace(1, 0, n + 1)" in fm and "Flow Matching" in fm
    assert "DDPMScheduler" in ddpm and "clip_sample" in ddpm and "DDPM ε-prediction (linear)" in ddpm
    assert "training times: uniform on (0, 1)" in fm and "training times" not in ddpm  # FM: how t was drawn
    for text in (fm, ddpm):
        assert "CC-BY 4.0" in text and "images seen" in text and "text_encoder.json" in text


def test_save_pretrained_round_trip_and_diffusers_loaders(run, pipe, tmp_path, monkeypatch):
    from diffusers import AutoModel, DiffusionPipeline
    from diffusers.utils import dynamic_modules_utils

    pipe.save_pretrained(tmp_path / "copy")
    again = HDDMPipeline.from_pretrained(tmp_path / "copy")  # text encoder and tokenizer now saved in the folder
    assert (tmp_path / "copy" / "text_encoder" / "config.json").is_file()
    kw = dict(num_inference_steps=2, output_type="latent")
    torch.testing.assert_close(
        again("hamburger", generator=torch.Generator().manual_seed(0), **kw).images,
        pipe("hamburger", generator=torch.Generator().manual_seed(0), **kw).images,
    )
    assert type(AutoModel.from_pretrained(str(run), subfolder="router")).__name__ == "Router"
    assert type(AutoModel.from_pretrained(str(run), subfolder="feature_net")).__name__ == "FeatureClassifier"
    # diffusers' custom-pipeline route through the run's pipeline.py (copied into a modules cache)
    monkeypatch.setattr(dynamic_modules_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    generic = DiffusionPipeline.from_pretrained(run, custom_pipeline="pipeline", trust_remote_code=True)
    assert type(generic).__name__ == "HDDMPipeline" and generic.experts.ids == list(PRESENT)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": ""}, "prompt must be non-empty"),
        ({"prompt": ["dog", " "]}, "prompt must be non-empty"),
        ({"top_k": 4}, "top_k must be in 1..3"),
        ({"routing": "oracle"}, "routing must be one of"),
        ({"num_inference_steps": 0}, "num_inference_steps must be"),
        ({"output_type": "jpg"}, "output_type must be one of"),
    ],
)
def test_bad_arguments_fail_before_sampling(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(**({"prompt": "dog face"} | kwargs))


def test_the_runs_top_k_is_cut_to_the_experts_that_arrived(pipe):
    """A run that lost experts below its sampling.top_k still samples (its report grid does): top_k = present."""
    sampling = dict(pipe.config.sampling)
    pipe.register_to_config(sampling=sampling | {"top_k": 8})
    try:
        kw = dict(num_inference_steps=2, output_type="latent")
        cut = pipe("dog face", generator=torch.Generator().manual_seed(0), **kw).images
    finally:
        pipe.register_to_config(sampling=sampling)
    full = pipe("dog face", top_k=len(PRESENT), generator=torch.Generator().manual_seed(0), **kw).images
    torch.testing.assert_close(cut, full)


def test_fm_expert_with_diffusers_flow_match_scheduler_matches_the_project(run, pipe):
    """An FM expert, its own scheduler_config.json, diffusers' Euler loop: the project's samples to 1e-5."""
    folder = run / "experts" / "expert-0"
    assert json.loads((folder / "hddm_expert.json").read_text())["time"]["net_timestep_scale"] == 999.0
    transformer = PixArtTransformer2DModel.from_pretrained(folder).eval()
    cond, _ = pipe.encode_prompt(["dog face", "hamburger"])
    noise = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    n = 7

    def diffusers_loop(scheduler) -> torch.Tensor:
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, n + 1)[:-1])  # the project's grid
        x = noise
        for t in scheduler.timesteps:
            v = transformer(
                x,
                encoder_hidden_states=cond.states,
                encoder_attention_mask=cond.mask,
                timestep=t.expand(len(x)),
                added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            ).sample
            x = scheduler.step(v, t, x).prev_sample
        return x

    with torch.no_grad():
        ours = euler_sample(lambda x, t: FlowMatchingExpert(ExpertNet(transformer)).velocity(x, t, cond), noise, n)
        theirs = diffusers_loop(FlowMatchEulerDiscreteScheduler.from_pretrained(folder))
        wrong_scale = diffusers_loop(FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000))
    assert (ours - noise).abs().max() > 0.1  # the expert moved the samples
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    assert (wrong_scale - ours).abs().max() > 1e-5  # a 1000·t timestep would not match: the test can fail


def test_scheduler_grids_match_the_closed_forms():
    """FM: timestep = 999·t on linspace(1, 0, n + 1); DDPM: diffusers' ᾱ equals the project's, endpoints included."""
    fm = scheduler_config({"objective": "fm"})
    for n in (1, 2, 10, 50):
        fm.set_timesteps(sigmas=np.linspace(1.0, 0.0, n + 1)[:-1])
        t = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float64)
        torch.testing.assert_close(fm.sigmas.double(), t, atol=1e-7, rtol=0)
        torch.testing.assert_close(fm.timesteps.double(), FM_TIME_SCALE * t[:-1], atol=1e-4, rtol=0)
    for schedule in ("linear", "cosine"):
        meta = {"objective": "ddpm", "schedule": schedule, "num_train_timesteps": 1000}
        s = scheduler_config(meta)
        assert s.config.prediction_type == "epsilon" and s.config.clip_sample
        torch.testing.assert_close(s.alphas_cumprod.double(), ddpm_alpha_bar(schedule, 1000), atol=2e-6, rtol=1e-5)
        assert time_convention(meta)["noise_at"] == 999 and time_convention(meta)["prediction"] == "epsilon"
        s.set_timesteps(10)
        assert int(s.timesteps[0]) == 999  # trailing spacing: sampling starts from pure noise
    with pytest.raises(ValueError, match="unknown DDPM schedule"):
        scheduler_config({"objective": "ddpm", "schedule": "sigmoid", "num_train_timesteps": 1000})


def _gaussian_eps(mu: float, sigma: float, alpha_bar: torch.Tensor):
    """The exact ε-predictor of data x0 ~ N(mu, sigma²) per dimension on a VP schedule: for
    z = √ᾱ·x0 + √(1 − ᾱ)·ε, E[ε | z] = √(1 − ᾱ)·(z − √ᾱ·mu) / (ᾱ·sigma² + 1 − ᾱ)."""

    def eps(z: torch.Tensor, tau: int) -> torch.Tensor:
        a = alpha_bar[tau].double()
        return ((1 - a).sqrt() * (z.double() - a.sqrt() * mu) / (a * sigma**2 + 1 - a)).to(z.dtype)

    return eps


def _ddpm_sample(scheduler, eps, n: int, steps: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)  # (N, C): the scheduler reads a channel axis
    scheduler.set_timesteps(steps)
    for t in scheduler.timesteps:
        x = scheduler.step(eps(x, int(t)), t, x, generator=g).prev_sample
    return x


def test_ddpm_expert_scheduler_samples_the_data_an_exact_network_implies(run, pipe):
    """The DDPM expert's own ``scheduler_config.json`` drives diffusers' DDPMScheduler as the expert was trained:
    (1) one step on the expert network's ε gives the x̂0 of the project's schedule, (x − √(1 − ᾱ_τ)·ε̂)/√ᾱ_τ
    (clamped to the data range), with ᾱ from :func:`ddpm_alpha_bar` of the metadata's schedule; (2) with the exact
    ε of Gaussian data in place of the network, the scheduler's 1000 steps sample that Gaussian (mean and std
    within 0.015; measured 0.004 and 0.005 off). A wrong network fails (2): a predictor of ε = 0, the exact ε of
    another schedule (mean 0.03 off), or the exact ε scaled by 1.1 (std 0.026 off)."""
    folder = run / "experts" / "expert-1"
    meta = json.loads((folder / "hddm_expert.json").read_text())
    assert meta["objective"] == "ddpm" and meta["time"]["range"] == [0, 999]
    scheduler = DDPMScheduler.from_pretrained(folder)  # its own scheduler_config.json
    assert (folder / SCHEDULER).is_file() and scheduler.config.beta_schedule == "linear"  # the tiny config's
    alpha_bar = ddpm_alpha_bar(meta["schedule"], meta["num_train_timesteps"])
    torch.testing.assert_close(scheduler.alphas_cumprod.double(), alpha_bar, rtol=1e-5, atol=1e-7)

    transformer = PixArtTransformer2DModel.from_pretrained(folder).eval()
    cond, _ = pipe.encode_prompt(["dog face", "japan flag"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    scheduler.set_timesteps(10)
    with torch.no_grad():
        for t in scheduler.timesteps[:3]:
            eps = transformer(
                x,
                encoder_hidden_states=cond.states,
                encoder_attention_mask=cond.mask,
                timestep=t.expand(len(x)),
                added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            ).sample
            out = scheduler.step(eps, t, x, generator=g)
            a = alpha_bar[int(t)].float()
            x0 = ((x - (1 - a).sqrt() * eps) / a.sqrt()).clamp(-meta["sample_range"], meta["sample_range"])
            torch.testing.assert_close(out.pred_original_sample, x0, rtol=1e-4, atol=1e-4)
            x = out.prev_sample

    mu, sigma, n = 0.4, 0.25, 20_000
    exact = _gaussian_eps(mu, sigma, alpha_bar)
    x = _ddpm_sample(scheduler, exact, n, 1000)
    assert abs(float(x.mean()) - mu) < 0.015 and abs(float(x.std()) - sigma) < 0.015
    wrong = (
        lambda z, tau: torch.zeros_like(z),
        _gaussian_eps(mu, sigma, ddpm_alpha_bar("cosine")),
        lambda z, tau: 1.1 * exact(z, tau),
    )
    for eps in wrong:
        x = _ddpm_sample(scheduler, eps, n, 1000)
        assert abs(float(x.mean()) - mu) >= 0.015 or abs(float(x.std()) - sigma) >= 0.015


def test_pipeline_without_stored_empty_caption_encodes_it(pipe):
    """A pipeline built from components (no uncond file) encodes "" with its text encoder."""
    from hddm_flower.hddm_pipeline import HDDMExperts

    bare = HDDMExperts(4, {k: pipe.experts.transformers[str(k)] for k in PRESENT}, pipe.experts.metas)
    other = HDDMPipeline(
        bare, pipe.router, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer, text=pipe.config.text,
        sampling=pipe.config.sampling,
    )  # fmt: skip
    kw = dict(num_inference_steps=2, output_type="latent")
    torch.testing.assert_close(
        other("soccer ball", generator=torch.Generator().manual_seed(0), **kw).images,
        pipe("soccer ball", generator=torch.Generator().manual_seed(0), **kw).images,
        atol=1e-5,
        rtol=0,
    )
    assert isinstance(pipe.experts.uncond, TextCond)


def test_sampling_settings_a_run_does_not_name_are_the_configs_defaults(pipe):
    """A pipeline without sampling settings samples with the config's (``Config()``'s sampling section)."""
    from hddm_flower.config.schema import Config
    from hddm_flower.hddm_pipeline import sampling_defaults

    bare = HDDMPipeline(
        pipe.experts, pipe.router, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer, text=pipe.config.text
    )
    s = Config().sampling
    assert bare.sampling == sampling_defaults(Config()) and bare.sampling["guidance_scale"] == s.cfg_scale
    ens = bare.ensemble()
    assert (ens.routing, ens.k, ens.threshold, ens.handover_t) == (s.routing, s.top_k, s.threshold, s.handover_t)
    assert ens.velocity_scaling.mode == s.velocity_scaling and ens.velocity_scaling.t_min == s.velocity_scaling_t
    ddpm = ens.experts["1"]
    assert (ddpm.conversion, ddpm.t_eps, ddpm.x0_clamp) == (s.conversion, s.t_eps, s.x0_clamp)


def test_hddm_sample_uses_the_run_config_and_records_overrides(run, cache_dir, tmp_path, capsys):
    from hddm_flower.cli import main

    out = tmp_path / "grid.png"
    argv = ["sample", "--run-dir", str(run), "--prompt", "red apple", "--out", str(out)]
    sets = ["sampling.num_steps=3", "sampling.samples_per_prompt=3", "coordinator.mixed_precision=bf16"]
    assert main([*argv, *(a for x in sets for a in ("--set", x))]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["num_inference_steps"] == 3 and record["samples_per_prompt"] == 3 and record["experts"] == [0, 1, 3]
    assert record["mixed_precision"] == "bf16"  # the pipeline's ensemble samples under bf16 autocast
    assert record["guidance_scale"] == 7.5 and record["overrides"] == sets
    assert record["config"].endswith("config.yaml")
    with Image.open(out) as grid:
        assert grid.size == (4 * (2 + 3 * (16 + 2)), 4 * (2 + 16 + 2))  # 1 prompt × 3 samples


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run-dir", "{tmp}/nowhere"], "does not exist"),
        (["--run-dir", "{tmp}"], "is not an assembled run"),
        (["--prompt", " "], "is empty"),
        (["--out", "{tmp}/no/such/dir/x.png"], "does not exist or is not writable"),
        (["--out", "{tmp}/x.jpg"], "must be a .png"),
        (["--set", "sampling.top_k=4"], "this run has 3 experts"),
    ],
)
def test_hddm_sample_checks_every_argument_first(run, tmp_path, capsys, args, message):
    from hddm_flower.cli import main

    argv = ["sample", "--run-dir", str(run), *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _copy_run(run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    return copy


def test_a_run_directory_is_checked_on_load(run, pipe, tmp_path, caplog):
    """Missing experts are named; a folder whose metadata names another expert (two folders, one id) and a
    component of the wrong class or a router for another number of experts are refused on load, in one line."""
    import logging

    from hddm_flower.hddm_pipeline import HDDMExperts
    from hddm_flower.models import Router

    with caplog.at_level(logging.WARNING, logger="hddm_flower.hddm_pipeline"):
        HDDMExperts.from_pretrained(run / "experts")
    assert any("experts [2] of 0..3 are missing" in r.getMessage() for r in caplog.records)

    copy = _copy_run(run, tmp_path)
    import shutil

    shutil.copytree(copy / "experts" / "expert-0", copy / "experts" / "expert-2")  # a second folder claiming 0
    with pytest.raises(ValueError, match="expert-2: its metadata names expert 0"):
        HDDMPipeline.from_pretrained(copy)

    with pytest.raises(TypeError, match="component experts is a Router, expected HDDMExperts"):
        HDDMPipeline(experts=pipe.router, router=pipe.router, text=pipe.config.text)
    other = Router(**(dict(pipe.router.config) | {"num_experts": 5}))
    with pytest.raises(ValueError, match="the router weighs 5 experts, the run has 4"):
        HDDMPipeline(experts=pipe.experts, router=other, text=pipe.config.text)

    index = json.loads((run / "model_index.json").read_text())
    copy = tmp_path / "wrong-class"
    shutil.copytree(run, copy)
    index["router"] = index["feature_net"]  # the folder names another class for the router
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(TypeError, match="component router is a FeatureClassifier, expected Router"):
        HDDMPipeline.from_pretrained(copy)


def test_diffusers_generic_route_only_with_the_packages_own_pipeline_py(run, tmp_path, monkeypatch):
    from diffusers.utils import dynamic_modules_utils

    from hddm_flower.hddm_pipeline import load_with_diffusers

    monkeypatch.setattr(dynamic_modules_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    assert type(load_with_diffusers(run)).__name__ == "HDDMPipeline"
    copy = _copy_run(run, tmp_path)
    (copy / "pipeline.py").write_text((run / "pipeline.py").read_text() + "import os  # anything\n")
    with pytest.raises(ValueError, match="not the pipeline.py hddm-flower writes"):
        load_with_diffusers(copy)
    (copy / "pipeline.py").unlink()
    from diffusers import DiffusionPipeline

    # without pipeline.py, diffusers' custom_pipeline route is never taken (it would look for one elsewhere)
    taken = []
    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", lambda *a, **k: taken.append(a))
    with pytest.raises(FileNotFoundError, match="pipeline.py does not exist"):
        load_with_diffusers(copy)
    assert taken == []


# relative L2 error of bf16 samples vs fp32 after 3 steps at CFG 7.5 (bf16 keeps 8 bits: 2⁻⁸ ≈ 0.004 per
# rounding); measured 0.017 (autocast) and 0.023 (bf16 weights) on the tiny run
BF16_BOUND = 0.05


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_bf16_autocast_sampling_matches_fp32(run, pipe):
    """``coordinator.mixed_precision: bf16`` (the pipeline's ``sampling.mixed_precision``) samples under CPU bf16
    autocast; the samples stay within BF16_BOUND of fp32 (relative L2, latents before decoding)."""
    bf16 = HDDMPipeline.from_pretrained(run, sampling=dict(pipe.config.sampling, mixed_precision="bf16"))
    assert bf16.ensemble().mixed_precision == "bf16" and pipe.ensemble().mixed_precision == "no"  # auto on CPU: none
    kw = dict(num_images_per_prompt=2, num_inference_steps=3, output_type="latent")
    x32 = pipe(["dog face", "red apple"], generator=torch.Generator().manual_seed(0), **kw).images
    seen = []
    hook = bf16.router.head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x16 = bf16(["dog face", "red apple"], generator=torch.Generator().manual_seed(0), **kw).images
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # the router ran under autocast
    assert x16.dtype == torch.float32 and 0 < _relative_error(x16, x32) < BF16_BOUND


@pytest.mark.parametrize("precision, autocast_dtype", [("bf16", torch.bfloat16), ("no", None)])
def test_hddm_sample_honours_the_runs_mixed_precision(run, tiny_config, tmp_path, precision, autocast_dtype):
    """``hddm sample`` of a run whose config.yaml says ``coordinator.mixed_precision: bf16`` runs every expert
    transformer and the router under CPU bf16 autocast; with ``no`` none of them (the run's model_index.json says
    ``auto``, none on the CPU: only the config can turn it on)."""
    import dataclasses

    from torch.nn.modules.module import register_module_forward_hook

    from hddm_flower.cli import main
    from hddm_flower.models import Router
    from hddm_flower.rundir import write_config

    copy = _copy_run(run, tmp_path)
    assert json.loads((copy / "model_index.json").read_text())["sampling"]["mixed_precision"] == "auto"
    coordinator = dataclasses.replace(tiny_config.coordinator, mixed_precision=precision)
    write_config(copy / "config.yaml", dataclasses.replace(tiny_config, coordinator=coordinator), "the tiny run")
    seen = []  # (module class, the CPU autocast dtype its forward ran under, or None)

    def note(module, args, output):
        if isinstance(module, (PixArtTransformer2DModel, Router)):
            on = torch.is_autocast_enabled("cpu")
            seen.append((type(module).__name__, torch.get_autocast_dtype("cpu") if on else None))

    hook = register_module_forward_hook(note)
    try:
        assert main(["sample", "--run-dir", str(copy), "--prompt", "red apple", "--out", str(tmp_path / "g.png")]) == 0
    finally:
        hook.remove()
    assert {name for name, _ in seen} == {"PixArtTransformer2DModel", "Router"}
    assert {dtype for _, dtype in seen} == {autocast_dtype}


def test_a_bf16_pipeline_samples_float32_latents(run, pipe):
    """``from_pretrained(run, torch_dtype=torch.bfloat16)``: bf16 weights, float32 latents in and out."""
    bf16 = HDDMPipeline.from_pretrained(run, torch_dtype=torch.bfloat16)
    assert bf16.router.dtype == torch.bfloat16 and {p.dtype for p in bf16.experts.parameters()} == {torch.bfloat16}
    kw = dict(num_images_per_prompt=2, num_inference_steps=3, output_type="latent")
    x32 = pipe(["dog face"], generator=torch.Generator().manual_seed(0), **kw).images
    x16 = bf16(["dog face"], generator=torch.Generator().manual_seed(0), **kw).images
    assert x16.dtype == torch.float32 and 0 < _relative_error(x16, x32) < BF16_BOUND
    images = bf16(["dog face"], num_inference_steps=2, generator=torch.Generator().manual_seed(0)).images
    assert len(images) == 1 and images[0].size == (16, 16)
