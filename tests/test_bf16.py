"""The bf16 dot-product path (``--compute fast`` on bfloat16 weights, peagle/kernels/csrc/kernels.h): each row
of x rounded to bf16 once, then vdpbf16ps steps over packed weights. The AVX512_BF16 path gives the bits of
the scalar reference on the plain matrix, which gives the bits of a torch re-statement of the arithmetic that
shares no code with either; a row's result does not depend on the pass; packing is a permutation of the
matrix's bytes; and speculation on a packed bf16 model equals plain decoding token for token, with drafts
accepted. Where the operators have no bf16 path nothing is packed (tested by capping the kernels to scalar).
The kernel tests run on every bf16 path: AVX512_BF16, AMX-BF16 tiles where the CPU has them, the AMX kernel
over amx.cpp's C++ model of the tile instructions (on any AVX512_BF16 CPU), and AVX2's FMAs (any AVX2 CPU).

Planted faults these tests caught when written: the kernel's multi-row tiles reading row 0's x for every row
(the reference's bits lost from 2 rows on) and the reference adding a pair's even element first (the torch
re-statement's bits lost)."""
from __future__ import annotations

import itertools
import os

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, assert_lossless_on_path
from test_int8 import STREAMS

from peagle import kernels
from peagle.models.layers import Linear, pack_model, set_precision
from peagle.models.loader import init_drafter, load_drafter_for, load_target
from peagle.models.quant import (DEQUANT_ROWS, GROUP, QuantTensor, bf16_dots, bf16_packable, bf16_rows, formats, pack_bf16,
                                 pack_bf16_rows, quantized)

native = pytest.mark.skipif(os.environ.get("PEAGLE_NATIVE") == "0" or not kernels.available(),
                            reason="the native kernels are off")
has_bf16 = pytest.mark.skipif(kernels.bf16_isa() == "none",
                              reason="the native kernels are off" if not kernels.available() else
                              "this CPU has no AVX512_BF16 (vdpbf16ps)")
TINY = torch.finfo(torch.float32).tiny
AMX_MODEL = "amx-model"  # amx.cpp's bf16 kernel over its model of the tiles


def each_bf16_isa():
    """Every bf16 path (and the AMX kernel over its model of the tiles), one test case each, skipped with the
    reason where this CPU lacks it."""
    have = list(torch.ops.peagle.bf16_isas()) if os.environ.get("PEAGLE_NATIVE") != "0" and kernels.available() else []
    probe = kernels.amx_probe("bf16") if "amx" in have else {}
    if "amx" in have and not probe.get("exact", True):  # the hardware's tiles differ from the reference: never used
        have.remove("amx")
    why = {"amx": f"the set-up's probe found this CPU's AMX-BF16 tiles inexact ({probe.get('error')}): never used here"
           if probe and not probe.get("exact", True) else "this CPU has no amx bf16 path"}
    return pytest.mark.parametrize("isa", [
        pytest.param(isa, marks=pytest.mark.skipif(
            (isa if isa != AMX_MODEL else "avx512bf16") not in have, reason=why.get(isa, f"this CPU has no {isa} bf16 path")))
        for isa in ("avx512bf16", "amx", AMX_MODEL, "avx2")])


def bf16_runs_on(cap: str, path: str) -> bool:
    """Whether the operators capped at ``cap`` run bf16 path ``path`` here (AMX-BF16 tiles only where the CPU has
    them and the set-up's probe found them exact and faster)."""
    try:
        with kernels.use_isa(cap):
            return kernels.bf16_isa() == path
    except RuntimeError:  # this CPU has no such instruction set
        return False


def each_bf16_cap():
    """The operators' ISA caps that run a bf16 path, each a pytest param (the cap, its path), skipped with the
    reason where this CPU does not run it."""
    have = kernels.available() and os.environ.get("PEAGLE_NATIVE") != "0"
    return pytest.mark.parametrize("cap,path", [
        pytest.param(cap, path, marks=pytest.mark.skipif(not (have and bf16_runs_on(cap, path)),
                                                         reason=f"the operators do not run {path} here"))
        for cap, path in (("amx", "amx"), ("avx512", "avx512bf16"), ("avx2", "avx2"))])


def heights(isa: str, m: int) -> list[int]:
    """Pass heights up to ``m`` to check: all of them, or on the tiles' (slow) model the tiles' edges."""
    return list(range(1, m + 1)) if isa != AMX_MODEL else [h for h in (1, 2, 3, 8, 15, 16, 17, 33, m) if h <= m]


