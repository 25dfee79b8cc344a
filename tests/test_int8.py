"""The integer path (``--compute fast``, peagle/kernels/csrc/kernels.h): GGUF blocks of every format times
activations quantized per row to 8 bits, through integer dot products. Every instruction set (AMX-INT8,
AVX512-VNNI, AVX-VNNI, AVX2; the AMX kernel also over a C++ model of the tile instructions, so that it runs
on any AVX512-VNNI CPU) gives the bits of the scalar reference on the file's blocks, which gives the bits of a torch
re-statement of the arithmetic that shares no code with either; a row's result does not depend on the pass;
packed blocks hold the file's values; and speculation on a quantized model equals plain decoding token for
token on every instruction set this CPU has, with drafts accepted."""
from __future__ import annotations

import itertools
import json
import os

import gguf
import numpy as np
import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, assert_lossless_on_path
from test_kernels import each_isa
from test_quant import case, random_blocks

from peagle import kernels
from peagle.models import amx_probe
from peagle.models.layers import Linear, pack_model
from peagle.models.loader import init_drafter
from peagle.models.quant import FORMATS, QBLOCK, QuantTensor, blocks_of, dequantize, pack, packable

native = pytest.mark.skipif(os.environ.get("PEAGLE_NATIVE") == "0" or not kernels.available(),
                            reason="the native kernels are off")
INT_FORMATS = list(FORMATS)  # every format has an integer path
INT_ISAS = {"amx": "amx", "avx512": "avx512vnni", "avxvnni": "avxvnni", "avx2": "avx2"}  # the ISA cap -> its integer path
AMX_MODEL = "amx-model"  # amx.cpp's kernel over its model of the tiles: needs AVX512-VNNI alone
STREAMS = [(16 << 20, 16 << 20), (0, 0)]  # the default tiles, and one packed group wide for every weight


def int_isas() -> list[str]:
    """The integer paths this CPU runs, widest first."""
    return list(torch.ops.peagle.int_isas()) if kernels.available() else []


def each_int_isa():
    """Every integer path (and the AMX kernel over its model of the tiles), one test case each, skipped with the
    reason where this CPU lacks it."""
    have = int_isas() if os.environ.get("PEAGLE_NATIVE") != "0" else []
    return pytest.mark.parametrize("isa", [
        pytest.param(isa, marks=pytest.mark.skipif(isa not in have, reason=f"this CPU has no {isa} integer path"))
        for isa in INT_ISAS.values()] + [
        pytest.param(AMX_MODEL, marks=pytest.mark.skipif("avx512vnni" not in have, reason="the AMX model needs AVX512-VNNI"))])


def runs_on(cap: str) -> bool:
    """Whether the operators capped at ``cap`` run its integer path here (AVX-512 without VNNI runs a
    narrower one)."""
    try:
        with kernels.use_isa(cap):
            return kernels.int_isa() == INT_ISAS[cap]
    except RuntimeError:  # this CPU has no such instruction set
        return False


def isa_caps() -> list:
    """The operators' ISA caps, each a pytest param, skipped with a stated reason where this CPU does not
    run its integer path."""
    have = kernels.available() and os.environ.get("PEAGLE_NATIVE") != "0"
    return [pytest.param(cap, marks=pytest.mark.skipif(not (have and runs_on(cap)),
                                                       reason=f"this CPU has no {INT_ISAS[cap]} integer path"))
            for cap in INT_ISAS]


def half(b: torch.Tensor) -> torch.Tensor:
    """Two bytes (the last dimension) as the float32 value of a fp16."""
    return b.contiguous().view(torch.float16).float()[..., 0]


