"""The wire format between the ClientApp and the ServerApp, and bounded reading of what a peer sends.

Both Flower sides import their record names from here (this module has no Flower import: the core stays
framework-free, and the client never imports the server side):

* a **query** reply carries the node's config in the ConfigRecord :data:`NODE_INFO`;
* a **train** message carries its task in the ConfigRecord :data:`TASK` (keys ``TASK_*``);
* a **train** reply carries the weights as one array :data:`WEIGHTS` of stype :data:`STYPE` (the safetensors file's
  bytes, so every tensor travels in its own dtype) in the ArrayRecord :data:`EXPERT`, the checkpoint metadata and
  the model config as JSON strings in the ConfigRecord :data:`META`, and compute figures in :data:`METRICS`;
* a **train** message to a node that holds several experts (a simulated SuperNode) lists them all in
  :data:`TASK_EXPERT_IDS` with their objectives in :data:`TASK_OBJECTIVES`; its reply carries each expert's records
  under :func:`expert_record` names (``expert.3``, ``meta.3``, ``metrics.3``), or an :data:`ERROR` record for an
  expert whose training failed, so that one expert's failure costs only that expert.

Nothing a peer sends is used before it is bounded: :func:`loads` parses JSON with limits on size, nesting and
element count and refuses NaN and infinities; :func:`as_int`, :func:`as_float` and :func:`as_str` take one value of
an expected type and range (a bool is not an int, a float is not an int, a string is not a number). Every refusal
is a :class:`WireError` with a one-line reason.
"""

from __future__ import annotations

import json
import math
from typing import Any

STYPE = "safetensors"  # the stype of the one array a train reply carries: the expert's safetensors file

NODE_INFO = "node-info"  # query reply: ConfigRecord with the node's config

TASK = "config"  # train message: ConfigRecord with the task
TASK_ROUND = "server-round"
TASK_EXPERT_ID = "expert-id"
TASK_CLUSTER_ID = "cluster-id"
TASK_OBJECTIVE = "objective"
TASK_EXPERIMENT = "experiment"  # the resolved configuration as JSON
TASK_CACHE_DIR = "cache-dir"
TASK_EXPERT_IDS = "expert-ids"  # several experts for one node: all of them (TASK_EXPERT_ID is the first)
TASK_OBJECTIVES = "objectives"  # … and the objective of each, in the same order

EXPERT = "expert"  # train reply: ArrayRecord holding exactly one array …
WEIGHTS = "weights"  # … named so, of stype STYPE
META = "meta"  # train reply: ConfigRecord with two JSON strings …
META_JSON = "meta"  # … the checkpoint metadata
MODEL_CONFIG_JSON = "model-config"  # … and the diffusers model config
METRICS = "metrics"  # train reply: MetricRecord of compute figures (informational)
ERROR = "error"  # several-expert train reply: ConfigRecord with ERROR_REASON for an expert that failed
ERROR_REASON = "reason"
MAX_REASON_CHARS = 500

MAX_META_BYTES = 2 * 2**20  # checkpoint metadata (a loss curve of ~10⁵ points fits)
MAX_MODEL_CONFIG_BYTES = 64 * 2**10
MAX_DEPTH = 8
MAX_ELEMENTS = 500_000
MAX_INT = 2**62


def expert_record(name: str, expert_id: int | None) -> str:
    """The name of one expert's record in a train reply: ``name`` itself in the reply to a one-expert message
    (``expert_id`` None), ``name.k`` for expert k in the reply to a message that lists several."""
    return name if expert_id is None else f"{name}.{int(expert_id)}"


class WireError(ValueError):
    """A peer's message is malformed; the message says what and where, in one line."""


def _short(value: Any, n: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else repr(value[: n + 1])
    return text if len(text) <= n else text[: n - 1] + "…"


def _refuse_constant(name: str) -> float:
    raise WireError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise WireError(f"number {text[:40]} overflows a float")
    return x


def loads(text: Any, what: str, *, max_bytes: int, max_depth: int = MAX_DEPTH, max_elements: int = MAX_ELEMENTS) -> Any:
    """Parse the JSON string ``text`` a peer sent, or raise :class:`WireError` naming ``what``.

    Refused: a non-string, more than ``max_bytes`` bytes (checked before parsing), invalid JSON, NaN or
    infinities (also as overflowing literals like ``1e999``), integers of more than 20 digits, nesting deeper than
    ``max_depth`` (a nesting too deep for the parser itself included) or more than ``max_elements`` values.
    """
    if isinstance(text, bytes):
        raise WireError(f"{what}: expected a JSON string, got bytes")
    if not isinstance(text, str):
        raise WireError(f"{what}: expected a JSON string, got {type(text).__name__}")
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise WireError(f"{what}: {len(text.encode('utf-8', 'surrogatepass'))} bytes exceed the limit of {max_bytes}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except WireError as e:
        raise WireError(f"{what}: {e}") from None
    except (ValueError, RecursionError) as e:
        raise WireError(
            f"{what}: not valid JSON ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
        ) from None
    depth, n = _shape(value, max_depth, max_elements)
    if depth > max_depth:
        raise WireError(f"{what}: nested more than {max_depth} deep")
    if n > max_elements:
        raise WireError(f"{what}: more than {max_elements} values")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 20:  # a 64-bit unsigned id (Flower's node ids) has up to 20 digits
        raise WireError(f"integer {text[:24]}… is too large")
    return int(text)


def _shape(value: Any, max_depth: int, max_elements: int) -> tuple[int, int]:
    """(deepest nesting, number of values) of parsed JSON, walked without recursion; stops past the limits."""
    deepest, n, stack = 0, 0, [(value, 0)]
    while stack and n <= max_elements and deepest <= max_depth:
        v, d = stack.pop()
        n += 1
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest, n


def as_int(value: Any, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """``value`` as an int in [lo, hi]: an int (not a bool), or a float with an integral value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"{what}: expected an integer, got {type(value).__name__} {_short(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise WireError(f"{what}: expected an integer, got {_short(value)}")
        if not lo <= value <= hi:
            raise WireError(f"{what}: {_short(value)} is outside {lo}..{hi}")
        value = int(value)
    if not lo <= value <= hi:
        raise WireError(f"{what}: {_short(value)} is outside {lo}..{hi}")
    return value


def as_float(value: Any, what: str, lo: float = 0.0, hi: float = float(MAX_INT)) -> float:
    """``value`` as a finite float in [lo, hi] (an int or a float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"{what}: expected a number, got {type(value).__name__} {_short(value)}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise WireError(f"{what}: {_short(value)} is outside {lo:g}..{hi:g}")
    x = float(value)
    if not math.isfinite(x) or not lo <= x <= hi:
        raise WireError(f"{what}: {_short(value)} is outside {lo:g}..{hi:g}")
    return x


def as_str(value: Any, what: str, *, max_len: int = 256, choices: tuple[str, ...] | None = None) -> str:
    """``value`` as a string of at most ``max_len`` characters (one of ``choices`` when given)."""
    if not isinstance(value, str):
        raise WireError(f"{what}: expected a string, got {type(value).__name__} {_short(value)}")
    if len(value) > max_len:
        raise WireError(f"{what}: {len(value)} characters, more than {max_len}")
    if choices is not None and value not in choices:
        raise WireError(f"{what}: {_short(value)} is not one of {choices}")
    return value