def flush(v: torch.Tensor) -> torch.Tensor:
    """Denormals to a zero of their sign."""
    return torch.where(v.abs() < TINY, torch.copysign(torch.zeros_like(v), v), v)


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """vcvtneps2bf16 in torch: torch's rounding (nearest, ties to even), a denormal to a signed zero, a NaN
    quieted with its sign and top payload kept."""
    quiet = ((x.view(torch.int32) >> 16) | 0x40).to(torch.int16).view(torch.bfloat16)
    return torch.where(x.isnan(), quiet, flush(x).to(torch.bfloat16))


def bf16_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.h's arithmetic restated in torch from the plain bf16 matrix: per pair (k, k+1), the odd
    element's product added first, each step one rounding (the product exact in float64, the sum rounded
    once to float32: a float64 rounding first can land on no float32 midpoint here), denormal inputs and
    results flushed."""
    xs = flush(to_bf16(x).float()).double()
    ws = flush(w.float()).double()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for k in range(0, x.shape[1], 2):
        for j in (k + 1, k):
            acc = flush((xs[:, j, None] * ws[None, :, j] + acc.double()).float())
    return acc if bias is None else acc + bias


def case(m: int, k: int, n: int, seed: int = 0):
    """x [m, k], a bf16 weight [n, k] of a layer's scale (denormals among both) and a bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    x.view(-1)[::37] = 1e-39
    w.view(-1)[::41] = -3e-39
    return x, w.bfloat16(), torch.randn(n, generator=g)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@native
@each_bf16_isa()
def test_columns_split_between_two_threads_give_the_references_bits(isa):
    """The suite runs one torch thread; with two, each takes a range of column groups (odd counts here)."""
    from conftest import torch_threads

    with torch_threads(2):
        for n in (80, 112):
            x, w, b = case(9, 576, n, seed=3)
            packed = pack_bf16(w)
            for m, limits in itertools.product((1, 2, 4, 8, 9), STREAMS):
                ref = torch.ops.peagle.bf16linear_ref(x[:m], w, b)
                with kernels.streaming(*limits):
                    assert torch.equal(torch.ops.peagle.linear(x[:m], packed, b, isa), ref), (n, m, limits)


@native
@each_bf16_isa()
@pytest.mark.parametrize("k,n", [(2, 16), (64, 48), (200, 64), (576, 96), (1536, 32)])
def test_the_bf16_path_gives_the_bits_of_the_reference(k, n, isa):
    """In both tile shapes (wide, and one packed group wide as weights beyond ``stream_bytes`` take); on the
    AMX tiles, widths of whole tiles (16 pairs) and not (1, 100 pairs) and groups of 1 to 3 a step."""
    x, w, b = case(70, k, n)  # 70 rows: every tile height, leftover rows, a second row chunk
    x[3] = 0  # an all-zero row
    packed = pack_bf16(w)
    for bias, limits in itertools.product((None, b), STREAMS):
        ref = torch.ops.peagle.bf16linear_ref(x, w, bias)
        with kernels.streaming(*limits):
            for m in heights(isa, 70):  # each pass height: its tiles
                assert torch.equal(torch.ops.peagle.linear(x[:m], packed, bias, isa), ref[:m]), (k, n, m, limits)
    exact = x.double() @ w.double().t() + b.double()
    assert (ref.double() - exact).abs().max() < 0.01 * exact.abs().max()  # x rounded to 8 bits of mantissa


@native
@each_bf16_isa()
def test_special_values_take_the_references_bits(isa):
    """Denormal, infinite and NaN activations and weights: the same bits, NaN payloads included."""
    x, w, _ = case(9, 64, 32, seed=4)
    x[0, ::3], x[1, 5], x[2, 7], x[3, 1], x[4], x[5, ::2] = 1e-39, float("nan"), float("inf"), -float("inf"), 3e38, -1e-45
    w = w.float()
    w[0, ::2], w[1], w[2, 3] = 1e-39, -3e38, float("nan")
    w = w.bfloat16()
    ref = torch.ops.peagle.bf16linear_ref(x, w)
    assert ref.isnan().any() and ref.isinf().any()
    assert torch.equal(bits(torch.ops.peagle.linear(x, pack_bf16(w), None, isa)), bits(ref))


@native
@each_bf16_isa()
def test_a_sum_of_negative_zero_keeps_its_sign(isa):
    """A product that underflows is flushed to -0, so a column's sum can be -0; the AMX kernel pads a row to
    whole tiles of 16 pairs (here 15 pairs of padding, and 15 after 17) with pairs that must leave that sign."""
    for k in (2, 34):
        w, x = torch.zeros(16, k), torch.zeros(3, k)
        w[:, k - 2], x[:, k - 2] = -1e-10, 1e-30  # the last pair's, the sum +0 until then
        ref = torch.ops.peagle.bf16linear_ref(x, w.bfloat16())
        assert (bits(ref) == bits(torch.tensor(-0.0))).all()
        assert torch.equal(bits(torch.ops.peagle.linear(x, pack_bf16(w.bfloat16()), None, isa)), bits(ref)), k


