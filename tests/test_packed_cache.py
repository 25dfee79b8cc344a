"""The packed-weights cache (peagle/models/packed_cache.py): a packed load writes it, the next load maps it and gets the
same bytes without packing, and a cache that is corrupt, truncated, torn, or made from another file, library or CPU is
said, deleted and rebuilt, never used."""
from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from test_quant import K_FILES, tiny_cfg, tiny_gguf, tiny_names

from peagle import kernels
from peagle.models import packed_cache, quant
from peagle.models.loader import packed_cache_dir
from peagle.models.quant import QuantParts, QuantTensor, in_arena, read_gguf

pytestmark = pytest.mark.skipif(not kernels.available() or kernels.int_isa() == "none",
                                reason="no integer path: nothing is packed, so nothing is cached")


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    """Q4_K_M's mix of formats (fused parts in two formats), its cache folder in ``tmp_path``."""
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "cache"))
    tiny_gguf(tmp_path / "m.gguf", K_FILES["mixed"][0], hidden=256)
    return tmp_path / "m.gguf"


def load(path, monkeypatch=None, packing: bool = True) -> dict[str, torch.Tensor]:
    """``read_gguf`` as the integer path loads (``packing=False``: packing raises, so only a cache can serve)."""
    if monkeypatch is not None and not packing:
        monkeypatch.setattr(quant, "pack", lambda *a, **k: pytest.fail("packed although the cache is valid"))
    cfg = tiny_cfg(256)
    return read_gguf(path, tiny_names(cfg), cfg, True, torch.bfloat16, torch.float32, torch.device("cpu"), packs=True,
                     cache=packed_cache_dir())


def packed_bytes(sd: dict) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in sd.items():
        if isinstance(w, QuantParts):
            out.update({f"{name}.{i}": p.blocks.clone() for i, p in enumerate(w.parts)})
        elif isinstance(w, QuantTensor) and w.packed:
            out[name] = w.blocks.clone()
    return out


def cache_file(path):
    files = list((path.parent / "cache").glob("*.packed"))
    assert len(files) == 1, files
    return files[0]


def test_a_cached_load_maps_the_bytes_packing_gave(gguf_file, monkeypatch, capsys):
    """The first packed load writes the cache; the second packs nothing and holds the same bytes, in a mapping the
    kernels treat as the packed arena. Serving stale or other bytes from the cache fails it."""
    first = packed_bytes(load(gguf_file))
    size = cache_file(gguf_file).stat().st_size - packed_cache.DATA_START
    assert first and size >= sum(b.numel() for b in first.values()) and size % 64 == 0
    second = load(gguf_file, monkeypatch, packing=False)
    got = packed_bytes(second)
    assert got.keys() == first.keys()
    for name in first:
        assert torch.equal(got[name], first[name]), name
    assert all(in_arena(w.blocks) for w in second.values() if isinstance(w, QuantTensor) and w.packed)
    assert "not used" not in capsys.readouterr().err


def test_a_cache_in_small_pages_is_read_again_once_a_boot(gguf_file, monkeypatch, capsys):
    """A cache the page cache holds mostly in 4 KB pages is unmapped, dropped from the page cache
    (``POSIX_FADV_DONTNEED``), mapped again and checked again, once per file and boot (a marker beside it); one in
    2 MB pages, or on a kernel without huge page-cache pages, is kept as it is. Never dropping it, or dropping it at
    every start, fails this."""
    pack, first = quant.pack, packed_bytes(load(gguf_file))
    dropped, shares = [], iter([0.4, 0.4, 0.4, 0.95])
    monkeypatch.setattr(packed_cache, "REFAULT_BYTES", 0)
    monkeypatch.setattr(packed_cache, "huge_share", lambda data: next(shares))
    monkeypatch.setattr(packed_cache, "file_huge_pages", lambda: True)
    monkeypatch.setattr(packed_cache, "boot_id", lambda: "boot-1")
    monkeypatch.setattr(packed_cache.os, "posix_fadvise", lambda fd, at, n, advice: dropped.append(advice))
    again = packed_bytes(load(gguf_file, monkeypatch, packing=False))
    assert dropped == [os.POSIX_FADV_DONTNEED] and "2 MB pages" in capsys.readouterr().err
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
    marker = cache_file(gguf_file).with_name(cache_file(gguf_file).name + ".refaulted")
    assert marker.read_text() == "boot-1"
    load(gguf_file, monkeypatch, packing=False)   # small pages still, the same boot: kept
    assert dropped == [os.POSIX_FADV_DONTNEED]
    monkeypatch.setattr(packed_cache, "boot_id", lambda: "boot-2")
    load(gguf_file, monkeypatch, packing=False)   # a new boot: tried again
    assert len(dropped) == 2
    load(gguf_file, monkeypatch, packing=False)   # in 2 MB pages: kept
    monkeypatch.setattr(packed_cache, "file_huge_pages", lambda: False)
    monkeypatch.setattr(packed_cache, "huge_share", lambda data: 0.1)
    monkeypatch.setattr(packed_cache, "boot_id", lambda: "boot-3")
    load(gguf_file, monkeypatch, packing=False)   # no huge page-cache pages on this kernel: nothing to gain
    assert len(dropped) == 2
    spoil_data(cache_file(gguf_file))
    monkeypatch.setattr(quant, "pack", pack)
    load(gguf_file)   # a bad cache goes with its marker
    assert not marker.exists()


