"""glibc malloc's books around one large block, read through ctypes (``mallinfo2``, glibc ≥ 2.33): what the
tests of :func:`hddm_flower.devices.keep_freed_memory` read in fresh processes. Imports nothing heavy, so that a
spawned worker that runs it starts quickly."""

import ctypes

BLOCK = 20 * 2**20


def large_block(_=None) -> dict:
    """Malloc's books around one 20 MiB malloc and free in this process: bytes newly mapped for it, bytes of the
    heap newly in use, and the heap's free bytes once it is freed."""

    class Info(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        ]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_size_t],
        [ctypes.c_void_p],
    )
    before = libc.mallinfo2()
    block = libc.malloc(BLOCK)
    held = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    return {"mapped": held.hblkhd - before.hblkhd, "heap": held.uordblks - before.uordblks, "free": after.fordblks}
