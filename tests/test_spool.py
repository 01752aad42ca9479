"""Replies pulled through flwr's real HttpGrid with their weights spooled to disk chunk by chunk (strategies/spool.py).

The stand-in SuperLink (strategies/inprocess_grid.WireRuntime) serves Flower's wire objects: 5 MiB ArrayChunks under an Array,
an ArrayRecord, a RecordDict and the Message, as a SuperLink's object store does."""

import hashlib
import json
import os
import tracemalloc

import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from strategies.inprocess_grid import WireRuntime, wire_grid
from strategies.spool import CHUNKS_IN_FLIGHT, SpooledArray, discard, pull_replies

CHUNK = 5 * 2**20  # flwr's ArrayChunk size


def _reply_with(blob: bytes):
    def deliver(message):
        return Message(
            RecordDict(
                {
                    "expert": ArrayRecord(
                        {"weights": Array(dtype="uint8", shape=(len(blob),), stype="safetensors", data=blob)}
                    ),
                    "small": ArrayRecord({"bias": Array(dtype="uint8", shape=(3,), stype="raw", data=b"abc")}),
                    "meta": ConfigRecord({"meta": json.dumps({"sha256": hashlib.sha256(blob).hexdigest()})}),
                }
            ),
            reply_to=message,
        )

    return deliver


def _pull(blob: bytes, spool_dir, *, withhold=(), **pull_kw):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    runtime = WireRuntime([7], _reply_with(blob), withhold=withhold)
    grid = wire_grid(runtime)
    ids = list(grid.push_messages([Message(RecordDict(), dst_node_id=7, message_type="train")]))
    return runtime, pull_replies(grid, ids, spool_dir, **pull_kw)


def test_weights_arrive_on_disk_byte_for_byte_and_the_rest_of_the_reply_as_usual(tmp_path):
    blob = hashlib.sha256(b"seed").digest() * (CHUNK * 3 // 32 + 1000)  # 3 full chunks and a partial one
    runtime, [reply] = _pull(blob, tmp_path / "spool")
    weights = reply.content["expert"]["weights"]
    assert isinstance(weights, SpooledArray) and weights.data == b"" and weights.nbytes == len(blob)
    assert weights.path.parent == tmp_path / "spool" and weights.path.read_bytes() == blob
    assert (weights.dtype, weights.shape, weights.stype) == ("uint8", (len(blob),), "safetensors")
    assert reply.content["small"]["bias"].data == b"abc"  # other stypes are inflated by Flower
    assert json.loads(str(reply.content["meta"]["meta"]))["sha256"] == hashlib.sha256(blob).hexdigest()
    assert runtime.confirmed == [reply.metadata.message_id]  # the SuperLink may drop the objects now
    discard(reply)
    assert list((tmp_path / "spool").iterdir()) == []


def test_repeated_chunks_are_written_in_order(tmp_path):
    """Flower sends identical chunks once (an array of zeros has one unique chunk); the file must repeat it."""
    blob = b"\0" * (2 * CHUNK) + b"\1" * 10 + b"\0" * CHUNK
    runtime, [reply] = _pull(blob, tmp_path)
    assert reply.content["expert"]["weights"].path.read_bytes() == blob


def test_a_lost_chunk_gives_an_error_reply_and_leaves_no_file(tmp_path):
    from flwr.app.message.array import Array as FlwrArray

    blob = bytes(range(256)) * (CHUNK // 128)  # two chunks
    lost = FlwrArray(dtype="uint8", shape=(len(blob),), stype="safetensors", data=blob).slice_array()[1][0]
    runtime, [reply] = _pull(blob, tmp_path, withhold=[lost])
    assert reply.has_error() and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert "could not be pulled" in reply.error.reason and lost in reply.error.reason
    assert reply.metadata.reply_to_message_id  # maps back to the expert whose reply it was
    assert list(tmp_path.iterdir()) == [] and runtime.confirmed == []


def test_an_oversized_array_stops_being_written_at_the_limit(tmp_path):
    blob = b"x" * (3 * CHUNK)
    runtime, [reply] = _pull(blob, tmp_path, max_bytes=CHUNK + 1)
    weights = reply.content["expert"]["weights"]
    assert weights.path is None and CHUNK + 1 < weights.nbytes <= 2 * CHUNK  # refused within one window
    assert list(tmp_path.iterdir()) == []


def test_a_large_array_of_another_stype_is_refused_not_held_in_memory(tmp_path):
    """Only the weights' stype is spooled; anything else large (a hostile node's numpy array) is refused once the
    reply's in-memory objects pass the limit."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1

    def deliver(message):
        big = Array(dtype="uint8", shape=(4 * CHUNK,), stype="numpy.ndarray", data=os.urandom(4 * CHUNK))
        return Message(RecordDict({"expert": ArrayRecord({"weights": big})}), reply_to=message)

    grid = wire_grid(WireRuntime([7], deliver))
    ids = list(grid.push_messages([Message(RecordDict(), dst_node_id=7, message_type="train")]))
    [reply] = pull_replies(grid, ids, tmp_path, max_inline_bytes=2 * CHUNK)
    assert reply.has_error() and "exceed 10485760 bytes" in reply.error.reason


def test_malformed_objects_make_an_error_reply_not_a_crash(tmp_path):
    from flwr.app.message.array import Array as FlwrArray

    blob = b"\1" * 100
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    array = FlwrArray(dtype="uint8", shape=(len(blob),), stype="safetensors", data=blob)
    grid = wire_grid(runtime := WireRuntime([7], _reply_with(blob)))
    ids = list(grid.push_messages([Message(RecordDict(), dst_node_id=7, message_type="train")]))
    runtime.answer(ids[0])
    content = runtime.objects[array.object_id]  # the Array's head points at chunk index 5 of 1
    runtime.objects[array.object_id] = content.replace(b'"arraychunk_ids": [0]', b'"arraychunk_ids": [5]')
    [reply] = pull_replies(grid, ids, tmp_path)
    assert reply.has_error() and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spool", [True, False], ids=["spooled", "flwr-pull"])
def test_peak_python_memory_while_pulling_is_a_few_chunks_not_the_checkpoint(spool, tmp_path):
    """The point of spooling: flwr's own HttpGrid.pull_messages holds the chunks, a bytearray and the bytes of
    an array at once (≈3× its size); the spooled pull holds a few 5 MiB chunks (allocations traced by Python)."""
    blob = hashlib.sha256(b"big").digest() * (96 * 2**20 // 32)  # 96 MiB, 20 chunks
    size = len(blob)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    runtime = WireRuntime([7], _reply_with(blob))
    grid = wire_grid(runtime)
    ids = list(grid.push_messages([Message(RecordDict(), dst_node_id=7, message_type="train")]))
    runtime.answer(ids[0])  # the reply waits on the "SuperLink" before the server looks
    del blob
    tracemalloc.start()
    try:
        replies = pull_replies(grid, ids, tmp_path) if spool else list(grid.pull_messages(ids))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(replies) == 1 and not replies[0].has_error()
    if spool:  # the chunks in flight, one body being written, and small change: independent of the array's size
        assert peak < (CHUNKS_IN_FLIGHT + 2) * CHUNK, f"spooled pull peaked at {peak / CHUNK:.1f} chunks"
    else:  # documents what spooling avoids; if a Flower upgrade streams by itself this tells us
        assert peak > 2 * size, f"flwr's pull peaked at {peak / size:.2f}× the array"
