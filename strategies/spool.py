"""Pull replies from the SuperLink with their large arrays written straight to disk.

flwr 1.42's ``HttpGrid.pull_messages`` pulls every object of a reply into a dict, then ``Array.inflate`` joins the
chunks into a ``bytearray`` and copies that into ``bytes``: a 300 MiB expert cost 3.96× its size in the ServerApp
(``benchmarks/server_memory.py``).
:func:`pull_replies` walks the same object tree through the same Runtime API calls (``PullMessages``,
``PullObject``, ``ConfirmMessageReceived``), but writes the chunks of each array whose ``stype`` is spooled to a file
as they arrive, a few chunks at a time, and puts a :class:`SpooledArray` (no bytes, a path) in the inflated message.
Everything else in the reply is inflated by Flower as usual. On any other Grid (simulation's ``InMemoryGrid``,
test grids) it is ``grid.pull_messages``: there the replies are already in the server's process.

This uses HttpGrid internals (``_runtime_client``, ``node``, ``_run``) and Flower's object-store protocol; a
Flower upgrade must be checked against ``tests/test_spool.py`` and ``benchmarks/server_memory.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

from flwr.app import Array, Error, Message, Metadata
from flwr.app.message import make_message
from flwr.app.message.arraychunk import ArrayChunk
from flwr.common.constant import ErrorCode
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.constant import FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS, SYSTEM_MESSAGE_TYPE
from flwr.supercore.date import now
from flwr.supercore.inflatable.inflatable_object import get_object_body, get_object_head_values_from_object_content
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, inflate_object_from_contents, pull_objects
from flwr.superlink.grid.http_grid import HttpGrid

FLOWER_SERIES = (1, 42)  # the Flower release whose internals this module is written against (see above)
CHUNKS_IN_FLIGHT = 2 * FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS  # ≤ 4 × 5 MiB of an array in memory at a time
MAX_INLINE_BYTES = 64 * 2**20  # what a reply may hold in memory besides its spooled arrays (metadata, metrics)
MALFORMED = (ValueError, KeyError, IndexError, TypeError, AttributeError)  # what bad object contents raise


class SpooledArray(Array):
    """An :class:`~flwr.app.Array` whose bytes are in the file ``path`` rather than in ``data`` (which is empty).

    ``nbytes`` is the number of bytes written. ``path`` is None when the array was refused before it was complete
    (larger than the limit given to :func:`pull_replies`); then ``nbytes`` is what had arrived when it was refused.
    """

    path: Path | None
    nbytes: int


def pull_replies(
    grid: Grid,
    message_ids: Iterable[str],
    spool_dir: Path,
    *,
    stypes: Iterable[str] = ("safetensors",),
    max_bytes: int = 0,
    max_inline_bytes: int = MAX_INLINE_BYTES,
) -> list[Message]:
    """Pull the replies to ``message_ids``; arrays whose stype is in ``stypes`` are written to files in
    ``spool_dir`` (on an :class:`HttpGrid`) and stop being written after ``max_bytes`` bytes (0 = no limit).
    Everything else of a reply is held in memory and may not exceed ``max_inline_bytes`` (a hostile node could
    otherwise send a huge array of another stype, or a huge config record).

    A reply whose objects cannot be pulled, are malformed or too large, or whose array cannot be written, comes
    back as an error reply (code 3, MESSAGE_UNAVAILABLE, as flwr's own pull returns), with its partial files
    removed. The caller owns the spooled files of the replies it gets: move them or :func:`discard` the reply.
    """
    if not isinstance(grid, HttpGrid):
        return list(grid.pull_messages(message_ids))
    run_id = grid.run.run_id
    client = grid._runtime_client  # noqa: SLF001  (the same client HttpGrid.pull_messages uses)
    pull_fn = make_pull_object_fn_protobuf(pull_object_protobuf=client.PullObject, node=grid.node, run_id=run_id)
    res = client.PullMessages(PullAppMessagesRequest(message_ids=list(message_ids)))
    replies = []
    for msg_proto, tree in zip(res.messages_list, res.message_object_trees, strict=True):
        msg_id = msg_proto.metadata.message_id
        spooled: dict[bytes, SpooledArray] = {}  # placeholder data → the array on disk
        placeholders: dict[str, Array] = {}  # object id of a spooled array → its placeholder
        reply_to = msg_proto.metadata.reply_to_message_id
        try:
            contents = _pull_tree(
                tree, pull_fn, spooled, placeholders, Path(spool_dir), frozenset(stypes), max_bytes, max_inline_bytes
            )
        except (ObjectPullError, OSError, *MALFORMED) as e:
            for array in spooled.values():
                _unlink(array)
            replies.append(_unavailable(run_id, grid.node.node_id, reply_to, e))
            continue
        client.ConfirmMessageReceived(
            ConfirmMessageReceivedRequest(node=grid.node, run_id=run_id, message_object_id=msg_id)
        )
        try:  # a peer's objects: malformed ones make an error reply, not a crash of the server
            message = cast(Message, inflate_object_from_contents(msg_id, contents, objects=placeholders))
        except MALFORMED as e:
            for array in spooled.values():
                _unlink(array)
            replies.append(_unavailable(run_id, grid.node.node_id, reply_to, e))
            continue
        message.metadata.__dict__["_message_id"] = msg_id
        if not message.has_error():  # ArrayRecord copies its arrays: swap each placeholder for its spooled array
            for record in message.content.array_records.values():
                for name, array in list(record.items()):
                    if array.data in spooled:
                        record[name] = spooled[array.data]
        replies.append(message)
    return replies


def spooled_arrays(message: Message) -> list[SpooledArray]:
    """The spooled arrays of a reply (none for an error reply or one pulled in memory)."""
    if message.has_error():
        return []
    return [
        a for record in message.content.array_records.values() for a in record.values() if isinstance(a, SpooledArray)
    ]


def discard(message: Message) -> None:
    """Remove the files of a reply's spooled arrays (a reply that is not kept)."""
    for array in spooled_arrays(message):
        _unlink(array)


def _pull_tree(
    tree,
    pull_fn: Callable[[str], bytes],
    spooled: dict[bytes, SpooledArray],
    placeholders: dict[str, Array],
    spool_dir: Path,
    stypes: frozenset[str],
    max_bytes: int,
    max_inline_bytes: int,
) -> dict[str, bytes]:
    """Pull the objects of a message's tree level by level; spool the chunks of matching arrays to files, each
    with a placeholder Array (no chunks, a unique token as data) for Flower to inflate in its place. Returns the
    contents of every object that was not spooled."""
    contents: dict[str, bytes] = {}
    level, inline = [tree], 0
    while level:
        for start in range(0, len(level), CHUNKS_IN_FLIGHT):  # a few at a time: the sum is checked as it grows
            got = pull_objects([node.object_id for node in level[start : start + CHUNKS_IN_FLIGHT]], pull_fn)
            inline += sum(len(c) for c in got.values())
            if inline > max_inline_bytes:
                raise ValueError(f"the reply's objects other than spooled arrays exceed {max_inline_bytes} bytes")
            contents.update(got)
        children = []
        for node in level:
            obj_type, chunk_ids, _ = get_object_head_values_from_object_content(contents[node.object_id])
            if obj_type == Array.__qualname__:
                head = json.loads(get_object_body(contents[node.object_id], Array))
                if head["stype"] in stypes:
                    order = [chunk_ids[i] for i in head["arraychunk_ids"]]
                    token = f"hddm-spooled-array:{uuid.uuid4()}".encode()
                    spooled[token] = _spool(head, order, pull_fn, spool_dir, max_bytes)
                    placeholders[node.object_id] = Array(
                        dtype=head["dtype"], shape=tuple(head["shape"]), stype=head["stype"], data=token
                    )
                    del contents[node.object_id]
                    continue
            children.extend(node.children)
        level = children
    return contents


def _spool(
    head: dict, chunk_ids: list[str], pull_fn: Callable[[str], bytes], spool_dir: Path, max_bytes: int
) -> SpooledArray:
    """Write the chunks of one array, in order, to a new file in ``spool_dir``."""
    array = SpooledArray(dtype=head["dtype"], shape=tuple(head["shape"]), stype=head["stype"], data=b"")
    array.nbytes = 0
    spool_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".spool-", suffix=f".{head['stype']}", dir=spool_dir)
    array.path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            for start in range(0, len(chunk_ids), CHUNKS_IN_FLIGHT):
                window = chunk_ids[start : start + CHUNKS_IN_FLIGHT]
                got = pull_objects(list(dict.fromkeys(window)), pull_fn)
                for chunk_id in window:
                    data = get_object_body(got[chunk_id], ArrayChunk)
                    array.nbytes += len(data)
                    if max_bytes and array.nbytes > max_bytes:
                        raise _TooLarge
                    f.write(data)
                del got
    except _TooLarge:
        _unlink(array)
    except BaseException:
        _unlink(array)
        raise
    return array


class _TooLarge(Exception):
    pass


def _unlink(array: SpooledArray) -> None:
    if array.path is not None:
        array.path.unlink(missing_ok=True)
        array.path = None


def _unavailable(run_id: int, node_id: int, reply_to: str, e: Exception) -> Message:
    """The error reply flwr's own pull makes when a reply's objects cannot be pulled."""
    metadata = Metadata(
        run_id=run_id,
        message_id="",
        src_node_id=node_id,
        dst_node_id=node_id,
        message_type=SYSTEM_MESSAGE_TYPE,
        group_id="",
        ttl=0,
        reply_to_message_id=reply_to,
        created_at=now().timestamp(),
    )
    reason = f"the reply could not be pulled to disk: {e}"
    return make_message(metadata=metadata, error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason=reason))