def chunks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The file's blocks ``[N, nb, block bytes]`` read as GGML's code reads them, in chunks of 32 weights:
    the integers q ``[N, K / 32, 32]`` (less q4_0's 8, q5_0's 16, q6_k's 32), float32 scales ``[N, K / 32, 2]``
    (weights 0..15 and 16..31) and mins ``[N, K / 32]`` (0 without), value = q * s or q * s + m."""
    f = {b.block_bytes: b for b in FORMATS.values()}[blocks.shape[-1]]
    n, nb, _ = blocks.shape
    b = blocks.long()
    nib = lambda qs: torch.cat([qs & 15, qs >> 4], -1)  # noqa: E731  (q4's byte j: weights j and j + 16)
    m = torch.zeros(n, nb * f.weights // QBLOCK)
    if f.weights == QBLOCK:
        d = half(blocks[..., 0:2])
        if f.name == "q8_0":
            q = blocks[..., 2:].contiguous().view(torch.int8).long()
        else:
            head = 4 if f.has_min else 2
            five = f.name in ("q5_0", "q5_1")
            qh = sum(b[..., head + i] << 8 * i for i in range(4)) if five else torch.zeros_like(b[..., 0])
            q = nib(b[..., head + 4 * five:]) | ((qh[..., None] >> torch.arange(32)) & 1) << 4
            q = q - {"q4_0": 8, "q5_0": 16}.get(f.name, 0)
        if f.has_min:
            m = half(blocks[..., 2:4])
        return q, torch.stack([d, d], -1), m
    j = torch.arange(8)
    if f.name == "q6_k":
        h, v = j // 4, j % 4
        ql = b[..., :128].reshape(n, nb, 2, 2, 32)[:, :, h, v % 2] >> (4 * (v // 2))[:, None] & 15
        qh = b[..., 128:192].reshape(n, nb, 2, 32)[:, :, h] >> (2 * v)[:, None] & 3
        sc = blocks[..., 192:208].contiguous().view(torch.int8).float().reshape(n, nb, 8, 2)
        s = half(blocks[..., 208:210])[..., None, None] * sc
        return (ql | qh << 4).reshape(n, -1, 32) - 32, s.reshape(n, -1, 2), m
    at = 48 if f.name == "q5_k" else 16
    q = b[..., at:at + 128].reshape(n, nb, 4, 1, 32) >> torch.tensor([0, 4])[:, None] & 15  # [.., 4, 2, 32]
    q = q.reshape(n, nb, 8, 32)
    if f.name == "q5_k":
        q = q | (b[..., 16:48, None] >> j & 1).transpose(-1, -2) << 4
    d, dmin, scale, mn = kquant_ints(blocks)
    s = d.repeat_interleave(8, -1)[..., None] * scale.float()
    m = -(dmin.repeat_interleave(8, -1) * mn.float())
    return q.reshape(n, -1, 32), s, m


def kquant_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A K-quant's super-block scales d and dmin ``[N, K / 256]`` (float32; q6_k's dmin 0) and its integer scales
    ``[N, K / 32, 2]`` (weights 0..15 and 16..31) and mins ``[N, K / 32]``, as GGML's code reads them."""
    n, nb, _ = blocks.shape
    b = blocks.long()
    if blocks.shape[-1] == FORMATS["q6_k"].block_bytes:
        sc = blocks[..., 192:208].contiguous().view(torch.int8).long().reshape(n, nb * 8, 2)
        return half(blocks[..., 208:210]), torch.zeros(n, nb), sc, torch.zeros(n, nb * 8, dtype=torch.long)
    j = torch.arange(8)
    sc = b[..., 4:16]  # get_scale_min_k4
    lo, hi = j.clamp(max=3), j.clamp(min=4)
    scale = torch.where(j < 4, sc[..., lo] & 63, (sc[..., hi + 4] & 15) | (sc[..., hi - 4] >> 6) << 4)
    mn = torch.where(j < 4, sc[..., lo + 4] & 63, (sc[..., hi + 4] >> 4) | (sc[..., hi] >> 6) << 4)
    scale = scale.reshape(n, -1)
    return half(blocks[..., 0:2]), half(blocks[..., 2:4]), torch.stack([scale, scale], -1), mn.reshape(n, -1)


def int8_linear(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.h's arithmetic restated in torch from the file's blocks: x quantized per row and span (32, a
    K-quant's 256), integer dot products (exact in float64), then per chunk acc = fma(s, dx * isum, acc) (the
    product exact in float64, one rounding to float32) and with a min acc = fma(m, dx * sum, acc); for a
    K-quant per chunk f = fma(sc, isum, f) (q6_k: its two halves in turn) and per super-block
    acc = fma(d, D * f, acc), with a min acc = fma(-dmin, D * sum(mn * s), acc)."""
    f = {b.block_bytes: b for b in FORMATS.values()}[blocks.shape[-1]]
    m, k = x.shape
    super_ = f.weights == 256
    xs = x.view(m, k // f.weights if super_ else k // QBLOCK, -1)
    d = (xs.abs().amax(-1) / 127).repeat_interleave(xs.shape[-1] // QBLOCK, -1)  # [m, K / 32]: each block's span's
    xb = x.view(m, k // QBLOCK, QBLOCK)
    q = torch.round(xb * torch.where(d != 0, 1 / d, torch.zeros_like(d))[..., None])
    sd = d * q.sum(-1)
    wq, ws, wm = chunks(blocks)
    fma = lambda a, b, c: (a.double() * b.double() + c.double()).float()  # noqa: E731
    acc = torch.zeros(m, blocks.shape[0], dtype=torch.float32)
    halves = [slice(0, 16), slice(16, 32)] if f.name == "q6_k" else [slice(0, 32)]
    if super_:
        wd, wdmin, sc, mn = kquant_ints(blocks)
        fs = torch.zeros_like(acc)
        for b in range(k // QBLOCK):
            for h, part in enumerate(halves):
                isum = (q[:, b, part].double() @ wq[:, b, part].double().t()).float()
                fs = fma(sc[None, :, b, h].float(), isum, fs)
            if b % 8 == 7:
                s = b // 8
                acc = fma(wd[None, :, s], d[:, b, None] * fs, acc)
                if f.has_min:
                    mins = (q[:, b - 7:b + 1].sum(-1).double() @ mn[:, b - 7:b + 1].double().t()).float()
                    acc = fma(-wdmin[None, :, s], d[:, b, None] * mins, acc)
                fs = torch.zeros_like(acc)
        return acc if bias is None else acc + bias
    for b in range(k // QBLOCK):
        for h, part in enumerate(halves):
            t = d[:, b, None] * (q[:, b, part].double() @ wq[:, b, part].double().t()).float()
            acc = fma(ws[None, :, b, h], t, acc)
        if f.has_min:
            acc = fma(wm[None, :, b], sd[:, b, None], acc)
    return acc if bias is None else acc + bias


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
@pytest.mark.parametrize("k,n", [(64, 48), (576, 96), (1536, 32)])
def test_each_integer_path_gives_the_bits_of_the_reference(fmt, k, n, isa):
    """In both tile shapes (wide, and one packed group wide as weights beyond ``stream_bytes`` take)."""
    x, blocks, b = case(fmt, 70, k, n)  # 70 rows: every tile height, leftover rows, a second row chunk
    x[3] = 0  # an all-zero row (its scale 0)
    packed = pack(blocks)
    for bias in (None, b):
        ref = torch.ops.peagle.qlinear_ref(x, blocks, bias)
        for limits in STREAMS:
            with kernels.streaming(*limits):
                assert torch.equal(torch.ops.peagle.linear(x, packed, bias, isa), ref), (isa, fmt, k, n, limits)
    exact = x.double() @ dequantize(blocks).double().t() + b.double()
    assert (ref.double() - exact).abs().max() < 0.02 * exact.abs().max()  # 8-bit activations


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_columns_split_between_two_threads_give_the_references_bits(fmt, isa):
    """The suite runs one torch thread; with two, each thread takes a range of column groups (odd counts here,
    so ranges end inside a tile's width): every row of every pass height still gives the reference's bits (40
    rows: a prefill's pass, whose bit-plane formats each thread splits once into its own buffer)."""
    from conftest import torch_threads

    with torch_threads(2):
        for n in (80, 112):
            x, blocks, b = case(fmt, 40, 576, n, seed=3)
            packed = pack(blocks)
            for m, limits in itertools.product((1, 2, 4, 8, 9, 40), STREAMS):
                ref = torch.ops.peagle.qlinear_ref(x[:m], blocks, b)
                with kernels.streaming(*limits):
                    assert torch.equal(torch.ops.peagle.linear(x[:m], packed, b, isa), ref), (isa, fmt, n, m, limits)


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_the_largest_quants_times_the_largest_activations_give_the_references_bits(fmt, isa):
    """Every quant byte of the file at its largest (0xFF; q8_0's 127) and every activation at +-127 (constant rows
    of either sign): each product sum reaches its bound, which the paths that add products in int16 before
    widening them (AVX2's maddubs results: vnni_tiles.h's STEPS, avx2.cpp's q4) must not wrap. Every pass
    height, in both tile shapes."""
    f = FORMATS[fmt]
    blocks = random_blocks(fmt, 48, 512, seed=4)
    at = f.block_bytes - 2 if fmt == "q6_k" else 0
    scale = blocks.reshape(48, -1, f.block_bytes)[..., at:at + f.scale_bytes].copy()
    quants = blocks.reshape(48, -1, f.block_bytes)
    quants[:] = 0x7F if fmt == "q8_0" else 0xFF
    quants[..., at:at + f.scale_bytes] = scale
    blocks = blocks_of(blocks, fmt)
    x = torch.ones(40, 512)
    x[1::2] = -3.0
    packed = pack(blocks)
    for limits in STREAMS:
        with kernels.streaming(*limits):
            for m in (1, 2, 3, 4, 8, 40):
                ref = torch.ops.peagle.qlinear_ref(x[:m], blocks, None)
                assert torch.equal(torch.ops.peagle.linear(x[:m], packed, None, isa), ref), (isa, fmt, m, limits)


@native
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_the_reference_is_the_stated_arithmetic(fmt):
    x, blocks, b = case(fmt, 9, 768, 40, seed=2)  # three super-blocks
    assert torch.equal(torch.ops.peagle.qlinear_ref(x, blocks, b), int8_linear(x, blocks, b))


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_a_rows_result_does_not_depend_on_the_pass(fmt, isa):
    """Every pass height, in both tile shapes (STREAMS), gives each row its bits alone."""
    x, blocks, b = case(fmt, 40, 576, 96, seed=1)
    packed = pack(blocks)
    alone = torch.cat([torch.ops.peagle.linear(x[i:i + 1], packed, b, isa) for i in range(len(x))])
    for limits in STREAMS:
        with kernels.streaming(*limits):
            for m in range(1, len(x) + 1):
                assert torch.equal(torch.ops.peagle.linear(x[:m], packed, b, isa), alone[:m]), (isa, fmt, m, limits)
            assert torch.equal(torch.ops.peagle.linear(x[3:11], packed, b, isa), alone[3:11])


@native
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_packed_blocks_hold_the_files_values(fmt):
    """Packing keeps every weight's value (gguf's, bit for bit): looked up, de-quantized whole, concatenated."""
    blocks = blocks_of(random_blocks(fmt, 48, 512, seed=5), fmt)
    packed = pack(blocks)
    assert packed.shape == (3, *blocks.shape[1:2], FORMATS[fmt].packed_bytes)
    w, p = QuantTensor(blocks, torch.float32), QuantTensor(packed, torch.float32)
    assert p.packed and p.shape == w.shape and p.format == fmt
    assert torch.equal(p.dequantize(), w.dequantize())
    ids = torch.tensor([[47, 0], [16, 5]])
    assert torch.equal(torch.nn.functional.embedding(ids, p), w.dequantize()[ids])
    both = torch.cat([p, p.detach()])
    assert both.packed and torch.equal(both.dequantize(), torch.cat([w.dequantize()] * 2))
    assert not packable(blocks[:40])


@pytest.mark.parametrize("cap", isa_caps())
@pytest.mark.parametrize("fmts", [("q4_k", "q4_k", "q6_k"), ("q5_0", "q8_0"), ("q4_k", "q5_k", "q6_k")])
def test_a_fused_weight_in_parts_gives_each_parts_bits(fmts, cap):
    """Q4_K_M's fused q/k/v (Q6_K attn_v beside Q4_K q and k) kept in parts of their own formats
    (``peagle::linear_parts``): every column the bits of its part's own linear, packed or as the file's blocks, its
    bias slice with it, into a caller's buffer too; the Python :class:`QuantParts` as the same. A part written
    into another's columns, a bias slice taken at the wrong offset, or a part's rows read with another's stride
    changes some column."""
    from peagle.models.layers import linear
    from peagle.models.quant import QuantParts

    rows = [48, 16, 32][:len(fmts)]
    blocks = [blocks_of(random_blocks(f, n, 512, seed=i), f) for i, (f, n) in enumerate(zip(fmts, rows))]
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7))
    bias = torch.randn(sum(rows), generator=torch.Generator().manual_seed(8))
    for parts in (blocks, [pack(b) for b in blocks]):
        for m in (1, 5):
            with kernels.use_isa(cap):
                got = torch.ops.peagle.linear_parts(x[:m], parts, bias)
                want = torch.cat([torch.ops.peagle.linear(x[:m], p, b) for p, b in
                                  zip(parts, bias.split(rows))], dim=-1)
                assert torch.equal(got, want), (fmts, m, parts[0].shape)
                fused = QuantParts([QuantTensor(p, torch.float32) for p in parts], torch.float32)
                with torch.no_grad():  # the kernels run inference (no backward)
                    assert fused.shape == (sum(rows), 512) and torch.equal(linear(x[:m], fused, bias), want)
    plain = torch.cat([QuantTensor(b, torch.float32).dequantize() for b in blocks])
    assert torch.equal(QuantParts([QuantTensor(b, torch.float32) for b in blocks], torch.float32).dequantize(), plain)
    with pytest.raises(RuntimeError, match="input features"):
        torch.ops.peagle.linear_parts(x, [blocks[0], blocks_of(random_blocks(fmts[-1], 16, 256, seed=9), fmts[-1])])


def quantized_copy(hf, fmts=("q4_1", "q4_0", "q8_0")):
    """A native model of ``hf`` whose linear weights gguf quantized (the formats in turn, so a tiny model
    holds each), packed for the integer path."""
    model = native_from_hf(hf)
    for i, m in enumerate(mm for mm in model.modules() if isinstance(mm, Linear)):
        fmt = fmts[i % len(fmts)]
        data = gguf.quants.quantize(m.weight.detach().float().numpy(), getattr(gguf.GGMLQuantizationType, fmt.upper()))
        m.weight = torch.nn.Parameter(QuantTensor(blocks_of(np.asarray(data), fmt), torch.float32), requires_grad=False)
    pack_model(model)
    assert all(m.weight.packed for m in model.modules() if isinstance(m, Linear))
    return model


@pytest.fixture(scope="module")
def qllama():
    return quantized_copy(tiny_hf("llama"))


@native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_native_stack_on_the_integer_path_gives_the_layer_by_layer_bits(qllama, threads, monkeypatch):
    """``peagle::decoder_layers`` on packed blocks against the layers' own forwards, one thread and two: in a team
    of two a pass of up to 8 rows quantizes x in each thread inside the columns' range (ops.cpp, OWN_QUANT_ROWS),
    each linear called alone quantizes it once, shared; the same logits and KV bit for bit over a 20-row prompt,
    one-row steps and an 8-row verification pass of two sequences."""
    from conftest import torch_threads
    from test_kernels import assert_stack_gives_layer_by_layer_bits

    from peagle.models.attention import AttnMeta, Span

    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, qllama.cfg.vocab_size, (40,), generator=gen) for _ in range(2))
    passes = [([Span(20, 20, list(range(64)), 0)], [a[:20]], [torch.arange(20)]),
              ([Span(12, 12, list(range(64, 128)), 0)], [b[:12]], [torch.arange(12)])]
    passes += [([Span(1, p + 1, list(range(64)), p)], [a[p:p + 1]], [torch.tensor([p])]) for p in range(20, 22)]
    passes += [([Span(5, 27, list(range(64)), 22), Span(3, 15, list(range(64, 128)), 12)],
                [a[22:27], b[12:15]], [torch.arange(22, 27), torch.arange(12, 15)])]
    with torch_threads(threads):
        assert_stack_gives_layer_by_layer_bits(
            monkeypatch, qllama, passes, lambda p, caches: qllama(torch.cat(p[1]), torch.cat(p[2]), caches,
                                                                  AttnMeta(p[0], 1)))


