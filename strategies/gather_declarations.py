"""Institution-owned data on the server side (``data.partition: institution``): the nodes' declarations, checked,
and the data-free descriptor the ServerApp works from instead of a dataset.

Before any expert is trained, every connected node gets a ``query.declare`` message (the ClientApp's
:func:`clients.declare.declare`) and answers with the expert id it claims and what its own data is. A reply
that is an error, malformed or out of bounds, or claims an expert another node already claimed, costs only that
node (logged, listed in the report), and so does one whose data cannot join the run: the experts' shapes, latent
space and text encoder must be the coordinator's (its text encoder, an earlier run's descriptor) and the largest
group's (:func:`hddm_flower.federation.declarations.disagreements`). The objectives come
from the declared detail scores (``objectives.ddpm_clusters: auto``), the router rounds and the reference
statistics go to the nodes that declared, and the coordinator's descriptor (``run_dir/institutions``) holds
their shape and statistics but no sample.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset
from hddm_flower.federation.declarations import (
    CLAIM,
    DECLARATION,
    DECLARATION_JSON,
    CoordinatorReference,
    claim_refusal,
    disagreements,
    institution_objectives,
    parse_declaration,
    write_descriptor,
)
from hddm_flower.wire import WireError, as_int

DESCRIPTOR = "institutions"  # the run directory's data-free descriptor folder


@dataclass
class Institutions:
    """The accepted declarations: ``declarations`` (expert id → declaration), ``nodes`` (expert id → node id),
    ``refused`` (node id → why), the descriptor folder and the objective of every expert id."""

    declarations: dict[int, dict]
    nodes: dict[int, int]
    refused: dict[int, str]
    descriptor: Path
    objectives: list[str] = field(default_factory=list)
    objectives_from: str = ""

    def clusters(self, experts: set[int]) -> dict[int, list[int]]:
        """Node id → its cluster, for the given expert ids (the router rounds and the reference statistics)."""
        return {n: [k] for k, n in sorted(self.nodes.items()) if k in experts}

    def record(self) -> dict:
        """The report's ``institutions`` block: who declared what (statistics only) and who was refused."""
        return {
            "partition": "institution",
            "declared": {
                str(k): {"node": self.nodes[k], **{f: d[f] for f in ("num_train", "num_val", "detail")}}
                for k, d in sorted(self.declarations.items())
            },
            "agreed": {f: self.declarations[min(self.declarations)][f] for f in ("image_size", "channels", "latent")}
            | {"text_encoder": self.declarations[min(self.declarations)]["text_encoder"]},
            "refused": {str(n): why for n, why in self.refused.items()},
            "objectives_from": self.objectives_from,
            "coordinator_data": "none: a descriptor (meta.json and the empty caption's text states) in "
            f"{self.descriptor.name}/",
        }


def _wait_for_nodes(grid: Grid, cfg: Config) -> list[int]:
    """The connected nodes, after waiting for ``federation.min_nodes`` at most ``node_wait_timeout`` seconds."""
    f = cfg.federation
    deadline = time.monotonic() + f.node_wait_timeout
    while len(nodes := sorted(grid.get_node_ids())) < f.min_nodes and time.monotonic() < deadline:
        time.sleep(1.0)
    return nodes


def gather_declarations(
    grid: Grid,
    cfg: Config,
    run_dir: Path,
    *,
    timeout: float,
    fixed: dict[int, str] | None = None,
    earlier: Dataset | None = None,
) -> Institutions:
    """Ask every connected node for its declaration, parse and check them, write the descriptor into
    ``run_dir/institutions`` and derive the objectives (``fixed``: those of experts already in the run directory;
    ``earlier``: the descriptor an earlier run into the directory wrote, whose shared fields the nodes must match).
    A node whose reply is malformed, late, a second claim of an expert, or whose data disagrees with the others'
    (:func:`~hddm_flower.federation.declarations.disagreements`) is left out and listed in ``refused``; raises
    when no node is usable."""
    nodes = _wait_for_nodes(grid, cfg)
    config = ConfigRecord({"experiment": json.dumps(cfg.to_dict())})
    messages = [
        Message(RecordDict({"config": config}), dst_node_id=n, message_type=f"{MessageType.QUERY}.declare")
        for n in nodes
    ]
    by_node: dict[int, tuple[int, dict]] = {}
    refused: dict[int, str] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        try:
            if reply.has_error():
                raise WireError(f"error reply: {reply.error.reason[:200]}")
            record = reply.content.config_records.get(DECLARATION)
            if record is None or CLAIM not in record:
                raise WireError("no declaration or no expert id (node config expert-id or partition-id)")
            expert = as_int(record[CLAIM], f"node {node} expert id", 0, cfg.num_experts - 1)
            by_node[node] = (expert, parse_declaration(record.get(DECLARATION_JSON), node))
        except WireError as e:
            refused[node] = str(e)
    for node in set(nodes) - set(by_node) - set(refused):
        refused[node] = f"no reply within {timeout:g} s"
    # a claim against federation.expert_nodes, then data that cannot join the run (against what the coordinator
    # holds, then the others'), each cost only the node; both decided before the claims are granted, so such a node
    # can neither vote nor hold an expert id another node claims
    reference = CoordinatorReference(cfg, earlier)
    for node, (expert, d) in sorted(by_node.items()):
        if why := claim_refusal(cfg.federation.expert_nodes, node, expert):
            refused[node] = why
        elif why := reference.token_error(n := d["max_caption_tokens"]):
            refused[node] = f"declares max_caption_tokens {n}, which the coordinator's text encoder cannot take ({why})"
    # one vote per expert id: the matching nodes claiming one id share its vote, so extra claimants cannot outvote
    # the others
    voters = {n: d for n, (_, d) in by_node.items() if n not in refused}
    refused |= disagreements(voters, reference.fields, {n: by_node[n][0] for n in voters})
    nodes_of: dict[int, int] = {}
    for node, (expert, _) in sorted(by_node.items()):
        if node in refused:
            continue
        if expert in nodes_of:
            refused[node] = f"claims expert {expert}, already declared by node {nodes_of[expert]}"
        else:
            nodes_of[expert] = node
    for node, why in sorted(refused.items()):
        log(WARNING, "institution data: node %d left out: %s", node, why)
    declarations = {k: by_node[n][1] for k, n in nodes_of.items()}
    if not declarations:
        raise RuntimeError(f"no node declared usable data ({len(refused)} refused)")
    descriptor = write_descriptor(run_dir / DESCRIPTOR, cfg, declarations)
    inst = Institutions(declarations, nodes_of, refused, descriptor)
    fixed = fixed or {}
    inst.objectives = institution_objectives(cfg, declarations, fixed)
    o = cfg.objectives
    auto = o.per_expert is None and o.ddpm > 0 and o.ddpm_clusters == "auto"
    inst.objectives_from = "the detail scores the nodes declared" if auto else "the config"
    log(
        INFO,
        "institution data: %d nodes declared experts %s (objectives %s); the coordinator holds no sample",
        len(declarations),
        sorted(declarations),
        inst.objectives,
    )
    return inst
