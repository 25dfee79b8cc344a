"""The kernel table (peagle.kernels.table) picks what the call sites picked before it existed: each case below is
checked against the conditions as they were written at those call sites (commit bd9fe94), on every instruction
set this CPU has; with the library absent every operation takes torch's entry; a planted wrong predicate is
caught; and the library publishes the block layouts Python reads."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import peagle.engine.expansion  # noqa: F401  (each gives the table its torch kernels)
import peagle.engine.tree  # noqa: F401
from peagle import kernels
from peagle.cpu import cpu_has_native_bf16
from peagle.kernels import table
from peagle.models.amx_probe import random_blocks
from peagle.models.attention import DenseKV, KVCache
from peagle.models.layers import pack_weight
from peagle.models.quant import FORMATS, QuantParts, QuantTensor, dequantize, pack, pack_bf16

native = pytest.mark.skipif(not kernels.available(), reason="native kernels not loaded (not built, stale, or PEAGLE_NATIVE=0)")


def _blocks(fmt: str, n: int, k: int) -> torch.Tensor:
    return random_blocks(fmt, n, k, torch.Generator().manual_seed(0))


def _weights() -> dict[str, torch.Tensor]:
    """One weight of each format the linear row keys on (packed ones only where the library has their path)."""
    w = torch.randn(32, 64)
    out = {"float32": w, "float32 [in, out]": w.t().contiguous().t(), "bf16": w.bfloat16(),
           "q4_0 file": QuantTensor(_blocks("q4_0", 32, 64), torch.float32),
           "parts": QuantParts([QuantTensor(_blocks("q4_0", 16, 64), torch.float32),
                                QuantTensor(_blocks("q8_0", 16, 64), torch.float32)], torch.float32)}
    if torch.backends.mkldnn.is_available() and cpu_has_native_bf16():
        out["mkldnn"] = pack_weight(w.bfloat16())  # oneDNN's bf16 layout needs AVX-512 BF16 (Zen 3 refuses it)
    if table.runs_packed("packed"):  # as pack_model packs
        out["q4_0 packed"] = QuantTensor(pack(_blocks("q4_0", 32, 64)), torch.float32)
    if table.runs_packed("packed-bf16"):
        out["bf16 packed"] = QuantTensor(pack_bf16(w.bfloat16()), torch.float32)
    return out


def linear_before(x: torch.Tensor, w: torch.Tensor) -> str:
    """``peagle.models.layers.linear``'s choice before the table."""
    if isinstance(w, QuantParts):
        return "peagle.linear_parts" if kernels.native(x) else "mm"
    if isinstance(w, QuantTensor):
        return "peagle.linear" if kernels.native(x) else "mm"
    if kernels.native(x) and w.is_contiguous() and not w.is_mkldnn:
        return "peagle.linear"
    return "mkldnn" if w.is_mkldnn else "mm"


def linear_label(e: table.Entry) -> str:
    if e.native:
        return "peagle.linear_parts" if e.format == "parts" else "peagle.linear"
    return "mkldnn" if e.format == "mkldnn" else "mm"


PATH = {"float32": "cpu", "float32 [in, out]": "cpu", "bf16": "cpu", "q4_0 file": "cpu", "parts": "cpu",
        "q4_0 packed": "cpu-int", "bf16 packed": "cpu-bf16"}


def _activations() -> dict[str, torch.Tensor]:
    x = torch.randn(3, 64)
    return {"float32 2d": x, "float32 3d": x.view(3, 1, 64), "float32 strided": torch.randn(64, 3).t(),
            "bf16": x.bfloat16()}


def _caches():
    return {"paged": KVCache(8, 2, 16, torch.float32, "cpu"), "dense": DenseKV()}


def _metas():
    return {"short spans": SimpleNamespace(kernel_ok=True, long_groups=[]),
            "long groups": SimpleNamespace(kernel_ok=True, long_groups=[object()]),
            "padded": SimpleNamespace(kernel_ok=False, long_groups=[])}