@native
@pytest.mark.parametrize("isa", isa_caps())
@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_speculation_on_the_integer_path_is_plain_decoding(qllama, isa, method):
    """Greedy and seeded, one sequence and four together with prompts prefilled in chunks of 7, chains
    and (P-EAGLE) a token tree: every output equals plain decoding's on the same path, and the oracle
    head's drafts are accepted (a verifier that rejected them all would fail here)."""
    with kernels.use_isa(isa):
        assert kernels.int_isa() == INT_ISAS[isa]
        assert_lossless_on_path(qllama, method)


@native
@pytest.mark.skipif("avx512vnni" not in int_isas() or kernels.bf16_isa() == "none",
                    reason="the AMX models need AVX512-VNNI and AVX512_BF16")
def test_the_amx_probe_checks_the_kernels_against_the_references_and_times_both_paths(monkeypatch):
    """The set-up's probe (run here on the tiles' model): correct kernels are found exact and timed beside the
    AVX-512 paths; one that gives other bits is found inexact, naming the case; each path on its own."""
    r = amx_probe.probe_child(AMX_MODEL, calls=5)
    assert set(r) == {"int8", "bf16"}
    assert all(v["exact"] and v["amx_ms"] > 0 and v["base_ms"] > 0 for v in r.values())
    real = torch.ops.peagle.linear
    off = {"q8_0": lambda w: w.shape[-1] != 64, "bf16": lambda w: w.shape[-1] == 64}  # which weights to spoil
    for path, (spoiled, name) in {"int8": ("q8_0", "q8_0 at 2 rows"), "bf16": ("bf16", "bf16 576 wide at 2 rows")}.items():
        monkeypatch.setattr(torch.ops.peagle, "linear", lambda x, w, b=None, isa="", f=off[spoiled]:
                            real(x, w, b, isa) + (isa == AMX_MODEL and f(w)))
        r = amx_probe.probe_child(AMX_MODEL, calls=5)
        assert r[path] == {"exact": False, "error": f"{name} differs from the reference"}, path
        assert r[{"int8": "bf16", "bf16": "int8"}[path]]["exact"]


