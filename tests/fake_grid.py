"""A Ray-free Grid that delivers messages to an in-process ClientApp, one Context per node."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity  # private API: Message() needs it outside a runtime


class FakeGrid(Grid):
    """``node_configs`` maps node id → node config. ``silent`` nodes answer queries but never a train message;
    ``link_errors`` maps a node id to the (code, reason) of the error the SuperLink returns for its train message
    instead of the node's reply (e.g. 3: TTL expired, 5: node unavailable; such errors carry node id 1);
    ``tamper(node_id, reply)`` may alter a reply in flight."""

    def __init__(self, client_app, node_configs: dict[int, dict], run_config: dict | None = None, *,
                 silent: Iterable[int] = (), tamper: Callable[[int, Message], Message] | None = None,
                 link_errors: dict[int, tuple[int, str]] | None = None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.client_app, self.silent, self.tamper = client_app, set(silent), tamper
        self.link_errors = dict(link_errors or {})
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=dict(c), state=RecordDict(),
                                    run_config=dict(run_config or {})) for n, c in node_configs.items()}
        self.replies: dict[str, Message] = {}
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = message_id = uuid.uuid4().hex
            self.sent.append(msg)
            ids.append(message_id)
            node = msg.metadata.dst_node_id
            if node in self.silent and msg.metadata.message_type == "train":
                continue
            if node in self.link_errors and msg.metadata.message_type == "train":
                reply = Message(Error(*self.link_errors[node]), reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = 1  # the SuperLink, not the node
                self.replies[message_id] = reply
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as e:  # what the SuperNode does: an error reply, code 2
                reply = Message(Error(code=2, reason=f"{type(e).__name__}: {e}"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node
            self.replies[message_id] = self.tamper(node, reply) if self.tamper else reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    def create_message(self, *args, **kwargs):
        raise NotImplementedError("deprecated in flwr; build Message objects directly")

    def set_run(self, run_id):
        self._run_id = run_id

    @property
    def run(self):
        return None


def reply_weights(reply: Message) -> bytes:
    """The safetensors bytes a train reply carries."""
    return reply.content.array_records["expert"]["weights"].data


def set_reply_weights(reply: Message, blob: bytes, *, rehash: bool = True) -> Message:
    """Replace a train reply's weights by ``blob``; ``rehash`` updates the sha256 in its metadata to match (the
    sender is consistent, the content is bad), otherwise the old hash stays (corruption in transit)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    reply.content["expert"] = ArrayRecord({"weights": Array(dtype="uint8", shape=(len(blob),), stype="safetensors",
                                                            data=blob)})
    if rehash:
        meta = json.loads(str(reply.content["meta"]["meta"]))
        meta["sha256"] = hashlib.sha256(blob).hexdigest()
        reply.content["meta"] = ConfigRecord({"meta": json.dumps(meta),
                                              "model-config": str(reply.content["meta"]["model-config"])})
    return reply


def rewrite_weights(reply: Message, fn: Callable[[dict], dict]) -> Message:
    """Apply ``fn`` to the reply's state dict and send the result as a consistent safetensors file."""
    from safetensors.torch import load, save

    return set_reply_weights(reply, save(fn(load(reply_weights(reply)))))
