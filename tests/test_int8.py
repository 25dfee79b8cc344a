"""The integer path (``--compute fast``, peagle/kernels/csrc/kernels.h): GGUF blocks times activations
quantized per row to 8 bits, through integer dot products. Every instruction set (AVX512-VNNI, AVX-VNNI,
AVX2) gives the bits of the scalar reference on the file's blocks, which gives the bits of a torch
re-statement of the arithmetic that shares no code with either; a row's result does not depend on the pass; packing is a
permutation of the file's bytes; and speculation on a quantized model equals plain decoding token for
token on every instruction set this CPU has, with drafts accepted."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, assert_lossless_on_path
from test_quant import case, random_blocks

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import init_drafter
from peagle.models.quant import (FORMATS, GROUP, QBLOCK, QuantTensor, blocks_of, column_blocks, dequantize, pack,
                                 pack_model, packable)

native = pytest.mark.skipif(os.environ.get("PEAGLE_NATIVE") == "0" or not kernels.available(),
                            reason="the native kernels are off")
INT_FORMATS = [n for n, f in FORMATS.items() if f.int_path]  # the formats with an integer path
INT_ISAS = {"avx512": "avx512vnni", "avxvnni": "avxvnni", "avx2": "avx2"}  # the ISA cap -> its integer path


def int_isas() -> list[str]:
    """The integer paths this CPU runs, widest first."""
    return list(torch.ops.peagle.int_isas()) if kernels.available() else []


def each_int_isa():
    """Every integer path, one test case each, skipped with the reason where this CPU lacks it."""
    have = int_isas() if os.environ.get("PEAGLE_NATIVE") != "0" else []
    return pytest.mark.parametrize("isa", [
        pytest.param(isa, marks=pytest.mark.skipif(isa not in have, reason=f"this CPU has no {isa} integer path"))
        for isa in INT_ISAS.values()])


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


def int8_linear(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.h's arithmetic restated in torch from the file's blocks: x quantized per row and block of
    32, integer dot products (exact in float64), then per block acc = fma(dw, dx * isum, acc) (the product
    exact in float64, one rounding to float32) and q4_1's acc = fma(mw, dx * s, acc)."""
    f = {b.block_bytes: b for b in FORMATS.values()}[blocks.shape[-1]]
    m, k = x.shape
    xb = x.view(m, k // QBLOCK, QBLOCK)
    d = xb.abs().amax(-1) / 127
    q = torch.round(xb * torch.where(d != 0, 1 / d, torch.zeros_like(d))[..., None])
    sd = d * q.sum(-1)
    dw = blocks[..., 0:2].contiguous().view(torch.float16).float()[..., 0]  # [N, nb]
    raw = blocks[..., f.scale_bytes:]
    wq = (torch.cat([raw & 15, raw >> 4], -1).double() - (0 if f.has_min else 8)) if f.nibbles else \
        raw.contiguous().view(torch.int8).double()
    acc = torch.zeros(m, blocks.shape[0], dtype=torch.float32)
    for b in range(k // QBLOCK):
        t = d[:, b, None] * (q[:, b].double() @ wq[:, b].t()).float()
        acc = (dw[None, :, b].double() * t.double() + acc.double()).float()
        if f.has_min:
            mw = blocks[:, b, 2:4].contiguous().view(torch.float16).float()[:, 0]
            acc = (mw[None].double() * sd[:, b, None].double() + acc.double()).float()
    return acc if bias is None else acc + bias


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
@pytest.mark.parametrize("k,n", [(64, 48), (576, 96), (1536, 32)])
def test_each_integer_path_gives_the_bits_of_the_reference(fmt, k, n, isa):
    x, blocks, b = case(fmt, 70, k, n)  # 70 rows: every tile height, leftover rows, a second row chunk
    x[3] = 0  # an all-zero row (its scale 0)
    packed = pack(blocks)
    for bias in (None, b):
        ref = torch.ops.peagle.qlinear_ref(x, blocks, bias)
        assert torch.equal(torch.ops.peagle.linear(x, packed, bias, isa), ref), (isa, fmt, k, n)
    exact = x.double() @ dequantize(blocks).double().t() + b.double()
    assert (ref.double() - exact).abs().max() < 0.02 * exact.abs().max()  # 8-bit activations


@native
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_the_reference_is_the_stated_arithmetic(fmt):
    x, blocks, b = case(fmt, 9, 256, 40, seed=2)
    assert torch.equal(torch.ops.peagle.qlinear_ref(x, blocks, b), int8_linear(x, blocks, b))


@each_int_isa()
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_a_rows_result_does_not_depend_on_the_pass(fmt, isa):
    x, blocks, b = case(fmt, 40, 576, 96, seed=1)
    packed = pack(blocks)
    alone = torch.cat([torch.ops.peagle.linear(x[i:i + 1], packed, b, isa) for i in range(len(x))])
    for m in range(1, len(x) + 1):
        assert torch.equal(torch.ops.peagle.linear(x[:m], packed, b, isa), alone[:m]), (isa, fmt, m)
    assert torch.equal(torch.ops.peagle.linear(x[3:11], packed, b, isa), alone[3:11])


@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_packing_is_a_permutation_of_the_files_blocks(fmt):
    blocks = blocks_of(random_blocks(fmt, 48, 96, seed=5), fmt)
    packed = pack(blocks)
    assert packed.shape == (3, 3, GROUP * FORMATS[fmt].block_bytes)
    cols = torch.arange(GROUP).repeat(3)
    assert torch.equal(column_blocks(packed.repeat_interleave(GROUP, 0), cols), blocks)
    w, p = QuantTensor(blocks, torch.float32), QuantTensor(packed, torch.float32)
    assert p.packed and p.shape == w.shape and p.format == fmt
    assert torch.equal(p.dequantize(), w.dequantize())
    ids = torch.tensor([[47, 0], [16, 5]])
    assert torch.equal(torch.nn.functional.embedding(ids, p), w.dequantize()[ids])
    both = torch.cat([p, p.detach()])
    assert both.packed and torch.equal(both.dequantize(), torch.cat([w.dequantize()] * 2))
    assert not packable(blocks[:40])


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
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_rows_are_looked_up_as_gguf_dequantizes_them(fmt):
    """The native lookup (an embedding a step) from the file's blocks and from packed ones: the bits of
    the torch de-quantization that test_quant ties to gguf's."""
    blocks = blocks_of(random_blocks(fmt, 64, 96, seed=3), fmt)
    ids = torch.tensor([5, 0, 63, 17, 5])
    want = dequantize(blocks)[ids]
    for w in (blocks, pack(blocks)):
        assert torch.equal(torch.ops.peagle.dequantize_rows(w, ids), want)
    with pytest.raises(RuntimeError, match="out of 64"):
        torch.ops.peagle.dequantize_rows(blocks, torch.tensor([64]))


@native
def test_greedy_is_torchs_argmax_and_finiteness_in_one_pass():
    from peagle.engine.sampling import greedy

    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 4099, generator=g)  # a tail past every vector width
    x[3, 100] = x[3].max()                  # a tie: the first index wins
    x[4, 4098] = x[4].max() + 1             # the max in the tail
    x[5, 7], x[6, 4000], x[7, 0], x[8] = float("nan"), float("inf"), float("-inf"), float("nan")
    for isa in ("avx512", "avx2", "scalar"):
        if isa == "avx512" and kernels.isa() != "avx512" or isa == "avx2" and kernels.isa() == "scalar":
            continue
        with kernels.use_isa(isa), torch.inference_mode():
            tokens, finite = greedy(x)
        assert torch.equal(tokens[:5], x[:5].argmax(-1)), isa
        assert finite.tolist() == [True] * 5 + [False] * 4, isa
        assert 0 <= int(tokens.min()) and int(tokens.max()) < x.shape[1], isa  # a NaN row's token is a valid id


@native
def test_a_head_beside_a_target_on_the_integer_path_is_quantized(qllama, tmp_path):
    from peagle.models.drafter import save_drafter
    from peagle.models.loader import load_drafter_for

    save_drafter(init_drafter(qllama, 1, MASK, seed=3), tmp_path / "head")
    head = load_drafter_for(qllama, tmp_path, tmp_path / "head")
    assert all(isinstance(m.weight, QuantTensor) and m.weight.packed and m.weight.format == "q8_0"
               for m in head.modules() if isinstance(m, Linear))