@native
@pytest.mark.skipif(not kernels.available() or "avx2" not in torch.ops.peagle.bf16_isas(), reason="no AVX2 bf16 path")
def test_a_sum_that_rounds_up_to_the_smallest_normal_is_kept_on_avx2():
    """The stated arithmetic flushes a result that is denormal after rounding; MXCSR's FTZ, under which the AVX2
    path runs, flushes one that is tiny before rounding. Here a column's sum is 2^-126 - 2^-150, a tie that rounds
    to 2^-126: kept. The path sees the underflow flag and runs the call again with the flushes in code. (Where
    vdpbf16ps decides tininess is not measured: no AVX512_BF16 CPU was at hand when this was written.)"""
    w = torch.tensor([[2.0 ** -74, 2.0 ** -63, 0.0, 1.5 * 2.0 ** -74]] * 16).bfloat16()  # k = 1, 0, 3, 2 in turn:
    x = torch.tensor([[2.0 ** -75, 2.0 ** -63, 0.0, -(2.0 ** -75)]])                # 2^-126, + 2^-149, - 3 * 2^-150
    ref = torch.ops.peagle.bf16linear_ref(x, w)
    assert (ref == TINY).all() and torch.equal(bits(ref), bits(bf16_linear(x, w)))
    for m in (1, 2, 5):
        assert torch.equal(bits(torch.ops.peagle.linear(x.expand(m, 4), pack_bf16(w), None, "avx2")), bits(ref.expand(m, 16)))


@native
def test_the_reference_is_the_stated_arithmetic():
    x, w, b = case(9, 256, 40, seed=2)
    x[2] = 0
    assert torch.equal(bits(torch.ops.peagle.bf16linear_ref(x, w, b)), bits(bf16_linear(x, w, b)))
    # the conversion alone: y = x's bf16 value times 1 (ties to even, denormals flushed, NaNs quieted)
    vals = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -1e-39, 3.4e38, -2 ** -126, 1.5])
    vals = torch.cat([vals, torch.tensor([0x7FA0_1234, -0x0040_0001, 0x7F80_0001, 1], dtype=torch.int32).view(torch.float32)])
    x = torch.stack([vals, torch.zeros_like(vals)], 1)
    y = torch.ops.peagle.bf16linear_ref(x, torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16))
    assert torch.equal(bits(y), bits(bf16_linear(x, torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16))))
    assert y[:6, 0].tolist() == [1.0, 1 + 2 ** -6, 0.0, float("inf"), -2 ** -126, 1.5] and y[6:9].isnan().all()


@native
@each_bf16_isa()
def test_a_rows_result_does_not_depend_on_the_pass(isa):
    x, w, b = case(40, 576, 96, seed=1)
    packed = pack_bf16(w)
    alone = torch.cat([torch.ops.peagle.linear(x[i:i + 1], packed, b, isa) for i in range(len(x))])
    for m in heights(isa, len(x)):
        assert torch.equal(torch.ops.peagle.linear(x[:m], packed, b, isa), alone[:m]), m
    assert torch.equal(torch.ops.peagle.linear(x[3:11], packed, b, isa), alone[3:11])


def test_packing_is_a_permutation_of_the_matrix():
    _, w, _ = case(1, 96, 48, seed=5)
    packed = pack_bf16(w)
    assert packed.shape == (3, 48, 4 * GROUP) and packed.dtype == torch.uint8
    assert torch.equal(packed.view(-1).sort().values, w.contiguous().view(torch.uint8).view(-1).sort().values)
    assert torch.equal(packed[1, 7, 4 * 5:4 * 5 + 4].view(torch.bfloat16), w[GROUP + 5, 14:16])  # column 21, pair 7
    ids = torch.tensor([47, 0, 16, 5])
    assert torch.equal(bf16_rows(packed, ids), w[ids])
    p = QuantTensor(packed, torch.float32)  # a tied embedding: nominally float32, its values bf16 ones
    assert p.packed and p.format == "bf16" and p.shape == w.shape and not quantized(p)
    assert torch.equal(p.dequantize(), w.float())
    assert torch.equal(torch.nn.functional.embedding(ids.view(2, 2), p), w.float()[ids.view(2, 2)])
    assert torch.equal(p[torch.tensor([3, 40])], w.float()[[3, 40]])
    both = torch.cat([p, p.detach()])
    assert both.packed and torch.equal(both.dequantize(), torch.cat([w.float()] * 2))
    assert not bf16_packable(w[:40]) and not bf16_packable(w[:, :95]) and not bf16_packable(w.float())
    assert not bf16_packable(QuantTensor(packed, torch.bfloat16))  # packed once, or GGUF blocks nominally bf16


