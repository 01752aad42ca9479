"""Institution-owned data on the node side (``data.partition: institution``): the declaration a node sends (action
``query.declare``) about its own prepared data, which :meth:`hddm_flower.data.Dataset.for_node` finds (its
``data-dir`` or ``shard-set``; in simulation, the ``partition-id``-th cluster of the embedded dataset in the node's own
cache, the stand-in for K institutions each holding one kind of image).

The declaration (:func:`hddm_flower.federation.declarations.declaration`) carries the properties every expert must share and
two statistics (number of images, mean detail score); no image, latent or caption leaves the node here.
"""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, Context, Message, RecordDict

from hddm_flower.config.io import config_from_dict
from hddm_flower.data import Dataset
from hddm_flower.federation.declarations import CLAIM, DECLARATION, DECLARATION_JSON, declaration
from hddm_flower.stages.prepare import prepare_data


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
    decl = declaration(Dataset.for_node(context.node_config, cfg, prepare_data))  # its own cluster
    record = ConfigRecord({DECLARATION_JSON: json.dumps(decl)})
    if (expert := claim(context)) is not None:
        record[CLAIM] = expert
    return Message(RecordDict({DECLARATION: record}), reply_to=msg)
