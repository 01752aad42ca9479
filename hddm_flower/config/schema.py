"""The configuration schema: :class:`Config`, its sections (:mod:`hddm_flower.config.sections`) and the checks
that span sections (``top_k ≤ num_experts``, the objective mix, …). Every problem is a :class:`ConfigError`: one
line, bounded in length, naming the file and the key. Reading YAML files and dotted overrides into a
:class:`Config` is :mod:`hddm_flower.config.io`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..presets import EXPERT_PRESETS, ROUTER_PRESETS
from .rules import ConfigError, Rules, top_k_of
from .sections import (
    CoordinatorConfig,
    DataConfig,
    DDPMConfig,
    EvaluationConfig,
    ExpertConfig,
    FederationConfig,
    ObjectivesConfig,
    ReproduceConfig,
    RouterConfig,
    SamplingConfig,
)

# the sections that decide an expert's weights (federation and sampling settings may change between runs)
TRAINING_SECTIONS = ("num_experts", "data", "objectives", "ddpm", "expert")


def shipped_configs() -> Path:
    """The folder of the YAML files that ship with the project: inside the installed package (a wheel carries
    them as ``hddm_flower/configs``), else the source tree's ``configs/``."""
    here = Path(__file__).resolve().parent.parent  # hddm_flower/
    inside = here / "configs"
    return inside if (inside / "default.yaml").is_file() else here.parent / "configs"


SECTIONS = (
    "data",
    "objectives",
    "ddpm",
    "expert",
    "router",
    "sampling",
    "evaluation",
    "federation",
    "coordinator",
    "reproduce",
)