GOOD = {"exact": True, "amx_ms": 1.0, "base_ms": 2.0}


@pytest.mark.parametrize("verdict,used", [
    ({"int8": GOOD, "bf16": GOOD}, (True, True)),
    ({"int8": {**GOOD, "amx_ms": 3.0}, "bf16": GOOD}, (False, True)),   # slower: AVX512-VNNI stays
    ({"int8": GOOD, "bf16": {"exact": False, "error": "bf16 576 wide at 8 rows differs from the reference"}}, (True, False)),
    ({"int8": GOOD}, (True, False)),                                      # a CPU with no AMX-BF16: not probed
    ({"exact": True, "amx_ms": 1.0, "vnni_ms": 2.0}, (False, False)),   # an older probe's verdict
    (None, (False, False)),                                              # never probed
    ("{not json", (False, False))])
def test_amx_tiles_are_used_only_where_the_probe_found_them_exact_and_faster(verdict, used, tmp_path, monkeypatch, capsys):
    f = tmp_path / "amx.json"
    if verdict is not None:
        f.write_text(verdict if isinstance(verdict, str) else json.dumps(verdict))
    monkeypatch.setattr(kernels, "AMX_PROBE", f)
    assert kernels._amx_verdict() == used
    err = capsys.readouterr().err
    assert ("AMX-INT8 tiles not used" in err) is not used[0] and ("AMX-BF16 tiles not used" in err) is not used[1]