def mismatches() -> list[str]:
    """Every case where the table's entry differs from the choice before it, on the current instruction set."""
    bad = []
    heads = [(16, 2), (kernels.limits().head_dim + 1, 2), (16, kernels.limits().group + 1)]
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for xn, x in _activations().items():
                case = f"{xn}, grad {grad}"
                for wn, w in _weights().items():
                    e = table.pick("linear", x, w)
                    if linear_label(e) != linear_before(x, w) or (e.native and e.isa != PATH[wn]):
                        bad.append(f"linear {wn} {case}: {e}")
                n = kernels.native(x)
                before = {"rms_norm": n, "add_rms_norm": n and x.dim() == 2, "silu_mul": n and x.dim() == 2,
                          "greedy": n and x.dim() == 2 and x.is_contiguous(),
                          "argmax": n and x.dim() == 2 and x.is_contiguous()}
                for op, want in before.items():
                    if table.pick(op, x, None, None, None).native != want:
                        bad.append(f"{op} {case}")
                for (cn, cache), (mn, meta), (hd, g) in ((c, m, h) for c in _caches().items()
                                                         for m in _metas().items() for h in heads):
                    at = isinstance(cache, KVCache) and meta.kernel_ok and kernels.native(x, hd, g)
                    if table.pick("attention", x, cache, meta, hd, g).native != at:
                        bad.append(f"attention {cn} {mn} {hd}/{g} {case}")
                    for ready in (True, False):
                        stacks = (ready and kernels.native(x, hd, g) and x.dim() == 2 and meta.kernel_ok
                                  and isinstance(cache, KVCache) and not meta.long_groups)
                        if table.pick("decoder_layers", x, [cache], meta, hd, g, lambda: ready).native != stacks:
                            bad.append(f"decoder_layers {cn} {mn} {hd}/{g} ready {ready} {case}")
                        for longest in (kernels.limits().span_rows, kernels.limits().span_rows + 1):
                            fuses = (kernels.native(x, hd, g) and isinstance(cache, KVCache)
                                     and longest <= kernels.limits().span_rows and ready)
                            if table.pick("draft", x, [cache], longest, hd, g, lambda: ready).native != fuses:
                                bad.append(f"draft {cn} {hd}/{g} {longest} rows ready {ready} {case}")
    t = torch.zeros(4, dtype=torch.long)
    for op in ("accept_paths", "expand"):
        if table.pick(op, t, None).native != kernels.native(t.device):
            bad.append(op)
    if table.pick("move_rows", [], t, t).native != kernels.native(t.device):
        bad.append("move_rows")
    for wn, w in _weights().items():
        if isinstance(w, QuantTensor) and table.pick("dequantize_rows", w, t).native != kernels.native(w.device):
            bad.append(f"dequantize_rows {wn}")
    return bad


def _isas() -> list[str]:
    if not kernels.available():
        return ["none"]
    names = ("amx", "avx512", "avxvnni", "avx2", "scalar")
    have = set(torch.ops.peagle.int_isas()) | {torch.ops.peagle.isa(), "scalar"}
    return [n for n in names if n in have]


@pytest.mark.parametrize("isa", _isas())
def test_table_picks_as_the_call_sites_did(isa):
    if isa == "none":
        assert mismatches() == []
        return
    with kernels.use_isa(isa), torch.no_grad():
        assert mismatches() == []
        w = _weights()
        x = torch.randn(2, 64)
        assert table.runs_packed("packed") == (kernels.int_isa() != "none")  # what pack_model and the loader asked
        assert table.runs_packed("packed-bf16") == (kernels.bf16_isa() != "none")
        for name, want in (("q4_0 packed", kernels.int_isa()), ("bf16 packed", kernels.bf16_isa()),
                           ("q4_0 file", kernels.isa()), ("bf16", kernels.isa())):
            if name in w:
                assert table.pick("linear", x, w[name]).runs() == want, name