def test_a_cache_written_in_small_pages_is_read_again_by_its_writer(gguf_file, monkeypatch):
    """The process that writes a cache decodes from it too: written while memory is fragmented (its pages
    small), it is synced to the disk (the page cache keeps dirty pages), dropped and read back at once, and the
    marker spares later starts of this boot. Dropping it unsynced, or leaving it to later starts, fails this."""
    dropped, synced, sync = [], [], os.fdatasync
    monkeypatch.setattr(packed_cache, "REFAULT_BYTES", 0)
    monkeypatch.setattr(packed_cache, "huge_share", lambda data: 0.4)
    monkeypatch.setattr(packed_cache, "file_huge_pages", lambda: True)
    monkeypatch.setattr(packed_cache, "boot_id", lambda: "boot-1")
    monkeypatch.setattr(packed_cache.os, "fdatasync", lambda fd: (synced.append(fd), sync(fd)))
    monkeypatch.setattr(packed_cache.os, "posix_fadvise", lambda fd, at, n, advice: dropped.append((len(synced), advice)))
    first = packed_bytes(load(gguf_file))   # packed, written, read back
    assert dropped == [(1, os.POSIX_FADV_DONTNEED)]
    marker = cache_file(gguf_file).with_name(cache_file(gguf_file).name + ".refaulted")
    assert marker.read_text() == "boot-1"
    again = packed_bytes(load(gguf_file, monkeypatch, packing=False))   # the same boot: kept as it is
    assert len(dropped) == 1 and all(torch.equal(again[k], first[k]) for k in first)


def test_the_share_in_huge_pages_is_read_from_the_mapping(gguf_file):
    """``huge_share`` finds the cache's own mapping in /proc/self/smaps (a share, not None)."""
    load(gguf_file)
    path = cache_file(gguf_file)
    with open(path, "rb") as f:
        share = packed_cache.huge_share(packed_cache.mapped(f.fileno(), path.stat().st_size))
    assert share is not None and 0.0 <= share <= 1.0


def test_the_share_in_huge_pages_is_the_mappings_own(tmp_path):
    """``huge_share`` reads the block of the mapping that holds the data, up to its VmFlags: not a neighbour's
    fields, not the first mapping's."""
    data = torch.zeros(1 << 20, dtype=torch.uint8)
    start = data.data_ptr() - packed_cache.DATA_START
    def block(at, size_kb, pmd_kb):
        return (f"{at:x}-{at + size_kb * 1024:x} r--s 00000000 fd:00 12 /cache/x.packed\n"
                f"Size:            {size_kb} kB\nRss:             {size_kb} kB\n"
                f"FilePmdMapped:   {pmd_kb} kB\nVmFlags: rd sh mr mw me ms sd hg\n")
    smaps = tmp_path / "smaps"
    smaps.write_text(block(start - (1 << 30), 8192, 8192) + block(start, 4096, 1024) + block(start + (1 << 30), 2048, 2048))
    assert packed_cache.huge_share(data, str(smaps)) == 0.25
    smaps.write_text(block(start - (1 << 30), 8192, 8192))
    assert packed_cache.huge_share(data, str(smaps)) is None