@native
def test_the_probe_runs_only_where_the_os_grants_amx_tiles():
    if "amx" in int_isas():
        r = amx_probe.probe_amx()
        assert r["int8"]["exact"] and ("bf16" in r) == ("amx" in torch.ops.peagle.bf16_isas())
    else:
        assert amx_probe.probe_amx() is None and not kernels.AMX_PROBE.exists()


@native
def test_the_tiles_shape_is_timed_once_on_the_models_weights_and_kept(qllama, monkeypatch):
    """tune_streaming picks the default, one-group or wide tiles for one-row and taller passes by timing them on
    the weights given, sets them, and does not time again in the process (the shape changes no bits: above);
    streaming() restores whatever was set before it (an earlier engine in the process may have tuned them)."""
    weights = [m.weight for m in qllama.modules() if isinstance(m, Linear)]
    monkeypatch.setattr(kernels, "_tuned", False)
    with kernels.streaming(1 << 20, 2 << 20):
        with kernels.streaming(*STREAMS[0]):
            chosen = kernels.tune_streaming(weights, rounds=2)
            assert chosen[0] in (0, 16 << 20, kernels.WIDE) and chosen[1] in (0, 16 << 20, kernels.WIDE)
            assert tuple(torch.ops.peagle.stream_bytes()) == chosen
            monkeypatch.setattr(kernels.time, "perf_counter", lambda: pytest.fail("timed twice"))
            assert kernels.tune_streaming(weights) == chosen
        assert tuple(torch.ops.peagle.stream_bytes()) == (1 << 20, 2 << 20)


