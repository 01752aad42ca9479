"""A Ray-free Grid that delivers messages to an in-process ClientApp, one Context per node."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity  # private API: Message() needs it outside a runtime


class FakeGrid(Grid):
    """``node_configs`` maps node id → node config. ``silent`` nodes answer queries but never a train message;
    ``link_errors`` maps a node id to the (code, reason) of the error the SuperLink returns for its train message
    instead of the node's reply (e.g. 3: TTL expired, 5: node unavailable; such errors carry node id 1); ``lost``
    nodes run their train message but their reply never arrives (it came after the server stopped waiting, or
    the node died before sending it); ``tamper(node_id, reply)`` may alter a reply in flight."""

    def __init__(
        self,
        client_app,
        node_configs: dict[int, dict],
        run_config: dict | None = None,
        *,
        silent: Iterable[int] = (),
        tamper: Callable[[int, Message], Message] | None = None,
        link_errors: dict[int, tuple[int, str]] | None = None,
        lost: Iterable[int] = (),
    ):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.client_app, self.silent, self.tamper = client_app, set(silent), tamper
        self.lost = set(lost)
        self.link_errors = dict(link_errors or {})
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config=dict(c), state=RecordDict(), run_config=dict(run_config or {}))
            for n, c in node_configs.items()
        }
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
            if node in self.lost and msg.metadata.message_type == "train":
                continue
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

    reply.content["expert"] = ArrayRecord(
        {"weights": Array(dtype="uint8", shape=(len(blob),), stype="safetensors", data=blob)}
    )
    if rehash:
        meta = json.loads(str(reply.content["meta"]["meta"]))
        meta["sha256"] = hashlib.sha256(blob).hexdigest()
        reply.content["meta"] = ConfigRecord(
            {"meta": json.dumps(meta), "model-config": str(reply.content["meta"]["model-config"])}
        )
    return reply


def rewrite_weights(reply: Message, fn: Callable[[dict], dict]) -> Message:
    """Apply ``fn`` to the reply's state dict and send the result as a consistent safetensors file."""
    from safetensors.torch import load, save

    return set_reply_weights(reply, save(fn(load(reply_weights(reply)))))