def spoil_data(f):
    with open(f, "r+b") as fh:
        fh.seek(packed_cache.DATA_START + 1000)
        b = fh.read(1)
        fh.seek(packed_cache.DATA_START + 1000)
        fh.write(bytes([b[0] ^ 0x10]))


def truncate(f):
    os.truncate(f, f.stat().st_size - 64)


def tear_header(f):
    with open(f, "r+b") as fh:
        fh.seek(20)
        fh.write(b"\xff" * 16)


def other_library(f):
    with open(f, "r+b") as fh:
        magic, version, n = struct.unpack("<8sII", fh.read(16))
        head = json.loads(fh.read(n))
        head["key"]["library"] = "0" * 64
        blob = json.dumps(head).encode()
        fh.seek(0)
        fh.write(struct.pack("<8sII", magic, version, len(blob)) + blob)


@pytest.mark.parametrize("spoil, why", [(spoil_data, "do not match their checksum"), (truncate, "truncated"),
                                        (tear_header, "header is torn"), (other_library, "library changed")])
def test_a_bad_cache_is_said_deleted_and_rebuilt(gguf_file, monkeypatch, capsys, spoil, why):
    """Each way a cache can go bad is caught before a weight is read from it: the load says why, packs again, gets
    packing's bytes, and leaves a good cache (the next load packs nothing). A check removed lets the spoilt bytes or
    a short mapping through and fails it."""
    first = packed_bytes(load(gguf_file))
    spoil(cache_file(gguf_file))
    capsys.readouterr()
    again = packed_bytes(load(gguf_file))
    assert why in capsys.readouterr().err
    for name in first:
        assert torch.equal(again[name], first[name]), name
    load(gguf_file, monkeypatch, packing=False)
    assert "not used" not in capsys.readouterr().err


def test_a_killed_packers_leftover_is_swept(gguf_file):
    """A process killed while packing leaves its temporary file (the model's size) behind: the next start that
    writes the cache deletes it, and leaves a living process's alone."""
    import subprocess

    folder = gguf_file.parent / "cache"
    folder.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    load(gguf_file)
    real = cache_file(gguf_file).name
    dead, alive = folder / f"{real}.{gone.pid}.tmp", folder / f"{real}.{os.getppid()}.tmp"
    dead.write_bytes(b"x" * 100)
    alive.write_bytes(b"x")
    cache_file(gguf_file).unlink()
    load(gguf_file)
    assert not dead.exists() and alive.exists()


def test_a_changed_file_or_cpu_is_not_served_from_the_old_cache(gguf_file, monkeypatch, capsys):
    """The key holds the file's identity (size, time, inode, tensor table) and the integer path's instruction set:
    a rewritten file or another CPU's cache is rebuilt."""
    load(gguf_file)
    tiny_gguf(gguf_file, {**K_FILES["mixed"][0], "blk.0.ffn_down.weight": "Q8_0"}, hidden=256)
    capsys.readouterr()
    load(gguf_file)
    assert "not used: made from something else" in capsys.readouterr().err
    monkeypatch.setattr(kernels, "int_isa", lambda: "avx2-elsewhere")
    load(gguf_file)
    assert "cpu changed" in capsys.readouterr().err


def test_caches_off_or_unwritable_pack_in_memory(gguf_file, tmp_path, monkeypatch, capsys):
    """``PEAGLE_PACKED_CACHE=0`` writes nothing; a folder that cannot be made (here: a file in its way) or a disk
    that cannot hold the cache (``posix_fallocate`` failing) says so and packs into memory, the same bytes."""
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", "0")
    want = packed_bytes(load(gguf_file))
    assert not (tmp_path / "cache").exists()
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "blocked" / "cache"))
    got = packed_bytes(load(gguf_file))
    assert "no packed cache" in capsys.readouterr().err
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "cache"))

    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    full_disk = packed_bytes(load(gguf_file))
    assert "No space left" in capsys.readouterr().err and not list((tmp_path / "cache").glob("*"))
    monkeypatch.undo()
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "pwrite", full)  # a write that fails halfway: nothing kept, packed in memory again
    torn = packed_bytes(load(gguf_file))
    assert "packed cache not kept" in capsys.readouterr().err and not list((tmp_path / "cache").glob("*"))
    for name in want:
        assert torch.equal(got[name], want[name]) and torch.equal(full_disk[name], want[name]), name
        assert torch.equal(torn[name], want[name]), name


