"""The packed-weights cache: a GGUF file's matrices as the integer path (or the bf16 dot products) pack them, written
once to a file that later starts map instead of packing again.

Why a file: packing itself is cheap (0.4-0.8 ns a weight), but the memory it is packed into is not. Fresh anonymous
memory is faulted in page by page (2 MB pages need the kernel to compact memory first), which took most of an 8B
file's start here (9 s for 4.2 GB of huge pages, 3.4 s of 4 KB pages, against 0.4 s to map the same bytes from the
page cache). So a start that finds its cache maps it, as llama.cpp maps its GGUF file, and the first start packs
straight into the new cache file's pages (no anonymous copy either).

A cache is used only when everything it was made from is unchanged: the GGUF file (path, size, modification time,
inode and its tensor table), what was packed where, the packing library's build and the CPU's integer path. Its data's
checksum (a sum per 2 MB chunk, position-sensitive through the chunk sums' SHA-256) is checked at every start, which
costs one read of the pages the first token reads anyway. A cache that fails any check is reported, deleted and
rebuilt; it is never used. Where caches live is the loader's choice (:func:`peagle.models.loader.packed_cache_dir`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

MAGIC = b"PEAGLEPK"
VERSION = 1
DATA_START = 2 << 20  # the data starts on a 2 MB boundary of the file, so that the page cache can map it in 2 MB pages
CHUNK = 2 << 20       # the checksum's granule
_HEAD = struct.Struct("<8sII")  # magic, version, JSON length


def checksum(data: torch.Tensor) -> str:
    """A checksum of ``data`` (uint8, a multiple of 8 bytes) at memory speed on every thread: each 2 MB chunk's
    wrapping int64 sum, then the SHA-256 of those sums (so a chunk moved elsewhere changes it too)."""
    words = data.view(torch.int64)
    n = words.numel() // (CHUNK // 8) * (CHUNK // 8)
    sums = [words[:n].view(-1, CHUNK // 8).sum(dim=1), words[n:].sum().reshape(1)]
    return hashlib.sha256(torch.cat(sums).numpy().tobytes()).hexdigest()


@dataclass
class PackedCache:
    """One GGUF file's cache: ``key`` is everything the packed bytes depend on (compared whole at every start),
    ``size`` the packed bytes."""
    path: Path
    key: dict
    size: int
    pending: tuple | None = None  # (the new file's temporary path, its mapping) between create and commit

    @classmethod
    def of(cls, where: Path, gguf: Path, tensors: list, places: dict, layout: dict, library: str,
           cpu: str) -> PackedCache:
        """The cache in folder ``where`` for ``gguf`` packed as ``places`` (``layout``: the packing's other choices).
        One cache per source path: a changed file's cache is replaced, not kept beside it."""
        st = gguf.stat()
        table = hashlib.sha256(json.dumps([[n, int(t), list(s), o, b] for n, t, s, o, b in tensors]).encode())
        key = {"version": VERSION, "source": str(gguf.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
               "inode": st.st_ino, "tensors": table.hexdigest(), "places": places, "layout": layout,
               "library": library, "cpu": cpu}
        name = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:24]
        size = -(-max(a + n for a, n in places.values()) // 64) * 64
        return cls(where / f"{gguf.name}.{name}.packed", json.loads(json.dumps(key)), size)  # as read back

    def load(self) -> torch.Tensor | None:
        """The cached bytes, mapped (copy-on-write: the file is never written through them), or None where there is
        no cache or it fails a check (said on stderr; the bad file is deleted)."""
        try:
            fh = open(self.path, "rb")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            return self._reject(f"unreadable ({e})")
        with fh:
            try:
                magic, version, n = _HEAD.unpack(fh.read(_HEAD.size))
                head = json.loads(fh.read(n)) if magic == MAGIC and version == VERSION and n < DATA_START else None
            except (struct.error, ValueError):
                head = None
            if not isinstance(head, dict) or not isinstance(head.get("checksum"), str):
                return self._reject("not a peagle packed cache of this version, or its header is torn")
            old = head.get("key") if isinstance(head.get("key"), dict) else {}
            if old != self.key:
                changed = [k for k in self.key if old.get(k) != self.key[k]]
                return self._reject(f"made from something else ({', '.join(changed)} changed)")
            if os.fstat(fh.fileno()).st_size != DATA_START + self.size:
                return self._reject("truncated or padded")
            pages = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            pages.madvise(mmap.MADV_HUGEPAGE)
        data = torch.frombuffer(pages, dtype=torch.uint8)[DATA_START:]
        if checksum(data) != head["checksum"]:
            return self._reject("its data do not match their checksum (corrupt)")
        return data

    def create(self) -> torch.Tensor | None:
        """A new cache file's data pages, mapped shared (packing into them writes the file), its blocks reserved on
        disk first (a full disk is an error here, not a SIGBUS later), or None where it cannot be made (said)."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._sweep()
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, DATA_START + self.size)
                pages = mmap.mmap(fd, DATA_START + self.size, flags=mmap.MAP_SHARED)
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            print(f"peagle: no packed cache ({self.path.parent}: {e}); packing in memory", file=sys.stderr)
            return None
        self.pending = (tmp, pages)
        return torch.frombuffer(pages, dtype=torch.uint8)[DATA_START:DATA_START + self.size]

    def commit(self, data: torch.Tensor) -> None:
        """Seal the new cache: header and checksum written last, then renamed into place (atomic: a start sees the
        old file, none, or this whole one; data a crash left unwritten fail the checksum)."""
        tmp, pages = self.pending
        self.pending = None
        blob = json.dumps({"key": self.key, "checksum": checksum(data)}).encode()
        if _HEAD.size + len(blob) > DATA_START:
            print(f"peagle: packed cache not kept (its header is {len(blob)} bytes)", file=sys.stderr)
            tmp.unlink(missing_ok=True)
            return
        pages[:_HEAD.size + len(blob)] = _HEAD.pack(MAGIC, VERSION, len(blob)) + blob
        try:
            os.replace(tmp, self.path)
        except OSError as e:
            print(f"peagle: packed cache not kept ({e})", file=sys.stderr)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _sweep(self) -> None:
        """Delete the temporary files of this cache that a process which is gone left (killed while packing): each
        is the model's size."""
        for f in self.path.parent.glob(f"{self.path.name}.*.tmp"):
            pid = f.name[len(self.path.name) + 1:-len(".tmp")]
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    f.unlink()
            except (ValueError, PermissionError):  # not ours to judge: another user's process, or not our name
                pass

    def _reject(self, why: str) -> None:
        print(f"peagle: packed cache {self.path} not used: {why}; packing again", file=sys.stderr)
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        return None
