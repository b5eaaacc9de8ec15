"""Keep freed memory in the process: glibc's malloc settings for processes that allocate large tensors
every step.

By default glibc serves each allocation above 128 KiB-32 MiB with its own mmap and gives it back to
the kernel on free, so a learner that builds a float batch of frames, its activations and their
gradients each update pays a page fault for every 4 KiB of them, every update: measured on the
shallow pixel torso (T x B = 640 frames of 4 x 84 x 84, one thread), 1,100 frames/s of forward and
backward with the default, 2,200 with these settings (bench/bench_pixels.py). The cost is memory
that stays with the process after its peak, up to `KEEP_BYTES` above what it uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("allocator")

KEEP_BYTES = 1 << 30  # serve allocations up to this from the heap, and keep this much free heap
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # malloc.h


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold and trim threshold to KEEP_BYTES and its top pad to 64 MiB for this
    process. Returns False (and changes nothing) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, KEEP_BYTES), (_M_TRIM_THRESHOLD, KEEP_BYTES), (_M_TOP_PAD, 64 << 20)))
    if not ok:
        log.debug("mallopt refused a setting; the allocator's defaults stay")
    return ok
