"""Host memory: fresh anonymous mappings (2 MB pages where asked), the heap handed back after a load, long-lived
objects frozen for the cyclic collector, and host lists copied to a device."""
from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import mmap

import torch


def freeze_long_lived() -> None:
    """Freeze every object alive now for the cyclic collector (``gc.freeze``: never walked again): called where
    what exists will live as long as the process (the CLI's imports, a model loaded with its tokenizer). Walking
    those millions of objects again at every full collection cost ~1 s of `peagle generate`'s
    start. A frozen object is still freed when its last reference goes; only a cycle of them
    waits, until exit, when they are unfrozen for the interpreter's last collection (native extensions that
    count their objects, nanobind's, report the rest as leaks)."""
    gc.freeze()
    _unfreeze_at_exit()


@functools.cache
def _unfreeze_at_exit() -> None:
    atexit.register(gc.unfreeze)


def trim_heap() -> None:
    """Free what reference cycles hold, then hand the C heap's free pages back to the OS (glibc's
    ``malloc_trim``; elsewhere nothing): parsing a tokenizer or reading a checkpoint frees hundreds of MB of
    small blocks between live ones, which glibc keeps resident otherwise (Gemma 3's tokenizer: 270 MB). The
    loaders call it as a model and its tokenizer arrive: what survives is theirs, frozen
    (:func:`freeze_long_lived`)."""
    gc.collect()
    freeze_long_lived()
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


HUGE_PAGE = 2 << 20


def anonymous_memory(size: int, huge: bool = False) -> torch.Tensor:
    """``size`` bytes (uint8) of fresh private anonymous memory: zeros that take memory only where written (a read
    of an untouched page maps the shared zero page). ``huge``: asked to be backed by 2 MB pages (Linux's
    ``MADV_HUGEPAGE``: transparent huge pages are often granted only where asked for) and starting at a 2 MB
    boundary; a plain mapping where the system takes no such advice. The tensor keeps the mapping alive."""
    pages = mmap.mmap(-1, size + (HUGE_PAGE if huge else 0), flags=mmap.MAP_PRIVATE)  # (shared would be shmem)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(pages, dtype=torch.uint8)
    at = -whole.data_ptr() % HUGE_PAGE if huge else 0
    return whole[at:at + size]


def to_device(data: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a tensor on ``device``: built on the CPU (named, so a default device never
    leaks in), then copied from pinned memory without blocking the host on CUDA."""
    t = torch.tensor(data, dtype=dtype, device="cpu")
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)
