"""Deliberate misbehaviour of one node, for the deployment drill (``scripts/deploy_loopback.py --drill``).

A SuperNode started with the node config key ``drill`` misbehaves on purpose in the way it names, so that the
drill can show the server surviving a hostile peer on a real deployment. It gives a node nothing it could not do
anyway: a node's operator can make its ClientApp send whatever it likes; this only spares the drill a second app.
Values:

* ``hostile-router``: every ``train.router`` reply carries, in place of the router's first weight array of more
  than one row, its first row moved by 1000: an array whose payload has another shape, which numpy's
  broadcasting once averaged into every row of the global router (the server's schema,
  :mod:`strategies.round_replies`, drops the reply and records why).
"""

from __future__ import annotations

import logging

from flwr.app import Array, Context, RecordDict

DRILL = "drill"  # the node config key
HOSTILE_ROUTER = "hostile-router"
MODES = (HOSTILE_ROUTER,)

log = logging.getLogger("hddm_flower.client")


def mode(context: Context) -> str:
    """The node config's ``drill`` value ("" = none); a one-line error for an unknown one."""
    value = str(context.node_config.get(DRILL, ""))
    if value and value not in MODES:
        raise ValueError(f"node config {DRILL}={value!r} is not one of {MODES}")
    return value


def router_reply(context: Context, content: RecordDict) -> RecordDict:
    """A ``train.router`` reply's content as this node sends it: unchanged, or made hostile (``hostile-router``)."""
    if mode(context) != HOSTILE_ROUTER:
        return content
    arrays = content["arrays"]
    name = next(k for k in arrays if arrays[k].numpy().ndim >= 2 and arrays[k].numpy().shape[0] > 1)
    weights = arrays[name].numpy()
    arrays[name] = Array(weights[:1] + 1000)
    log.warning(
        "drill: node %d sends a hostile router reply (%s of shape %s)", context.node_id, name, weights[:1].shape
    )
    return content