@native
@torch.no_grad()
def test_table_runs_the_kernels_it_picked():
    """The chosen kernel's result is the one the call site computed before (bit for bit)."""
    x, b = torch.randn(3, 64), torch.randn(32)
    for name, w in _weights().items():
        xw, bw = (x.bfloat16(), b.bfloat16()) if w.is_mkldnn else (x, b)  # oneDNN's bf16 weights: a run without the kernels
        before = linear_before(xw, w)
        if before == "peagle.linear_parts":
            want = torch.ops.peagle.linear_parts(x, [p.blocks for p in w.parts], b)
        elif before == "peagle.linear":
            want = torch.ops.peagle.linear(x, w.blocks if isinstance(w, QuantTensor) else w, b)
        elif before == "mkldnn":
            want = torch.ops.mkldnn._linear_pointwise(xw, w, bw, "none", [], "")
        else:
            want = x @ w.t() + b
        got = table.run("linear", xw, w, bw)
        assert torch.equal(got, want), name
    g = torch.randn(3, 64)
    assert torch.equal(table.run("silu_mul", g, 32), torch.ops.peagle.silu_mul(g))
    assert torch.equal(table.run("rms_norm", g.view(3, 1, 64), torch.ones(64), 1e-6),
                       torch.ops.peagle.rms_norm(g, torch.ones(64), 1e-6).view(3, 1, 64))


def test_torch_entries_where_the_library_is_absent(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    x, w = torch.randn(3, 64), torch.randn(32, 64)
    q = QuantTensor(_blocks("q4_0", 32, 64), torch.float32)
    assert mismatches() == []
    for op, args in (("linear", (x, w)), ("linear", (x, q)), ("rms_norm", (x,)), ("greedy", (x,)),
                     ("accept_paths", (x,)), ("expand", (x,)), ("dequantize_rows", (q, torch.arange(2))),
                     ("attention", (x, KVCache(8, 2, 16, torch.float32, "cpu"), _metas()["short spans"], 16, 2))):
        assert table.pick(op, *args).isa == "torch", op
    assert torch.equal(table.run("linear", x, q), x @ q.dequantize(torch.float32).t())
    assert torch.equal(table.run("linear", x, w), x @ w.t())
    assert torch.equal(table.run("argmax", x), x.argmax(-1))
    assert torch.equal(table.run("dequantize_rows", q, torch.tensor([3, 1])), dequantize(q.blocks)[[3, 1]])
    assert not table.on_device(torch.device("cpu"))
    assert not table.runs_packed("packed") and not table.runs_packed("packed-bf16")


@native
def test_a_planted_wrong_predicate_is_caught(monkeypatch):
    """The comparison above fails where an entry's predicate is wrong: here the float matrix's native linear
    without its contiguity condition (a transposed view would reach the kernel)."""
    row = table.TABLE["linear", "float"]
    monkeypatch.setitem(table.TABLE, ("linear", "float"),
                        (dataclasses.replace(row[0], when=table._rows),) + row[1:])
    assert any(m.startswith("linear float32 [in, out]") for m in mismatches())


def test_every_entry_row_ends_with_torch_and_has_its_kernels():
    for (op, fmt), row in table.TABLE.items():
        assert row[-1].isa == "torch" and row[-1].when is table._always, (op, fmt)
        for e in row:
            assert (e.op, e.format) == (op, fmt)
            if e.kernel is None and op not in ("attention", "decoder_layers", "draft"):
                assert (op, fmt, e.isa) in table._provided, (op, fmt, e.isa)
    with pytest.raises(KeyError, match="no entry"):
        table.provides("linear", "triton")(lambda: None)


def test_the_library_publishes_the_block_layouts():
    """Read from the built library even where :func:`kernels.available` refused it (as it does one that differs)."""
    if not kernels.LIBRARY.exists() or not kernels.STAMP.exists() or kernels.STAMP.read_text() != kernels._fingerprint():
        pytest.skip("native kernels not built")
    torch.ops.load_library(str(kernels.LIBRARY))
    published = kernels.published_block_sizes()
    assert published == table.BLOCK_SIZES
    assert {n: (f.block_bytes, f.packed_bytes, f.weights) for n, f in FORMATS.items()} == published.formats


@native
def test_a_library_with_other_block_layouts_is_not_used(monkeypatch, capsys):
    other = dataclasses.replace(table.BLOCK_SIZES, formats={**table.BLOCK_SIZES.formats, "q4_0": (19, 288, 32)})
    monkeypatch.setattr(kernels, "published_block_sizes", lambda: other)
    assert kernels.available.__wrapped__() is False
    assert "block layouts differ" in capsys.readouterr().err
