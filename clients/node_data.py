"""Where this node's prepared data is, the one rule every node-side handler follows: institution-owned data
(``data.partition: institution``, :mod:`clients.declare`), else the node config's ``shard-set`` (one
cluster's folder) or ``data-dir`` (a prepared dataset), else the dataset of the run's config built in the cache.
The dataset is opened here, once per message, and passed down."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context

from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset
from hddm_flower.stages.prepare import prepare_data

from .declare import institution_data


def node_dataset(context: Context, cfg: Config, cache_dir: str | None, clusters: list[int]) -> Dataset:
    """This node's prepared data for ``clusters``; fails early, naming the path, when a cluster has no shards
    there (a wrong path, another cluster's shard set, an empty folder)."""
    node = context.node_config
    if cfg.data.partition == "institution":  # this node's own data is its cluster, whatever its expert id
        return institution_data(context, cfg)
    if node.get("shard-set") or node.get("data-dir"):
        dataset = Dataset.open(Path(str(node.get("shard-set") or node["data-dir"])))
        for k in clusters:
            dataset.shards(k)
        return dataset
    return prepare_data(cfg, str(node.get("cache-dir", "")) or cache_dir or None)