def test_a_float32_table_of_bf16_values_packs_a_slice_at_a_time_as_whole():
    """A tied embedding's float32 table (bf16 values) packed :data:`DEQUANT_ROWS` rows at a time: the bytes of
    packing its bf16 copy whole; None where one value is not a bfloat16 one."""
    w = torch.randn(2 * DEQUANT_ROWS + 3 * GROUP, 40, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    assert torch.equal(pack_bf16_rows(w), pack_bf16(w.bfloat16()))
    w[DEQUANT_ROWS + 5, 7] += 2 ** -20
    assert pack_bf16_rows(w) is None


@native
def test_rows_are_looked_up_natively():
    _, w, _ = case(1, 96, 64, seed=3)
    ids = torch.tensor([5, 0, 63, 17, 5])
    assert torch.equal(torch.ops.peagle.dequantize_rows(pack_bf16(w), ids), w[ids].float())


def bf16_copy(hf, packed: bool = True):
    """A native model of ``hf`` in bf16 weights, its embedding's values bf16 ones (so a tied one is packed
    with the layers), packed for the bf16 dot-product path."""
    model = native_from_hf(hf)
    emb = model.model.embed_tokens.weight
    emb.data = emb.data.bfloat16().float()
    set_precision(model, torch.bfloat16, torch.float32)
    if packed:
        pack_model(model, model.model.embed_tokens if model.lm_head is None else None)
    return model


@pytest.fixture(scope="module")
def bllama():
    return bf16_copy(tiny_hf("llama-bias-tied"))


def packed_head(head):
    """A head beside a packed bf16 target, as load_drafter_for leaves it."""
    set_precision(head, torch.bfloat16, torch.float32)
    pack_model(head)
    return head


@native
@has_bf16
def test_a_model_is_packed_whole(bllama):
    assert all(m.weight.format == "bf16" for m in bllama.modules() if isinstance(m, Linear))
    emb = bllama.model.embed_tokens.weight  # tied: the LM head's matrix, looked up as float32
    assert isinstance(emb, QuantTensor) and emb.format == "bf16" and emb.dtype == torch.float32
    assert bllama.head_weight() is emb and bf16_dots(bllama) and not formats(bllama)
    assert bllama.precision == "bfloat16 weights, bf16 dot products"
    plain = bf16_copy(tiny_hf("llama-bias-tied"), packed=False)
    assert plain.precision == "bfloat16 weights, float32 compute"
    with kernels.use_isa("scalar"):  # operators with no bf16 path: nothing changes
        pack_model(plain, plain.model.embed_tokens)
    assert not bf16_dots(plain)


@native
@each_bf16_cap()
@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_speculation_on_the_bf16_path_is_plain_decoding(bllama, method, cap, path):
    """Greedy and seeded, one sequence and four together with prompts prefilled in chunks of 7, chains
    and (P-EAGLE) a token tree: every output equals plain decoding's on each bf16 path (on AMX tiles the
    one-row passes run AVX512_BF16), and the oracle head's drafts are accepted (a verifier that rejected
    them all would fail here)."""
    with kernels.use_isa(cap):
        assert kernels.bf16_isa() == path
        assert_lossless_on_path(bllama, method, packed_head)


@native
@has_bf16
def test_loading_packs_bf16_weights_under_fast_only(tmp_path):
    """``load_target``: ``fast`` packs the layers and the tied embedding, ``exact`` keeps the plain matrices
    (float32 arithmetic, bit for bit today's), and a head loaded beside a packed target is packed too."""
    from peagle.models.drafter import save_drafter

    hf = tiny_hf("llama-bias-tied")
    hf.save_pretrained(tmp_path / "model")
    fast, path = load_target(tmp_path / "model", "bfloat16", device="cpu")
    exact, _ = load_target(tmp_path / "model", "bfloat16", device="cpu", compute="exact")
    assert fast.precision == "bfloat16 weights, bf16 dot products"
    assert exact.precision == "bfloat16 weights, float32 compute" and not bf16_dots(exact)
    assert fast.lm_head is None and isinstance(fast.model.embed_tokens.weight, QuantTensor)
    assert torch.equal(fast.model.embed_tokens.weight.dequantize(), exact.model.embed_tokens.weight)
    assert not any(isinstance(m.weight, QuantTensor) for m in exact.modules() if isinstance(m, Linear))
    save_drafter(init_drafter(fast, 1, MASK, seed=3), tmp_path / "head")
    head = load_drafter_for(fast, path, tmp_path / "head")
    assert all(m.weight.format == "bf16" for m in head.modules() if isinstance(m, Linear))
