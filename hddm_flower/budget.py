"""``reproduce.budget``: how ``hddm reproduce`` splits the training compute between the experts and the monolith.

* ``equal_images`` (the default): every expert takes ``expert.steps`` optimiser steps of ``expert.batch_size``; the
  monolith takes K × ``expert.steps`` steps of the same batch. Both sides see K·S·B images (× accumulation), and the
  monolith takes K× an expert's steps.
* ``equal_steps`` (DDM's protocol): the monolith takes ``expert.steps`` steps of ``expert.batch_size``, and each of the
  K experts the same number of steps of ``expert.batch_size / K`` (the monolith's batch split among the experts).
  Both sides again see S·B images in all, and no side takes more steps; ``expert.batch_size`` must be a multiple
  of K.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .config.io import config_from_dict
from .config.schema import Config

BUDGETS = ("equal_images", "equal_steps")


@dataclass(frozen=True)
class Budget:
    """Optimiser steps and micro-batch of each expert and of the monolith (images = steps × batch × accumulation)."""

    protocol: str
    expert_steps: int
    expert_batch: int
    monolith_steps: int
    monolith_batch: int
    accumulation: int = 1
    num_experts: int = 1

    @property
    def expert_images(self) -> int:
        return self.expert_steps * self.expert_batch * self.accumulation

    @property
    def monolith_images(self) -> int:
        return self.monolith_steps * self.monolith_batch * self.accumulation


def budget_of(cfg: Config) -> Budget:
    """The :class:`Budget` that ``cfg``'s ``reproduce.budget`` gives (checked by the config: equal_steps needs
    ``expert.batch_size`` divisible by ``num_experts``)."""
    e, k = cfg.expert, cfg.num_experts
    if cfg.reproduce.budget == "equal_steps":
        return Budget("equal_steps", e.steps, e.batch_size // k, e.steps, e.batch_size, e.grad_accumulation, k)
    return Budget("equal_images", e.steps, e.batch_size, k * e.steps, e.batch_size, e.grad_accumulation, k)


def expert_config(cfg: Config) -> Config:
    """``cfg`` with the experts' own steps and batch size under its budget (``cfg`` itself for equal_images): what
    one expert's training job is given, and what its cache key is made of (:func:`reproduce.training.expert_fingerprint`)."""
    b = budget_of(cfg)
    if (b.expert_steps, b.expert_batch) == (cfg.expert.steps, cfg.expert.batch_size):
        return cfg
    d = copy.deepcopy(cfg.to_dict())
    d["expert"] |= {"steps": b.expert_steps, "batch_size": b.expert_batch}
    d["reproduce"]["budget"] = "equal_images"  # the split is applied: this config trains one expert as it says
    return config_from_dict(d, f"reproduce.budget {b.protocol}")


def describe(b: dict) -> str:
    """One sentence for the tables from a manifest's ``budget`` (:func:`dataclasses.asdict` of a :class:`Budget`)."""
    per = b["expert_steps"] * b["expert_batch"] * b["accumulation"]
    return (
        f"budget `{b['protocol']}`: each of the {b['num_experts']} experts {b['expert_steps']} steps × batch "
        f"{b['expert_batch']}, the monolith {b['monolith_steps']} steps × batch {b['monolith_batch']} "
        f"({b['num_experts'] * per} images on each side)"
    )


def describe_rates(cfg: dict) -> str:
    """The learning rates of experts and monolith for the tables, from a manifest's ``config``: one rate, or the
    monolith's own (``reproduce.monolith_lr``) beside the experts'."""
    lr, own = cfg["expert"]["optim"]["lr"], cfg.get("reproduce", {}).get("monolith_lr", 0.0)
    return f"learning rate {lr:g}" + (f" (the monolith {own:g})" if own and own != lr else "")
