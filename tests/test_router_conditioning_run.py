"""A run whose router reads the prompt (``router.conditioning: text``), assembled by the real stages: the router
trains on a stream of pooled caption embeddings, its record and report.json name the conditioning, and
``HDDMPipeline`` and ``hddm sample`` route on the prompt's pooled embedding."""

import dataclasses
import json

import pytest
import torch

from hddm_flower.data import Dataset
from hddm_flower.hddm_pipeline import HDDMPipeline
from hddm_flower.models import Router
from hddm_flower.text import pooled_caption

PRESENT = (0, 1, 3)


@pytest.fixture(scope="module")
def text_cfg(tiny_config):
    r = dataclasses.replace(tiny_config.router, conditioning="text", caption_dropout=0.2, steps=120)
    ev = dataclasses.replace(tiny_config.evaluation, routing_modes=["top2"])  # the report, not its every mode
    return dataclasses.replace(tiny_config, router=r, evaluation=ev)


@pytest.fixture(scope="module")
def run(text_cfg, dataset_dir, tmp_path_factory):
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.rundir import write_config
    from hddm_flower.stages.assemble import finish_run
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives

    run = tmp_path_factory.mktemp("text-run")
    write_config(run / "config.yaml", text_cfg, "the tiny test config, prompt-aware router")
    objectives = assign_objectives(text_cfg, Dataset.open(dataset_dir))
    for k in PRESENT:
        save_expert(
            run / "experts" / f"expert-{k}", *train_one_expert(text_cfg, Dataset.open(dataset_dir), k, objectives[k])
        )
    finish_run(text_cfg, run, Dataset.open(dataset_dir), [{"expert_id": 2, "reason": "lost"}])
    return run


def test_the_record_and_the_report_name_the_conditioning(run):
    record = json.loads((run / "router" / "hddm_router.json").read_text())
    assert record["conditioning"] == "text" and record["caption_dropout"] == 0.2
    assert "pooled text embedding" in record["inputs"] and "pooled text embedding" in record["data"]
    report = json.loads((run / "report.json").read_text())
    assert report["metrics"]["sampling"]["router_conditioning"] == "text"
    assert report["config"]["router"]["conditioning"] == "text"


def _recording(monkeypatch) -> list:
    calls = []
    forward = Router.forward

    def spy(self, x_t, t, caption=None):
        out = forward(self, x_t, t, caption)
        calls.append((x_t.clone(), caption.clone(), out.detach().clone()))
        return out

    monkeypatch.setattr(Router, "forward", spy)
    return calls


def test_the_pipeline_routes_on_the_prompt(run, monkeypatch):
    """Two prompts from the same starting noise: the router gets each prompt's pooled embedding (not the empty
    caption's, under CFG too) and gives them different weights at the same x_t."""
    pipe = HDDMPipeline.from_pretrained(run)
    assert pipe.router.conditioning == "text"
    calls = _recording(monkeypatch)
    prompts = ["dog face", "japan flag"]
    noise = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)).expand(2, -1, -1, -1)
    pipe(prompts, num_inference_steps=1, guidance_scale=3.0, latents=noise.clone(), output_type="latent")
    assert len(calls) == 1  # one router call per step, for both CFG branches
    x_t, caption, logits = calls[0]
    cond, _ = pipe.encode_prompt(prompts)
    torch.testing.assert_close(caption, pooled_caption(cond.states, cond.mask))
    torch.testing.assert_close(x_t[0], x_t[1])
    gap = (logits[0].softmax(-1) - logits[1].softmax(-1)).abs().max()
    assert gap > 1e-3  # a router blind to the caption gives exactly 0


def test_hddm_sample_routes_on_the_prompt(run, tmp_path, monkeypatch):
    from hddm_flower.cli import main

    calls = _recording(monkeypatch)
    out = tmp_path / "grid.png"
    argv = [
        "sample",
        "--run-dir",
        str(run),
        "--prompt",
        "red apple",
        "--out",
        str(out),
        "--set",
        "sampling.num_steps=2",
    ]
    assert main(argv) == 0
    pipe = HDDMPipeline.from_pretrained(run)
    cond, _ = pipe.encode_prompt(["red apple"])
    assert len(calls) == 2
    for _, caption, _ in calls:
        torch.testing.assert_close(caption, pooled_caption(cond.states, cond.mask).expand_as(caption))