@native
def test_the_tiles_settings_have_one_name_each():
    """``kernels.tiles`` (the benchmarks' names for tune_streaming's settings) sets narrow and wide for passes of
    every height, leaves the default as it was, restores it after, and refuses an unknown name."""
    with kernels.streaming(1 << 20, 2 << 20):
        for name, limits in (("narrow", (0, 0)), ("wide", (kernels.WIDE,) * 2), ("default", (1 << 20, 2 << 20))):
            with kernels.tiles(name):
                assert tuple(torch.ops.peagle.stream_bytes()) == limits, name
            assert tuple(torch.ops.peagle.stream_bytes()) == (1 << 20, 2 << 20)
        with pytest.raises(ValueError, match="narrow"):
            with kernels.tiles("one group wide"):
                pass


@native
def test_the_tiles_verdict_is_remembered_for_the_same_machine_and_shapes(qllama, monkeypatch, tmp_path):
    """With ``remember``, a verdict is written once and the next start (a new process: ``_tuned`` reset) takes it
    without timing; a torn file, or another thread count, is timed again. Taking a verdict for other shapes, or
    keeping none, fails it."""
    weights = [m.weight for m in qllama.modules() if isinstance(m, Linear)]
    memo = tmp_path / "streaming.json"
    with kernels.streaming(*STREAMS[0]):
        monkeypatch.setattr(kernels, "_tuned", False)
        chosen = kernels.tune_streaming(weights, rounds=2, remember=memo)
        assert list(json.loads(memo.read_text()).values()) == [list(chosen)]
        with monkeypatch.context() as m:
            m.setattr(kernels, "_tuned", False)
            m.setattr(kernels.time, "perf_counter", lambda: pytest.fail("timed though remembered"))
            torch.ops.peagle.set_stream_bytes(*STREAMS[0])
            assert kernels.tune_streaming(weights, remember=memo) == chosen
            assert tuple(torch.ops.peagle.stream_bytes()) == chosen
        timed = []
        for spoil in (lambda: memo.write_text("{torn"), lambda: torch.set_num_threads(torch.get_num_threads() + 1)):
            spoil()
            monkeypatch.setattr(kernels, "_tuned", False)
            with monkeypatch.context() as m:
                m.setattr(kernels.time, "perf_counter", lambda: timed.append(1) or 0.0)
                kernels.tune_streaming(weights, rounds=2, remember=memo)
        torch.set_num_threads(torch.get_num_threads() - 1)
        assert len(timed) > 0 and len(json.loads(memo.read_text())) == 2