class WireRuntime:
    """The SuperLink's Runtime API as flwr's real ``HttpGrid`` calls it (GetNodes, PushMessages, PushObject,
    PullMessages, PullObject, ConfirmMessageReceived), over an in-process object store: every message and reply
    crosses as Flower's wire objects (5 MiB ``ArrayChunk`` s), as in a deployment.

    ``deliver(message)`` plays the nodes when the server first pulls a message's reply: it returns the reply, a
    folder written by :func:`store_reply` (the reply's objects on disk, made in another process), or None (no
    reply). ``message_id(proto)`` picks the id the SuperLink returns for a pushed message (default: the pushed id).
    Object ids in ``withhold`` are "not found" (an upload that never completed)."""

    def __init__(
        self,
        node_ids: Iterable[int],
        deliver: Callable,
        *,
        message_id: Callable | None = None,
        withhold: Iterable[str] = (),
    ):
        self.node_ids, self.deliver = list(node_ids), deliver
        self.message_id = message_id or (lambda proto: proto.metadata.message_id)
        self.objects: dict = {}  # object id → bytes, or the Path of a file holding them
        self.pushed: dict = {}  # message id → id of its root object
        self.replies: dict = {}  # message id → (reply's proto without content, its object tree)
        self.withhold, self.confirmed, self.pulled_objects = set(withhold), [], 0

    def GetNodes(self, request):  # noqa: N802  (the gRPC-style names HttpGrid calls)
        from flwr.proto.node_pb2 import NodeInfo
        from flwr.proto.runtime_pb2 import GetNodesResponse

        return GetNodesResponse(nodes=[NodeInfo(node_id=n) for n in self.node_ids])

    def PushMessages(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import PushAppMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        ids, objects = [], []
        for proto, tree in zip(request.messages_list, request.message_object_trees, strict=True):
            ids.append(self.message_id(proto))
            self.pushed[ids[-1]] = proto.metadata.message_id
            objects += [t.object_id for t in iterate_object_tree(tree)]
        return PushAppMessagesResponse(message_ids=ids, objects_to_push=objects, session_id="wire")

    def PushObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PushObjectResponse

        self.objects[request.object_id] = request.object_content
        return PushObjectResponse(stored=True)

    def PullMessages(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse

        for message_id in request.message_ids:
            if message_id in self.pushed:
                self.answer(message_id)
        found = [self.replies.pop(i) for i in request.message_ids if i in self.replies]  # pulled once, as on a
        return PullAppMessagesResponse(
            messages_list=[p for p, _ in found],  # SuperLink
            message_object_trees=[t for _, t in found],
        )

    def PullObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        content = self.objects.get(request.object_id)
        if content is None or request.object_id in self.withhold:
            return PullObjectResponse(object_found=False, object_available=False)
        self.pulled_objects += 1
        return PullObjectResponse(
            object_found=True,
            object_available=True,
            object_content=content.read_bytes() if isinstance(content, Path) else content,
        )

    def ConfirmMessageReceived(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse

        self.confirmed.append(request.message_object_id)
        return ConfirmMessageReceivedResponse()

    def answer(self, message_id: str) -> None:
        """The node answers a pushed message now (otherwise when the server first pulls its reply)."""
        from flwr.proto.message_pb2 import Message as ProtoMessage
        from flwr.proto.message_pb2 import ObjectTree
        from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

        message = inflate_object_from_contents(self.pushed.pop(message_id), self.objects, keep_object_contents=True)
        message.metadata.__dict__["_message_id"] = message_id
        reply = self.deliver(message)
        if reply is None:
            return
        if isinstance(reply, Path):
            proto, tree = ProtoMessage(), ObjectTree()
            proto.ParseFromString((reply / "message.pb").read_bytes())
            tree.ParseFromString((reply / "tree.pb").read_bytes())
            self.objects.update({p.name: p for p in reply.iterdir() if not p.name.endswith(".pb")})
        else:
            reply.metadata.__dict__["_reply_to_message_id"] = message_id
            proto, tree = _to_wire(reply, self.objects)
        self.replies[message_id] = (proto, tree)


def _to_wire(reply: Message, objects: dict) -> tuple:
    """Deflate a reply into ``objects``; return its proto (without content) and object tree."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    for object_id, obj in get_all_nested_objects(reply).items():
        objects[object_id] = obj.deflate()
    proto = message_to_proto(remove_content_from_message(reply))
    proto.metadata.message_id = reply.object_id
    return proto, get_object_tree(reply)


def store_reply(reply: Message, folder: Path) -> int:
    """Write a reply as Flower's wire objects, one file per object (what a SuperLink keeps), for
    :class:`WireRuntime`; returns the bytes written."""
    objects: dict = {}
    proto, tree = _to_wire(reply, objects)
    folder.mkdir(parents=True, exist_ok=True)
    for object_id, content in objects.items():
        (folder / object_id).write_bytes(content)
    (folder / "message.pb").write_bytes(proto.SerializeToString())
    (folder / "tree.pb").write_bytes(tree.SerializeToString())
    return sum(len(c) for c in objects.values())


def wire_grid(runtime: WireRuntime):
    """flwr's real ``HttpGrid`` talking to ``runtime`` instead of a SuperLink over HTTP."""
    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    grid = HttpGrid(token="wire")
    grid._client = runtime  # the connection HttpGrid would open to the SuperLink's Runtime API
    grid.set_run(Run.create_empty(1))
    return grid


def fake_over_wire(fake: FakeGrid):
    """The nodes of ``fake`` behind an ``HttpGrid``: every message and reply crosses as wire objects."""

    def deliver(message):
        replies = fake.pull_messages(fake.push_messages([message]))
        return replies[0] if replies else None

    return wire_grid(WireRuntime(fake.get_node_ids(), deliver))