def test_the_packed_layout_is_the_same_in_every_process():
    """A packed load's places (and so its cache's key) follow the file's tensor order, never a set's, which changes
    with each process's string hashing: 20 layers' groups come out in the order their names came in."""
    from peagle.models.fused import fused_groups

    names = [f"model.layers.{i}.{m}.{p}_proj.weight" for i in range(20)
             for m, ps in (("self_attn", "qkv"), ("mlp", ("gate", "up"))) for p in ps]
    want = [f"model.layers.{i}.{f}.weight" for i in range(20) for f in ("self_attn.qkv_proj", "mlp.gate_up_proj")]
    assert list(fused_groups(names)) == want


@pytest.mark.skipif(not kernels.available() or kernels.bf16_isa() == "none", reason="no bf16 dot products here")
def test_a_bf16_file_is_packed_at_load_and_cached(tmp_path, monkeypatch):
    """With bf16 dot products a BF16 file's linear layers are packed straight from the file's pages (never held as
    plain bf16 beside the model) into the bytes :func:`pack_bf16` gives the matrix as read (llama.cpp's q/k row order
    undone first), then served from the cache; the embedding too (its rows looked up from the packed table), the
    norms stay plain tensors. Packing the rows before undoing the order, or another matrix's bytes, fails it."""
    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "cache"))
    b = "blk.0."
    types = {n: "BF16" for n in ("token_embd.weight", b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight",
                                 b + "attn_output.weight", b + "ffn_gate.weight", b + "ffn_up.weight",
                                 b + "ffn_down.weight")}
    tiny_gguf(tmp_path / "b.gguf", types, hidden=256)
    cfg = tiny_cfg(256)
    args = (tmp_path / "b.gguf", tiny_names(cfg), cfg, True, torch.bfloat16, torch.float32, torch.device("cpu"))
    plain, pack_bf16 = read_gguf(*args), quant.pack_bf16
    for cached in (False, True):
        packed = read_gguf(*args, packs=True, cache=packed_cache_dir())
        assert len(list((tmp_path / "cache").glob("*.packed"))) == 1
        for name, w in plain.items():
            if name.endswith(("_proj.weight", "embed_tokens.weight")):
                got = packed[name]
                assert isinstance(got, QuantTensor) and got.format == "bf16" and in_arena(got.blocks), (name, cached)
                assert torch.equal(got.blocks, pack_bf16(w)), (name, cached)
            else:
                assert not isinstance(packed[name], QuantTensor) and torch.equal(packed[name], w), name
        if not cached:
            monkeypatch.setattr(quant, "pack_bf16", lambda *a, **k: pytest.fail("packed although cached"))


@pytest.mark.skipif(not kernels.available() or kernels.bf16_isa() == "none", reason="no bf16 dot products here")
def test_a_bf16_model_packed_at_load_runs_as_one_packed_after_loading(tmp_path, monkeypatch):
    """The tied model (its embedding the LM head) packed at load gives the logits, bit for bit, of the same file
    read plain and packed after loading (:func:`pack_model`, the path before): the embedding's lookups and the head
    from one packed table. A head or lookup reading the table's bytes in another order fails it."""
    from conftest import run_full

    from peagle.models.layers import pack_model, set_precision
    from peagle.models.llama import build_target

    monkeypatch.setenv("PEAGLE_PACKED_CACHE", str(tmp_path / "cache"))
    tiny_gguf(tmp_path / "b.gguf", {n: "BF16" for n in K_FILES["mixed"][0]}, hidden=256)
    cfg = tiny_cfg(256)
    args = (tmp_path / "b.gguf", tiny_names(cfg), cfg, True, torch.bfloat16, torch.float32, torch.device("cpu"))
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    logits = []
    for sd in (read_gguf(*args), read_gguf(*args, packs=True, cache=packed_cache_dir())):
        with torch.device("meta"):
            model = build_target(cfg, (0, 1, 1))
        model.load_checkpoint(sd)
        set_precision(model, torch.bfloat16, torch.float32)  # as load_target leaves them, then packs
        pack_model(model.eval(), model.model.embed_tokens)
        assert isinstance(model.model.embed_tokens.weight, QuantTensor)
        logits.append(run_full(model, ids)[0])
    assert torch.equal(logits[0], logits[1])
