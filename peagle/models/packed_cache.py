"""The packed-weights cache: a GGUF file's matrices as the integer path (or the bf16 dot products) pack them, written
once to a file that later starts map instead of packing again.

Why a file: packing itself is cheap (0.4-0.8 ns a weight), but the memory it is packed into is not. Fresh anonymous
memory is faulted in page by page (2 MB pages need the kernel to compact memory first), which took most of an 8B
file's start here (9 s for 4.2 GB of huge pages, 3.4 s of 4 KB pages, against 0.4 s to map the same bytes from the
page cache). So a start that finds its cache maps it, as llama.cpp maps its GGUF file. The first start packs each
matrix into one reused scratch buffer and writes it to the new cache file (``pwrite``: the page cache then holds the
file in large folios, which map as 2 MB pages; packing through a shared mapping of the file faulted its pages in at
4 KB, and an 8B decoding step ran 14% slower on them). A later start that finds its cache mostly in small pages
(memory was fragmented when the file was written) has the page cache read it again in 2 MB pages, once a boot.

A cache is used only when everything it was made from is unchanged: the GGUF file (path, size, modification time,
inode and its tensor table), what was packed where, the packing library's build and the CPU's integer path. Its data's
checksum (a sum per 2 MB chunk, position-sensitive through the chunk sums' SHA-256) is checked at every start, which
costs one read of the pages the first token reads anyway. A cache that fails any check is reported, deleted and
rebuilt; it is never used. Where caches live is the loader's choice (:func:`peagle.models.loader.packed_cache_dir`).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from peagle.files import temp_beside, temps_of

MAGIC = b"PEAGLEPK"
VERSION = 1
DATA_START = 2 << 20  # the data starts on a 2 MB boundary of the file, so that the page cache can map it in 2 MB pages
CHUNK = 2 << 20       # the checksum's granule
REFAULT_BYTES = 64 << 20  # a cache smaller than this stays as the page cache holds it (too little to gain)
# the share of a cache in 2 MB pages below which it is read again: at 44% and 54% a step ran 0.61x and 0.57x the
# speed of the same bytes in 2 MB pages; at 77% level (3B Q4_0, 13.6-13.8 tok/s either way), where reading it
# again added 2.3 s to a first start
HUGE_SHARE = 0.75
_HEAD = struct.Struct("<8sII")  # magic, version, JSON length


def checksum(data: torch.Tensor) -> str:
    """A checksum of ``data`` (uint8, a multiple of 8 bytes) at memory speed on every thread: each 2 MB chunk's
    wrapping int64 sum, then the SHA-256 of those sums (so a chunk moved elsewhere changes it too)."""
    words = data.view(torch.int64)
    n = words.numel() // (CHUNK // 8) * (CHUNK // 8)
    sums = [words[:n].view(-1, CHUNK // 8).sum(dim=1), words[n:].sum().reshape(1)]
    return hashlib.sha256(torch.cat(sums).numpy().tobytes()).hexdigest()


def mapped(fd: int, size: int) -> torch.Tensor:
    """A cache file's data, mapped copy-on-write (never written through) and asked for 2 MB pages; the tensor keeps
    the mapping alive."""
    pages = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(pages, dtype=torch.uint8)[DATA_START:]


def huge_share(data: torch.Tensor, smaps: str = "/proc/self/smaps") -> float | None:
    """The share of the cache mapping that holds ``data`` which is mapped in 2 MB pages (``smaps``:
    ``FilePmdMapped`` over ``Size``), or None where that cannot be read."""
    start = f"{data.data_ptr() - DATA_START:x}-"
    try:
        with open(smaps) as f:
            lines = iter(f)
            if any(line.startswith(start) for line in lines):   # the mapping's own block, up to its VmFlags
                fields = dict(line.split(":", 1) for line in itertools.takewhile(lambda x: not x.startswith("VmFlags"), lines))
                return int(fields["FilePmdMapped"].split()[0]) / max(1, int(fields["Size"].split()[0]))
    except (OSError, KeyError, ValueError):
        pass
    return None


def file_huge_pages() -> bool:
    """Whether this kernel holds files in the page cache in huge pages at all (``FileHugePages`` in use)."""
    try:
        with open("/proc/meminfo") as f:
            return any(line.startswith("FileHugePages:") and int(line.split()[1]) > 0 for line in f)
    except (OSError, ValueError):
        return False


def boot_id() -> str:
    """This boot's id (a refault is tried once a boot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass
class PackedCache:
    """One GGUF file's cache: ``key`` is everything the packed bytes depend on (compared whole at every start),
    ``size`` the packed bytes."""
    path: Path
    key: dict
    size: int

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
        no cache or it fails a check (said on stderr; the bad file is deleted). Where the page cache holds the file
        in small pages, it is dropped from it once this boot and read back in 2 MB pages (:meth:`_in_huge_pages`)."""
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
            data = mapped(fh.fileno(), DATA_START + self.size)
            if checksum(data) != head["checksum"]:
                return self._reject("its data do not match their checksum (corrupt)")
            if not self._in_huge_pages(data):
                del data   # unmapped: the page cache's pages of the file are no longer in use here
                data = self._read_again(fh.fileno(), head["checksum"])
        return data if data is not None else self._reject("its data do not match their checksum (corrupt)")

    def _read_again(self, fd: int, sums: str) -> torch.Tensor | None:
        """The file dropped from the page cache (on the disk first: dirty pages are not dropped; the caller's
        mapping of it gone, or its pages stay) and mapped again, so that its pages come back through the
        ``MADV_HUGEPAGE`` mapping, in 2 MB pages; checked again against ``sums`` (None where they differ)."""
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        data = mapped(fd, DATA_START + self.size)
        return data if checksum(data) == sums else None

    @property
    def marker(self) -> Path:
        """Where :meth:`_in_huge_pages` notes the boot it had this file read again in (gone with the file)."""
        return self.path.with_name(self.path.name + ".refaulted")

    def _in_huge_pages(self, data: torch.Tensor) -> bool:
        """Whether to keep ``data``'s mapping as it is: at least :data:`HUGE_SHARE` of it in 2 MB pages, or no
        better to be had.
        A file the page cache holds in small pages (written while memory was fragmented: half of a 3B file here)
        decoded at 0.57x the speed of the same bytes in 2 MB pages (195 against 111 ms a step; a virtual machine's
        two-level page walks). Faulted in again through the ``MADV_HUGEPAGE`` mapping after ``POSIX_FADV_DONTNEED``,
        the page cache reads it back in 2 MB pages (1,766 of 1,769 MB; 100-107 ms a step): one read of the file
        from the disk, tried once per cache file and boot (a marker beside it), and only where the kernel puts
        files in huge pages at all (``FileHugePages``)."""
        share = huge_share(data) if data.numel() >= REFAULT_BYTES else None
        if share is None or share >= HUGE_SHARE or not file_huge_pages():
            return True
        marker, boot = self.marker, boot_id()
        try:
            if marker.read_text() == boot:
                return True
        except OSError:
            pass
        with contextlib.suppress(OSError):
            marker.write_text(boot)
        print(f"peagle: packed cache {self.path.name}: {share:.0%} in 2 MB pages; read again into 2 MB pages",
              file=sys.stderr)
        return False

    def create(self) -> CacheWriter | None:
        """A writer of the new cache file, its blocks reserved on disk first (a full disk is said here, not met
        halfway), or None where it cannot be made (said)."""
        tmp = temp_beside(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._sweep()
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, DATA_START + self.size)
            except OSError:
                os.close(fd)
                raise
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            print(f"peagle: no packed cache ({self.path.parent}: {e}); packing in memory", file=sys.stderr)
            return None
        return CacheWriter(self, tmp, fd)

    def _sweep(self) -> None:
        """Delete the temporary files of this cache that a process which is gone left (killed while packing): each
        is the model's size."""
        for f, pid in temps_of(self.path):
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
            self.marker.unlink(missing_ok=True)
        return None


class CacheWriter:
    """A cache file being written: each packed matrix at its place (``write``), then sealed (``commit``)."""

    def __init__(self, cache: PackedCache, tmp: Path, fd: int):
        self.cache, self.tmp, self.fd, self.error = cache, tmp, fd, None

    def write(self, at: int, data: torch.Tensor) -> None:
        """``data`` (contiguous uint8) at byte ``at`` of the data; a failure is kept for ``commit`` to say."""
        if self.error is not None:
            return
        view, pos = memoryview(data.reshape(-1).numpy()), DATA_START + at
        try:
            while view:
                n = os.pwrite(self.fd, view, pos)
                view, pos = view[n:], pos + n
        except OSError as e:
            self.error = e

    def commit(self) -> torch.Tensor | None:
        """The cache sealed and mapped (copy-on-write: never written through): its checksum from the mapped
        pages, the header written last, then renamed into place (atomic: a start sees the old file, none, or this
        whole one; data a crash left unwritten fail the checksum). None where a write failed (said)."""
        try:
            if self.error is not None:
                raise self.error
            data = mapped(self.fd, DATA_START + self.cache.size)
            sums = checksum(data)
            blob = json.dumps({"key": self.cache.key, "checksum": sums}).encode()
            if _HEAD.size + len(blob) > DATA_START:
                raise OSError(f"its header is {len(blob)} bytes")
            os.pwrite(self.fd, _HEAD.pack(MAGIC, VERSION, len(blob)) + blob, 0)
            os.replace(self.tmp, self.cache.path)
            self.cache.marker.unlink(missing_ok=True)   # a new file: its own pages
            if not self.cache._in_huge_pages(data):   # written while memory was fragmented: this process decodes
                del data                               # from these pages too, not only later starts
                data = self.cache._read_again(self.fd, sums)
                if data is None:
                    self.cache.path.unlink(missing_ok=True)
                    raise OSError("its data, read back from the disk, do not match their checksum")
        except OSError as e:
            print(f"peagle: packed cache not kept ({e}); packing in memory", file=sys.stderr)
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)
            return None
        finally:
            os.close(self.fd)
        return data