@native
@pytest.mark.parametrize("wide,chosen", [(0.98, kernels.WIDE), (0.995, 16 << 20)])
def test_the_tiles_verdict_takes_a_setting_2_percent_faster(qllama, monkeypatch, wide, chosen):
    """tune_streaming takes a setting that sweeps TUNE_EDGE (1%) faster than the default: a rule that asked 3%
    kept the default on a Sapphire Rapids where wide swept 3-5% faster. Under the edge it keeps the default. A
    clock where each sweep costs its setting's seconds."""
    weights = [m.weight for m in qllama.modules() if isinstance(m, Linear)]
    cost = {16 << 20: 1.0, kernels.NARROW: 1.5, kernels.WIDE: wide}
    now = [0.0]

    def clock() -> float:
        now[0] += cost[torch.ops.peagle.stream_bytes()[0]] / 2  # two readings a timed sample
        return now[0]

    with kernels.streaming(16 << 20, 16 << 20):
        monkeypatch.setattr(kernels, "_tuned", False)
        monkeypatch.setattr(kernels.time, "perf_counter", clock)
        assert kernels.tune_streaming(weights) == (chosen, chosen)


@native
def test_the_fast_paths_keep_a_half_kv_cache_and_exact_keeps_float32(qllama):
    """``kv_cache_dtype`` ``auto``: float16 pools (the target's and the head's) on the integer path, float32 where
    the matmuls run float32 arithmetic (``--compute exact``, plain float32 weights); an explicit dtype wins; a
    dtype the engine does not know is refused before anything is allocated."""
    from peagle.engine.llm_engine import EngineConfig
    from speculation import make_engine

    engine = make_engine(qllama, init_drafter(qllama, 1, MASK, seed=4), "parallel", 3)
    assert engine.runner.kv_dtype == torch.float16
    assert {c.k.dtype for c in engine.runner.target_caches + engine.runner.drafter_caches} == {torch.float16}
    assert make_engine(qllama, None, "none", kv_cache_dtype="float32").runner.target_caches[0].k.dtype == torch.float32
    assert make_engine(native_from_hf(tiny_hf("llama")), None, "none").runner.kv_dtype == torch.float32
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8")


