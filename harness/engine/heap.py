"""Hand the heap that glibc keeps after large frees back to the system.

On Linux with glibc, tensors below glibc's mmap threshold come from the heap (the threshold rises with
each freed mmapped block, up to 32 MiB: a 64-row micro-batch's hidden-size activations then live there),
and freed heap stays in the process, in holes that later tensors do not always fit: a training step's
resident set grows well past its live tensors (bench/README.md, issue 29.2c/d). :func:`release_freed_heap`
calls glibc's ``malloc_trim(0)``, which returns every whole free page of every arena to the kernel
(``madvise``). ``harness.engine.fastlm`` calls it where a recomputed layer's temporaries have just been
freed: after each such layer's forward and after its backward (``completion_hidden``; only under autograd,
above ``CHECKPOINT_MIN_BYTES``). Phase boundaries alone (after generation, the reference forward, each
backward) were measured and do not reach the step's peak, which is inside the learner's forward and
backward. The allocator's settings are not changed: between calls, freed blocks are reused as before, so
the cost is one trim (tens of ms on a GiB-sized heap) and re-touching the returned pages, not an ``mmap``
per allocation (as ``MALLOC_MMAP_THRESHOLD_`` would do). Values are never touched.

``RELEASE_FREED_HEAP`` switches it (see its comment for the default). Without glibc (macOS, musl,
Windows) it does nothing.

:func:`limit_heap_retention` is the other lever, for a run that asks for it (``train.heap_mmap_threshold_kib``): glibc's
``mallopt`` then gives every allocation of at least that size a mapping of its own, unmapped when freed, and
returns the heap's free top at every free, so freed activations and KV caches leave the resident set at once.
It costs a ``mmap``/``munmap`` and fresh page faults per large allocation.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

# Whether release_freed_heap trims at all. On by default, with fastlm's 1,200 MiB recomputation budget: at the
# 27.3M bench step that pair peaks at 2,772-2,802 MiB (under 3 GB) and runs 1.4-3.3% faster than the earlier
# default (512 MiB budget, no trim: 2,752-2,870 MiB), its trims costing about 1.6 CPU s per step
# (bench/README.md, issue 29.2e). It is called only where a layer is recomputed (a large micro-batch), so
# small models never trim. False: the heap is kept (slightly less CPU, more memory).
RELEASE_FREED_HEAP = True


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` (int malloc_trim(size_t pad)), or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


@functools.lru_cache(maxsize=1)
def _mallopt():
    """glibc's ``mallopt`` (int mallopt(int param, int value)), or None where the C library is not glibc."""
    if _malloc_trim() is None:
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def limit_heap_retention(mmap_threshold_kib: int) -> bool:
    """In this process from now on, allocations of at least ``mmap_threshold_kib`` KiB are mapped on their own
    and unmapped when freed, and the heap's free top is returned at every free (glibc's ``mallopt``
    M_MMAP_THRESHOLD and M_TRIM_THRESHOLD 0, as the ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
    variables would set them at start-up; either disables glibc's rising threshold). 0 changes nothing (glibc's
    defaults: a threshold that rises with each freed mapping, up to 32 MiB). True when the settings took effect;
    False for 0 or without glibc. Values are never touched."""
    if mmap_threshold_kib <= 0:
        return False
    fn = _mallopt()
    if fn is None:
        return False
    return bool(fn(_M_MMAP_THRESHOLD, int(mmap_threshold_kib) * 1024)) and bool(fn(_M_TRIM_THRESHOLD, 0))


def release_freed_heap() -> bool:
    """Return the allocator's free heap pages to the system (glibc ``malloc_trim(0)``). True when memory
    was released; False when nothing was, glibc is absent or ``RELEASE_FREED_HEAP`` is off."""
    if not RELEASE_FREED_HEAP:
        return False
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