@dataclass
class Config:
    num_experts: int = 8  # K: clusters = experts
    data: DataConfig = field(default_factory=DataConfig)
    objectives: ObjectivesConfig = field(default_factory=ObjectivesConfig)
    ddpm: DDPMConfig = field(default_factory=DDPMConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)

    def validate(self, source: str = "<config>") -> Config:
        """Each section's own checks, then those spanning sections; raises :class:`ConfigError` naming the key
        and ``source``."""
        r = Rules(self, source, "")
        r.at_least(1, "num_experts")
        for name in SECTIONS:
            getattr(self, name).validate(source, f"{name}.")
        k = self.num_experts
        o = self.objectives
        if o.per_expert is not None:
            if len(o.per_expert) != k:
                r.fail("objectives.per_expert", f"has {len(o.per_expert)} entries for {k} experts")
        else:
            if o.ddpm + o.fm != k:
                r.fail("objectives", f"ddpm {o.ddpm} + fm {o.fm} must equal num_experts {k}")
            ids = o.ddpm_clusters
            if ids != "auto" and (len(set(ids)) != o.ddpm or not all(0 <= i < k for i in ids)):
                r.fail("objectives.ddpm_clusters", f"needs {o.ddpm} distinct ids in 0..{k - 1}")
        pins = self.federation.expert_nodes
        if pins and len(pins) != k:
            r.fail(
                "federation.expert_nodes", f"has {len(pins)} entries for {k} experts (one node id per expert, 0: any)"
            )
        if self.reproduce.budget == "equal_steps" and self.expert.batch_size % k:
            r.fail(
                "reproduce.budget",
                f"equal_steps splits expert.batch_size {self.expert.batch_size} among {k} experts: it must be a "
                f"multiple of num_experts",
            )
        if not all(0 <= n <= k for n in self.reproduce.ddpm_counts):
            r.fail(
                "reproduce.ddpm_counts",
                f"DDPM experts per configuration must be in 0..{k}, got {self.reproduce.ddpm_counts}",
            )
        d = self.data
        if d.name == "gmm" and not 1 <= k <= 8:
            r.fail("num_experts", f"name: gmm has 8 patterns, one per cluster: needs 1..8 experts, got {k}")
        if d.name == "gmm" and d.gmm_samples < 2 * k:
            r.fail("data.gmm_samples", f"needs at least 2 images per cluster, got {d.gmm_samples}")
        for name, table in (("expert", EXPERT_PRESETS), ("router", ROUTER_PRESETS)):
            patch = table[getattr(self, name).preset]["patch_size"]
            if d.image_size % patch:
                r.fail("data.image_size", f"{d.image_size} is not a multiple of the {name} preset's patch size {patch}")
        if self.data.fine_clusters < k:
            r.fail("data.fine_clusters", f"must be ≥ num_experts ({k})")
        if self.sampling.top_k > k:
            r.fail("sampling.top_k", f"must be in 1..{k} (num_experts)")
        for i, mode in enumerate(self.evaluation.routing_modes):
            if (top_k_of(mode) or 0) > k:
                r.fail(f"evaluation.routing_modes[{i}]", f"{mode} needs at least {top_k_of(mode)} experts, not {k}")
        if d.partition == "institution":  # the coordinator holds no image: everything it did with data, federated
            if self.router.training != "federated":
                r.fail("router.training", "must be federated with data.partition: institution (no central images)")
            if self.evaluation.reference != "federated":
                r.fail("evaluation.reference", "must be federated with data.partition: institution (no central images)")
            if d.name == "gmm":
                r.fail("data.partition", "institution needs real per-node data; name: gmm is one synthetic mixture")
        ev = self.evaluation
        if ev.prompt_sampling == "stratified":
            if ev.num_prompts % k:
                r.fail(
                    "evaluation.num_prompts",
                    f"prompt_sampling: stratified draws the same number per cluster: {ev.num_prompts} is not a "
                    f"multiple of num_experts {k}",
                )
            if ev.reference != "central":
                r.fail(
                    "evaluation.prompt_sampling",
                    "stratified needs evaluation.reference: central (its reference and floor need features of the "
                    "coordinator's images, not federated sums)",
                )
        if self.federation.min_experts > k:
            r.fail("federation.min_experts", f"must be in 1..{k}")
        ro = self.router
        if ro.training == "federated" and ro.server_optimizer == "krum":  # Krum's bound holds for n > 2f + 2 nodes
            need, f = 2 * ro.robust_f + 3, ro.robust_f
            if k < need:
                r.fail(
                    "router.robust_f",
                    f"krum with {f} hostile node(s) needs at least 2·{f} + 3 = {need} nodes (n > 2f + 2); this run "
                    f"has at most num_experts = {k} (each node holds a cluster): lower robust_f or use median",
                )
            if self.federation.min_nodes < need:
                r.fail(
                    "federation.min_nodes",
                    f"is {self.federation.min_nodes}, but router.server_optimizer krum with router.robust_f {f} "
                    f"needs at least 2·{f} + 3 = {need} nodes (n > 2f + 2)",
                )
        return self

    def objective_of(self, cluster_details: list[float] | None = None) -> list[str]:
        """The objective of each expert (expert id = cluster id). ``auto`` gives DDPM to the clusters with the
        highest detail score (the paper gave DDPM to the most detail-heavy clusters)."""
        o = self.objectives
        if o.per_expert is not None:
            return list(o.per_expert)
        if o.ddpm == 0:
            return ["fm"] * self.num_experts
        if o.ddpm_clusters == "auto":
            if cluster_details is None:
                raise ConfigError("objectives.ddpm_clusters is 'auto' but no cluster detail scores are known")
            ranked = sorted(range(self.num_experts), key=lambda k: -cluster_details[k])
            ddpm = set(ranked[: o.ddpm])
        else:
            ddpm = set(o.ddpm_clusters)
        return ["ddpm" if k in ddpm else "fm" for k in range(self.num_experts)]

    def init_for(self, expert_id: int, objective: str) -> str:
        """The initialisation of one expert: its id's entry, else its objective's, else the single value."""
        init = self.expert.init
        if not isinstance(init, dict):
            return init
        return init.get(expert_id, init.get(str(expert_id), init.get(objective, "random")))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