@native
@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_speculation_over_a_half_kv_cache_is_plain_decoding(method):
    """float16 pools under float32 matmuls (the kernel's attention reads them converted, prompt chunks of 7 and
    token trees included): speculation is still plain decoding over the same cache, drafts accepted."""
    assert_lossless_on_path(native_from_hf(tiny_hf("llama")), method, kv_cache_dtype="float16")


@native
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_rows_are_looked_up_as_gguf_dequantizes_them(fmt):
    """The native lookup (an embedding a step) from the file's blocks and from packed ones: the bits of
    the torch de-quantization that test_quant ties to gguf's."""
    blocks = blocks_of(random_blocks(fmt, 64, 512, seed=3), fmt)
    ids = torch.tensor([5, 0, 63, 17, 5])
    want = dequantize(blocks)[ids]
    for w in (blocks, pack(blocks)):
        assert torch.equal(torch.ops.peagle.dequantize_rows(w, ids), want)
    with pytest.raises(RuntimeError, match="out of 64"):
        torch.ops.peagle.dequantize_rows(blocks, torch.tensor([64]))


@each_isa()
def test_greedy_is_torchs_argmax_and_finiteness_in_one_pass(isa):
    from peagle.engine.sampling import greedy

    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 4099, generator=g)  # a tail past every vector width
    x[3, 100] = x[3].max()                  # a tie: the first index wins
    x[4, 4098] = x[4].max() + 1             # the max in the tail
    x[5, 7], x[6, 4000], x[7, 0], x[8] = float("nan"), float("inf"), float("-inf"), float("nan")
    with kernels.use_isa(isa), torch.inference_mode():
        tokens, finite = greedy(x)
    assert torch.equal(tokens[:5], x[:5].argmax(-1))
    assert finite.tolist() == [True] * 5 + [False] * 4
    assert 0 <= int(tokens.min()) and int(tokens.max()) < x.shape[1]  # a NaN row's token is a valid id


@native
def test_a_head_is_quantized_to_q4_1_only_where_its_reads_are_a_share_of_a_step(qllama, monkeypatch):
    """Q4_1 where the head in Q8_0 would be over 5% of a target step's bytes (the default model's head), else
    Q8_0 (a target whose LM head dwarfs it, as Gemma 3's 262k-row one)."""
    from peagle.models.loader import head_format

    head = init_drafter(qllama, 1, MASK)
    assert head_format(qllama, head) == "q4_1"
    weights = sum(m.weight.numel() for m in head.modules() if isinstance(m, Linear))
    big = torch.empty(30 * weights, dtype=torch.uint8)   # an LM head of 30 bytes a head weight: 3.5% in Q8_0
    monkeypatch.setattr(type(qllama), "head_weight", lambda self: big)
    assert head_format(qllama, head) == "q8_0"


@native
def test_a_head_beside_a_target_on_the_integer_path_is_quantized(qllama, tmp_path):
    from peagle.models.drafter import save_drafter
    from peagle.models.loader import head_format, load_drafter_for

    save_drafter(init_drafter(qllama, 1, MASK, seed=3), tmp_path / "head")
    head = load_drafter_for(qllama, tmp_path, tmp_path / "head")
    assert all(isinstance(m.weight, QuantTensor) and m.weight.packed and m.weight.format == head_format(qllama, head)
               for m in head.modules() if isinstance(m, Linear))
    # `peagle export` loads it as stored (pack=False) and writes it back, compact too: the same weights
    plain = load_drafter_for(qllama, tmp_path, tmp_path / "head", pack=False)
    assert not any(isinstance(m.weight, QuantTensor) for m in plain.modules() if isinstance(m, Linear))
    save_drafter(plain, tmp_path / "out", base_embedding=qllama.model.embed_tokens.weight)
    again = load_drafter_for(qllama, tmp_path, tmp_path / "out", pack=False)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), again.state_dict().values()))
