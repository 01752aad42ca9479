"""Institution-owned data on the node side (``data.partition: institution``): where a node's own data is, and the
declaration it sends (action ``query.declare``).

A node's own prepared data is its cluster:

* node config ``data-dir``: a one-cluster dataset (`hddm prepare` with ``data.partition: institution``), or
  ``shard-set``: a ``cluster-k`` folder of `hddm cluster` output;
* in simulation (``partition-id`` p and no data path): the p-th cluster of the embedded dataset, prepared in the
  node's own cache (node config ``cache-dir``, else ``$HDDM_CACHE``), never in the coordinator's cache directory
  — the stand-in for K institutions each holding one kind of image.

The declaration (:func:`hddm_flower.federation.declarations.declaration`) carries the properties every expert must share and
two statistics (number of images, mean detail score); no image, latent or caption leaves the node here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict

from hddm_flower.config.io import config_from_dict
from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset
from hddm_flower.data.layout import cluster_dir
from hddm_flower.federation.declarations import CLAIM, DECLARATION, DECLARATION_JSON, declaration, local_cluster
from hddm_flower.stages.prepare import prepare_data


def institution_data(context: Context, cfg: Config) -> Dataset:
    """This node's own prepared data (see the module docstring); fails naming the path when it holds no shard."""
    node = context.node_config
    if node.get("data-dir") or node.get("shard-set"):
        folder = Path(str(node.get("data-dir") or node["shard-set"]))
    elif "partition-id" in node:
        central = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, partition="central"))
        p = int(node["partition-id"])
        if not 0 <= p < cfg.num_experts:
            raise ValueError(f"simulated institution {p} has no cluster among the run's {cfg.num_experts}")
        folder = cluster_dir(prepare_data(central, str(node.get("cache-dir", "")) or None).root, p)
    else:
        raise ValueError("data.partition is institution but this node's config names no data-dir or shard-set")
    dataset = Dataset.open(folder)
    dataset.shards(local_cluster(dataset.meta))  # fail early: no shards, a wrong folder
    return dataset


def claim(context: Context) -> int | None:
    """The expert id this node asks for: ``expert-id``, else ``partition-id`` (None: neither)."""
    node = context.node_config
    for key in ("expert-id", "partition-id"):
        if key in node:
            return int(node[key])
    return None


def declare(msg: Message, context: Context) -> Message:
    """Reply with this node's declaration and the expert id it claims."""
    cfg = config_from_dict(json.loads(str(msg.content["config"]["experiment"])), source="declare message")
    decl = declaration(institution_data(context, cfg))
    record = ConfigRecord({DECLARATION_JSON: json.dumps(decl)})
    if (expert := claim(context)) is not None:
        record[CLAIM] = expert
    return Message(RecordDict({DECLARATION: record}), reply_to=msg)
