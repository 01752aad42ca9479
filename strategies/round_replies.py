"""The schema of every reply of a federated round (router and feature classifier), checked before Flower sees it.

Flower's FedAvg/FedAdam trust what they average: a reply with one metric key more than the others, a second
record or array bytes that do not parse raise Flower's ``InconsistentMessageReplies`` (an ``AppExitException``
that ends the ServerApp), and an array whose header matches the global model while its payload has another
shape is averaged in by numpy broadcasting. Here every reply is taken apart against one schema per message
type before aggregation, and rebuilt from what was checked:

* :func:`one_per_node`: each reply answers a message this round sent (by ``reply_to_message_id``), from the
  node it was sent to, once; replies to other messages, from other nodes and repeats are dropped;
* :func:`check_train_reply`: exactly the records ``arrays`` (an ArrayRecord) and ``metrics`` (a MetricRecord), the
  exact metric keys of :data:`TRAIN_METRICS` with their types and finite values, and exactly the global model's
  arrays, each deserialised here (a plain ``.npy`` payload, nothing else) and checked for its shape, dtype and
  finite values; the reply handed on carries these deserialised arrays, so what is averaged is what was checked;
* :func:`check_evaluate_reply`: exactly one MetricRecord ``metrics`` with the keys of :data:`EVALUATE_METRICS`,
  confusion counts of the expected size that add up to ``num-examples``.

Every refusal is a :class:`ReplyRefused` with a one-line reason that the strategy records in the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

ARRAYS = "arrays"  # Flower's default ArrayRecord key (FedAvg's ``arrayrecord_key``)
METRICS = "metrics"
LIST_OF_INT = "list[int]"
# the metric keys of a train reply (clients/round_handlers.py ``_metrics``) and their types
TRAIN_METRICS = {"num-examples": int, "images-seen": int, "train-loss": float, "seconds": float}
# the metric keys of an evaluate reply (clients/round_handlers.py ``evaluate_router``)
EVALUATE_METRICS = {"num-examples": int, "confusion": LIST_OF_INT, "top2-hits": LIST_OF_INT}


class ReplyRefused(ValueError):
    """A reply does not match its schema; the message says why in one line."""


def one_per_node(replies: Iterable[Message], asked: dict[str, int]) -> tuple[list[tuple[int, Message]], list[str]]:
    """The replies that answer a message of ``asked`` (message id → the node it was sent to), one per node, in
    arrival order, each with its node; and the reasons of those dropped (``"node N: why"``). Error replies are
    kept (Flower logs and skips them); the SuperLink's own error replies carry node 1, so an error reply is
    mapped by the message it answers, not by its source."""
    kept: list[tuple[int, Message]] = []
    dropped: list[str] = []
    answered: set[str] = set()
    for reply in replies:
        src, to = reply.metadata.src_node_id, reply.metadata.reply_to_message_id
        node = asked.get(to)
        if node is None:
            dropped.append(f"node {src}: replies to a message this round did not send ({str(to)[:16]})")
        elif src != node and not reply.has_error():
            dropped.append(f"node {src}: answers the message sent to node {node}")
        elif to in answered:
            dropped.append(f"node {node}: a second reply to the same message")
        else:
            answered.add(to)
            kept.append((node, reply))
    return kept, dropped


def _records(content: RecordDict, arrays: tuple[str, ...], metrics: tuple[str, ...]) -> None:
    """Exactly these ArrayRecord and MetricRecord names, and no ConfigRecord."""
    got = (sorted(content.array_records), sorted(content.metric_records), sorted(content.config_records))
    want = (sorted(arrays), sorted(metrics), [])
    if got != want:
        raise ReplyRefused(f"records {_names(got)}, expected {_names(want)}")


def _names(records: tuple[list[str], ...]) -> str:
    a, m, c = ([n[:24] for n in r[:4]] for r in records)
    return f"arrays {a}, metrics {m}, configs {c}"


def _metrics(record: MetricRecord, schema: dict) -> dict:
    """The metric values, exactly the keys of ``schema`` with their types (a float is not an int), finite."""
    if set(record) != set(schema):
        extra, lacks = sorted(set(record) - set(schema)), sorted(set(schema) - set(record))
        raise ReplyRefused(f"metric keys differ: {[k[:24] for k in extra[:3]]} extra, {lacks} missing")
    out = {}
    for key, kind in schema.items():
        value = record[key]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, float) and math.isfinite(value)
        else:
            ok = isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        if not ok:
            shown = repr(value) if not isinstance(value, list) else f"a list of {len(value)}"
            raise ReplyRefused(f"metric {key} = {shown[:40]} is not a finite {getattr(kind, '__name__', kind)}")
        out[key] = value
    return out


def _array(array: Array, name: str, want: np.ndarray) -> np.ndarray:
    """One array as numpy, deserialised here, with ``want``'s shape and dtype and finite values."""
    if array.stype != "numpy.ndarray":
        raise ReplyRefused(f"array {name[:40]} has stype {str(array.stype)[:24]!r}, not numpy.ndarray")
    try:
        got = array.numpy()
    except Exception as e:  # whatever np.load raises on bytes a peer wrote: this reply only
        raise ReplyRefused(f"array {name[:40]} does not parse ({type(e).__name__})") from None
    if not isinstance(got, np.ndarray):
        raise ReplyRefused(f"array {name[:40]} is a {type(got).__name__}, not one array")
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ReplyRefused(f"array {name[:40]} is {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
    if got.dtype.kind in "fc" and not np.isfinite(got).all():
        raise ReplyRefused(f"array {name[:40]} is not finite")
    return got


def check_train_reply(content: RecordDict, global_arrays: dict[str, np.ndarray]) -> tuple[RecordDict, dict]:
    """A train reply checked against its schema and the global model (name → numpy array); returns the reply
    rebuilt from the checked, deserialised arrays and metrics, and the metric values."""
    _records(content, (ARRAYS,), (METRICS,))
    metrics = _metrics(content[METRICS], TRAIN_METRICS)
    arrays = content[ARRAYS]
    if set(arrays) != set(global_arrays):
        diff = sorted(set(arrays) ^ set(global_arrays))
        raise ReplyRefused(f"arrays {[d[:40] for d in diff[:3]]} differ from the global model's")
    checked = {name: _array(arrays[name], name, want) for name, want in global_arrays.items()}
    rebuilt = ArrayRecord({name: Array(a) for name, a in checked.items()})
    return RecordDict({ARRAYS: rebuilt, METRICS: MetricRecord(dict(metrics))}), metrics


def check_evaluate_reply(content: RecordDict, num_times: int, num_classes: int) -> RecordDict:
    """An evaluate reply checked against its schema: confusion counts (T×K×K, non-negative) and top-2 hits (T)
    that add up to ``num-examples``; returns the reply rebuilt from the checked values."""
    _records(content, (), (METRICS,))
    m = _metrics(content[METRICS], EVALUATE_METRICS)
    t, k, n = num_times, num_classes, m["num-examples"]
    if len(m["confusion"]) != t * k * k or len(m["top2-hits"]) != t:
        raise ReplyRefused(f"confusion is not {t}×{k}×{k} counts or top-2 hits not {t}")
    c = np.asarray(m["confusion"], dtype=np.int64).reshape(t, k, k)
    if n < 0 or (c < 0).any() or (c.sum((1, 2)) != n).any() or any(not 0 <= h <= n for h in m["top2-hits"]):
        raise ReplyRefused("counts do not add up to num-examples")
    return RecordDict({METRICS: MetricRecord(m)})
