"""GGUF weights as they ship (peagle/models/quant.py and the kernels' float32 path for every block format:
q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; the integer path: test_int8): our
de-quantization is gguf's bit for bit, the quantized linear is the same kernel on the de-quantized
matrix bit for bit (each instruction set its scalar reference's bits, each row's result independent
of the pass), and the default model kept quantized runs as its de-quantized copy does."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch

from conftest import run_full
from speculation import assert_lossless_on_path
from test_kernels import LANES, each_isa

from peagle import kernels
from peagle.bench.peers.llamacpp import available as llamacpp_available
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.memory import HUGE_PAGE
from peagle.models.checkpoint import CheckpointError
from peagle.models.loader import default_gguf, load_target, load_tokenizer, resolve_target
from peagle.models.checkpoint import split_checkpoint
from peagle.models.llama import ModelConfig, build_target
from peagle.models.quant import (DEQUANT_ROWS, FORMATS, QBLOCK, QUANT_ROWS, GGUFError, QuantTensor, blocks_of, dequantize,
                                 formats, gguf_tensors, onto_huge_pages, pack, pack_owned, quantize, read_gguf)
from peagle.models.layers import pack_model

# the integer path runs here: kernels on and built, and an integer instruction set this CPU has
INT_PATH = os.environ.get("PEAGLE_NATIVE") != "0" and kernels.available() and kernels.int_isa() != "none"

native = pytest.mark.skipif(os.environ.get("PEAGLE_NATIVE") == "0" or not kernels.available(),
                            reason="the native kernels are off")
GGML = {name: getattr(gguf.GGMLQuantizationType, name.upper()) for name in FORMATS}


def random_blocks(fmt: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF blocks ``[rows, k / weights * block bytes]``: random quants (and a K-quant's sub-block scales),
    random finite fp16 scales and mins of either sign (subnormals among them): the first bytes of a block,
    q6_k's last two."""
    f = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    nb = k // f.weights
    b = rng.integers(0, 256, size=(rows, nb, f.block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal((rows, nb, f.scale_bytes // 2)) * 0.02).astype(np.float16)
    scales.flat[::7] = np.float16(3e-6)  # a subnormal half
    at = f.block_bytes - 2 if fmt == "q6_k" else 0
    b[..., at:at + f.scale_bytes] = scales.view(np.uint8).reshape(rows, nb, f.scale_bytes)
    return b.reshape(rows, -1)


def width(fmt: str, k: int) -> int:
    """``k`` rounded up to whole blocks of ``fmt`` (a K-quant's 256)."""
    return -(-k // FORMATS[fmt].weights) * FORMATS[fmt].weights


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_ggufs_bit_for_bit(fmt):
    """The torch path's de-quantization, and the kernels' (rows looked up: each format's chunk_values, the
    float path's source of weights) are gguf's values bit for bit."""
    blocks = random_blocks(fmt, 40, 512)
    want = torch.from_numpy(gguf.quants.dequantize(blocks, GGML[fmt]))
    assert torch.equal(dequantize(blocks_of(blocks, fmt)), want)
    if kernels.available():
        ids = torch.tensor([39, 0, 7, 7], device="cpu")
        assert torch.equal(torch.ops.peagle.dequantize_rows(blocks_of(blocks, fmt), ids), want[ids])


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_0"])
def test_quantize_writes_ggufs_bytes(fmt):
    """``quantize`` (torch over slices of rows for the plain formats, gguf's code for the others) writes the
    bytes gguf's quantizer writes, on blocks that test its rounding: an all-zero block (no scale to invert), a
    constant one, halves after scaling (Q8_0 rounds them away from zero: planted fault, torch.round's to even),
    ties for the largest magnitude (Q4_0 takes the first), and more rows than one slice."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(QUANT_ROWS + 5, 128, generator=g) * 0.05
    w[0, :32] = 0
    w[1, :32] = 0.25
    w[2, :32] = 0.5
    w[2, 0] = 127.0  # scale 1: every 0.5 a tie
    w[3, 32:64] = torch.arange(32) - 16.0
    w[4, :32] = torch.where(torch.arange(32) % 2 == 0, 3.0, -3.0)
    want = blocks_of(gguf.quants.quantize(w.numpy(), GGML[fmt]), fmt)
    assert torch.equal(quantize(w, fmt), want)
    assert torch.equal(quantize(w.bfloat16(), fmt), blocks_of(gguf.quants.quantize(w.bfloat16().float().numpy(),
                                                                                 GGML[fmt]), fmt))
    with pytest.raises(ValueError, match="whole"):
        quantize(w[:, :100], fmt)


def test_the_default_models_tensors_dequantize_as_gguf_does():
    reader = gguf.GGUFReader(str(default_gguf()))
    seen = set()
    for t in reader.tensors:
        fmt = t.tensor_type.name.lower()
        if fmt in FORMATS and fmt not in seen:
            seen.add(fmt)
            rows = np.asarray(t.data)[:512]
            want = torch.from_numpy(gguf.quants.dequantize(rows, t.tensor_type))
            assert torch.equal(dequantize(blocks_of(rows, fmt)), want), t.name
    assert seen == {"q4_1", "q8_0"}


def test_quant_tensor_looks_up_rows_and_concatenates_rows():
    blocks = random_blocks("q4_1", 12, 64, seed=3)
    full = dequantize(blocks_of(blocks, "q4_1"))
    w = QuantTensor(blocks_of(blocks, "q4_1"), torch.float32)
    assert w.shape == (12, 64)
    ids = torch.tensor([[3, 0], [11, 3]], device="cpu")
    assert torch.equal(torch.nn.functional.embedding(ids, w), full[ids])
    assert torch.equal(w[torch.tensor([5, 1], device="cpu")], full[[5, 1]])
    both = torch.cat([w, w.detach()])
    assert isinstance(both, QuantTensor) and torch.equal(both.dequantize(), torch.cat([full, full]))
    with pytest.raises(NotImplementedError, match="--quantization none"):
        w + 1


def case(fmt: str, m: int, k: int, n: int, seed: int = 0):
    k = width(fmt, k)
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cpu")
    return x, blocks_of(random_blocks(fmt, n, k, seed), fmt), torch.randn(n, generator=g, device="cpu")


@each_isa()
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k,n", [(64, 40), (576, 96), (1536, 24)])
def test_each_isa_gives_the_bits_of_its_reference_and_of_the_dequantized_matrix(fmt, k, n, isa):
    x, blocks, b = case(fmt, 70, k, n)  # 70 rows: full tiles, leftover rows, and a second row chunk
    w = dequantize(blocks)
    for bias in (None, b):
        got = torch.ops.peagle.linear(x, blocks, bias, isa)
        assert torch.equal(got, torch.ops.peagle.linear_ref(x, blocks, bias, LANES[isa])), (isa, fmt)
        assert torch.equal(got, torch.ops.peagle.linear(x, w, bias, isa)), (isa, fmt)
    exact = x.double() @ w.double().t()
    got = torch.ops.peagle.linear(x, blocks, None, isa)
    assert (got.double() - exact).abs().max() < 1e-5 * exact.abs().max()


@each_isa()
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_result_does_not_depend_on_the_pass(fmt, isa):
    x, blocks, b = case(fmt, 40, 576, 72, seed=1)
    alone = torch.cat([torch.ops.peagle.linear(x[i:i + 1], blocks, b, isa) for i in range(len(x))])
    for m in range(1, len(x) + 1):
        assert torch.equal(torch.ops.peagle.linear(x[:m], blocks, b, isa), alone[:m]), (isa, fmt, m)
    assert torch.equal(torch.ops.peagle.linear(x[3:11], blocks, b, isa), alone[3:11])


@native
def test_bad_block_weights_are_refused():
    x, blocks, _ = case("q4_1", 2, 64, 8)
    with pytest.raises(RuntimeError, match="21-byte blocks are no format"):
        torch.ops.peagle.linear(x, torch.zeros(8, 2, 21, dtype=torch.uint8, device="cpu"))
    with pytest.raises(RuntimeError, match=r"uint8 \[N, K / block weights, block bytes\]"):
        torch.ops.peagle.linear(x, blocks.view(8, -1))
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.peagle.linear(x[:, :32], blocks)


@native
@pytest.mark.parametrize("fmt", FORMATS)
def test_packing_owned_blocks_where_they_lie_gives_packs_bytes(fmt):
    """:func:`pack_owned` (a freshly loaded model's blocks packed in their own memory, a slice of rows at a
    time) gives :func:`pack`'s bytes, over several slices and a short last one; the formats whose packed group
    is larger than its rows (the K-quants) are packed into new memory."""
    if kernels.int_isa() == "none":
        pytest.skip("no integer path on this CPU")
    k = width(fmt, 64)
    blocks = blocks_of(random_blocks(fmt, DEQUANT_ROWS * 2 + 48, k), fmt)
    got = pack_owned(blocks.clone())
    assert torch.equal(got, pack(blocks))
    same_size = FORMATS[fmt].packed_bytes == 16 * FORMATS[fmt].block_bytes
    owned = blocks.clone()
    assert (pack_owned(owned).data_ptr() == owned.data_ptr()) == same_size


def mapping_of(ptr: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds address ``ptr`` (``range``: its addresses)."""
    fields, inside = {}, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= ptr < hi
            if inside:
                fields["range"] = head
        elif inside:
            fields[head.rstrip(":")] = line.split()[1]
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc only")
def test_packed_weights_move_onto_one_mapping_of_huge_pages_with_their_bytes():
    """:func:`onto_huge_pages` gives each weight's blocks a new home (blocks two weights share, one) with their bytes,
    in one mapping 2 MB-aligned at its start that asks for huge pages, and lets the old ones go: blocks packed where
    they lay, a view of the file's blocks, no longer hold those alive."""
    import weakref

    base = torch.randint(0, 255, (4096, 8, 20), dtype=torch.uint8)  # a file's Q4_1 blocks
    a = QuantTensor(base.view(256, 8, 320), torch.float32)  # packed where they lay: a view, as pack_owned leaves
    b = QuantTensor(torch.randint(0, 255, (400, 10, 544), dtype=torch.uint8), torch.float32)  # packed Q8_0
    shared = QuantTensor(b.blocks, torch.float32)
    want, gone = (a.blocks.clone(), b.blocks.clone()), weakref.ref(base)
    del base
    onto_huge_pages([a, b, shared, a])
    assert torch.equal(a.blocks, want[0]) and torch.equal(b.blocks, want[1]) and shared.blocks is b.blocks
    assert gone() is None  # the file's blocks freed
    assert a.blocks.data_ptr() % HUGE_PAGE == 0 and b.blocks.data_ptr() == a.blocks.data_ptr() + a.blocks.numel()
    area = mapping_of(a.blocks.data_ptr())
    assert mapping_of(b.blocks.data_ptr())["range"] == area["range"]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc only")
def test_the_huge_page_mapping_is_thp_eligible_where_the_system_grants_them():
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if "[never]" in (open(thp).read() if os.path.exists(thp) else "[never]"):
        pytest.skip("transparent huge pages are off on this system ([never], or no THP)")
    a = QuantTensor(torch.randint(0, 255, (1024, 16, 320), dtype=torch.uint8), torch.float32)  # 5 MB: huge pages fit
    onto_huge_pages([a])
    area = mapping_of(a.blocks.data_ptr())
    if "THPeligible" not in area:
        pytest.skip("this kernel's smaps reports no THPeligible")
    assert area["THPeligible"] == "1"


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc only")
@pytest.mark.skipif(not INT_PATH, reason="no integer path here (kernels off or not built, or no AVX2): nothing packed")
def test_a_model_loaded_for_the_integer_path_has_its_packed_weights_on_one_huge_page_mapping():
    model = load_target(None, "float32")[0]
    packed = [p.blocks for p in model.parameters() if isinstance(p, QuantTensor) and p.packed]
    assert len(packed) > 100 and len({mapping_of(p.data_ptr())["range"] for p in packed}) == 1
    assert min(p.data_ptr() for p in packed) % HUGE_PAGE == 0


@native
def test_peagles_operators_take_a_quant_tensors_blocks():
    """Any operator given a QuantTensor (the fused decoder layers too) gets its blocks."""
    x, blocks, b = case("q4_0", 3, 64, 8)
    w = QuantTensor(blocks, torch.bfloat16)
    assert torch.equal(torch.ops.peagle.linear(x, w, b), torch.ops.peagle.linear(x, blocks, b))


# ------------------------------------------------------------------------------ the default model
TEXT = ("The ocean covers more than seventy percent of the surface of the Earth. It holds most of the planet's "
        "water, shapes its climate and feeds billions of people. Sailors have crossed it for thousands of years, "
        "first along the coasts and later across the open sea, guided by the stars, the winds and the currents.")


@pytest.fixture(scope="module")
def default_both():
    """The default model kept quantized (``--compute exact``: float32 arithmetic), and de-quantized through
    transformers (``--quantization none``)."""
    quant, path = load_target(None, "float32", compute="exact")
    plain, _ = load_target(None, "float32", quantization="none")
    ids = torch.tensor(load_tokenizer(path)(TEXT + " " + TEXT)["input_ids"][:128], device="cpu")
    return quant, plain, ids


@pytest.fixture(scope="module")
def default_fast():
    """The default model as ``generate`` loads it: packed for the integer path where this CPU has one."""
    return load_target(None, "float32")[0]


def test_the_quantized_default_model_holds_transformers_weights(default_both):
    """Every tensor, de-quantized, is the bits of transformers' conversion: the q/k rows un-permuted as
    its loader does, q/k/v and gate/up fused the same way."""
    quant, plain, _ = default_both
    want = plain.state_dict()
    for name, w in quant.state_dict().items():
        got = w.dequantize(torch.float32) if isinstance(w, QuantTensor) else w.float()
        assert torch.equal(got, want[name].float()), name


@native
def test_the_default_model_kept_quantized_gives_its_dequantized_copys_logits(default_both):
    quant, plain, ids = default_both
    assert formats(quant) == ["q4_1", "q8_0"] and formats(plain) == []
    assert quant.model.embed_tokens.weight is quant.head_weight()  # the LM head multiplies by the Q8_0 blocks
    logits, aux = run_full(quant, ids)
    ref_logits, ref_aux = run_full(plain, ids)
    assert torch.equal(logits, ref_logits) and torch.equal(aux, ref_aux)


@native
def test_a_head_trains_against_the_quantized_default_model(default_both):
    """``peagle train`` on a GGUF target: the head starts from the embedding's de-quantized rows, the
    same as from the de-quantized model's (it used to fail on the quantized table)."""
    from peagle.train.head import TrainHead

    quant, plain, ids = default_both
    draft = torch.arange(256, device="cpu")
    heads = [TrainHead.for_target(t, 1, draft, 0, 3) for t in (quant, plain)]
    for a, b in zip(*(h.state_dict().values() for h in heads)):
        assert torch.equal(a, b)


@native
def test_the_integer_path_stays_close_to_float32_arithmetic(default_both, default_fast):
    """On the default model, 8-bit activations move the logits (range about +-35) by well under a unit
    on average, and the argmax agrees almost everywhere."""
    quant, _, ids = default_both
    ref, _ = run_full(quant, ids)
    got, _ = run_full(default_fast, ids)
    assert kernels.int_isa() == "none" or (default_fast.precision == "GGUF Q4_1/Q8_0 weights, int8 compute")
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    assert (got - ref).abs().mean() < 0.5


@pytest.mark.parametrize("compute", ["fast", "exact"])
def test_the_engine_says_it_runs_gguf_weights(compute):
    """What runs, as the engine says it: the file's blocks on the kernels, or, where they are off (the
    torch path), the weights de-quantized to ``auto``'s dtype there (float32), as the loader's one-line notice
    says."""
    engine = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, max_model_len=64, compute=compute)
    arith = "int8" if compute == "fast" and kernels.int_isa() != "none" else "float32"
    if kernels.available():
        assert engine.quantization == "gguf" and engine.precision == f"GGUF Q4_1/Q8_0 weights, {arith} compute"
    else:
        assert engine.quantization == "none" and engine.precision == "float32"
    out = engine.generate([engine.encode_prompt("Hi")], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


@native
@pytest.mark.skipif(not llamacpp_available(), reason="llama-cpp-python is not installed")
def test_logits_agree_with_llama_cpp_on_the_same_file(default_both):
    """llama.cpp multiplies Q4_1 by activations it quantizes to 8 bits, we by float32 ones: the argmax
    agrees almost everywhere and the logits (range about +-35) within a couple of units."""
    import llama_cpp

    quant, _, ids = default_both
    llm = llama_cpp.Llama(model_path=str(default_gguf()), logits_all=True, n_ctx=256, n_threads=1, verbose=False)
    llm.eval(ids.tolist())
    ref = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
    logits, _ = run_full(quant, ids)
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    assert (logits - ref).abs().max() < 3.0


def test_bad_gguf_targets_and_quantizations_are_refused(tmp_path, default_both):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(default_gguf().read_bytes()[:4096])
    with pytest.raises(CheckpointError, match="broken.gguf"):
        load_target(bad, "float32", device="cpu")
    with pytest.raises(ValueError, match="unknown quantization 'q4'"):
        load_target(None, "float32", device="cpu", quantization="q4")
    with pytest.raises(ValueError, match="unknown compute 'int4'"):
        load_target(None, "float32", device="cpu", compute="int4")
    with pytest.raises(ValueError, match="needs a .gguf target"):
        load_target(resolve_target(None), "float32", device="cpu", quantization="gguf")


VOCAB = 160  # the tiny GGUF's vocabulary: speculation's test prompts (speculation.prompts) fit


def tiny_cfg(hidden: int = 64) -> ModelConfig:
    """The config of :func:`tiny_gguf`'s model."""
    return ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
                       num_heads=4, num_kv_heads=2, head_dim=hidden // 4, rms_norm_eps=1e-6, rope_theta=1e4,
                       rope_scaling=None, max_position_embeddings=64, tie_word_embeddings=True)


def tiny_gguf(path, types: dict[str, str], hidden: int = 64) -> dict[str, np.ndarray]:
    """A one-layer Llama GGUF file (``hidden`` wide, 4 heads, 2 KV heads), each matrix quantized by gguf
    into the type ``types`` names (F32 else; random blocks where gguf has no quantizer: K-quants, IQ4_NL);
    returns the float32 values gguf de-quantizes them to."""
    rng = np.random.default_rng(0)
    h, kv = hidden, hidden // 2
    shapes = {"token_embd.weight": (VOCAB, h), "output_norm.weight": (h,), "blk.0.attn_norm.weight": (h,),
              "blk.0.ffn_norm.weight": (h,), "blk.0.attn_q.weight": (h, h), "blk.0.attn_k.weight": (kv, h),
              "blk.0.attn_v.weight": (kv, h), "blk.0.attn_output.weight": (h, h),
              "blk.0.ffn_gate.weight": (2 * h, h), "blk.0.ffn_up.weight": (2 * h, h), "blk.0.ffn_down.weight": (h, 2 * h)}
    w = gguf.GGUFWriter(str(path), "llama")
    values = {}
    for i, (name, shape) in enumerate(shapes.items()):
        t = getattr(gguf.GGMLQuantizationType, types.get(name, "F32"))
        data = rng.standard_normal(shape).astype(np.float32) * 0.1
        if t.name.lower() in FORMATS and FORMATS[t.name.lower()].weights > QBLOCK:
            data = random_blocks(t.name.lower(), shape[0], shape[1], seed=i)
        elif t == gguf.GGMLQuantizationType.IQ4_NL:  # a format peagle does not keep: q4_0's layout, other values
            data = random_blocks("q4_0", shape[0], shape[1], seed=i)
        elif t != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(data, t)
        w.add_tensor(name, data, raw_dtype=t)
        values[name] = gguf.quants.dequantize(data, t).reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


def tiny_names(cfg: ModelConfig) -> list[str]:
    with torch.device("meta"):
        model = build_target(cfg, (0, 1, 1))
    return list(split_checkpoint(model.state_dict(), model))


def gguf_readers_table(path) -> tuple[str, list]:
    """What :func:`gguf_tensors` gives, by ``gguf.GGUFReader`` (which parses every metadata value)."""
    reader = gguf.GGUFReader(str(path))
    return str(reader.get_field("general.architecture").contents()), [
        (t.name, t.tensor_type, [int(n) for n in t.shape], int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]


def test_the_tensor_table_is_read_from_the_header_as_gguf_reads_it(tmp_path):
    """The default model's file (its tokenizer's strings, scores and merges stepped over) and a tiny file with
    every kept format and a de-quantized one: names, types, shapes, offsets and sizes as GGUFReader has them; a
    truncated header is refused."""
    tiny_gguf(tmp_path / "k.gguf", {**K_FILES["k-quants"][0], "blk.0.attn_output.weight": "IQ4_NL"}, hidden=256)
    for path in (default_gguf(), tmp_path / "k.gguf"):
        assert gguf_tensors(path) == gguf_readers_table(path), path
    data = default_gguf().read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:1 << 20])  # inside the tokenizer's metadata
    with pytest.raises(GGUFError, match="corrupt or unreadable"):
        read_gguf(tmp_path / "cut.gguf", [], tiny_cfg(), True, torch.float32, torch.float32, torch.device("cpu"))


def lie(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with the first ``old`` (a header field as stored) replaced by ``new`` of the same length."""
    at = data.index(old)
    return data[:at] + new + data[at + len(old):]


def test_a_lying_or_cut_gguf_header_is_refused_naming_what_is_wrong(tmp_path):
    """Each tensor's offset and size checked against the file, the alignment, a tensor's dimensions and its shape in
    whole blocks: a clear GGUFError, never a read past the end or a division by zero. Without the checks a file cut
    after its header reads short, and an alignment of 0 divides by zero."""
    import struct

    tiny_gguf(tmp_path / "k.gguf", {"blk.0.ffn_down.weight": "Q4_0"})
    data = (tmp_path / "k.gguf").read_bytes()
    arch, tensors = gguf_tensors(tmp_path / "k.gguf")
    name, _, shape, offset, nbytes = tensors[-1]
    start = offset - struct.unpack_from("<Q", data, data.index(name.encode()) + len(name) + 4 + 8 * len(shape) + 4)[0]
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")  # a header that names its alignment (32), then says 0
    w.add_custom_alignment(32)
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    field = b"general.alignment" + struct.pack("<I", 4)  # the key, then its type: uint32
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")  # a vocabulary whose last string says it is longer
    w.add_token_list(["a", "bb", "ccc"])
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cases = {
        "a string runs past the end": lie((tmp_path / "v.gguf").read_bytes(), struct.pack("<Q", 3) + b"ccc",
                                          struct.pack("<Q", 1 << 40) + b"ccc"),
        "runs past the end": data[:offset + nbytes - 1],
        "not a positive power of two": lie((tmp_path / "a.gguf").read_bytes(), field + struct.pack("<I", 32),
                                           field + struct.pack("<I", 0)),
        "misaligned or runs past": lie(data, struct.pack("<Q", offset - start), struct.pack("<Q", offset - start + 1)),
        "dimensions": lie(data, name.encode() + struct.pack("<I", len(shape)), name.encode() + struct.pack("<I", 9)),
    }
    for msg, bad in cases.items():
        (tmp_path / "bad.gguf").write_bytes(bad)
        with pytest.raises(GGUFError, match=msg):
            read_gguf(tmp_path / "bad.gguf", tiny_names(tiny_cfg()), tiny_cfg(), True, torch.float32, torch.float32,
                      torch.device("cpu"))


def test_read_gguf_keeps_the_block_formats_and_de_quantizes_the_rest(tmp_path, capsys):
    types = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_1", "blk.0.attn_k.weight": "Q4_1",
             "blk.0.attn_v.weight": "Q4_1", "blk.0.attn_output.weight": "IQ4_NL", "blk.0.ffn_down.weight": "Q4_0"}
    values = tiny_gguf(tmp_path / "tiny.gguf", types)
    cfg = tiny_cfg()
    names = tiny_names(cfg)
    sd = read_gguf(tmp_path / "tiny.gguf", names, cfg, True, torch.bfloat16, torch.float32, torch.device("cpu"))
    assert capsys.readouterr().err == ("peagle: tiny.gguf: kept quantized: 3 Q4_1, 1 Q8_0, 1 Q4_0; de-quantized to "
                                       "bfloat16: 1 IQ4_NL (peagle keeps Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, "
                                       "Q6_K matrices quantized)\n")
    p = "model.layers.0."
    assert {k: v.format for k, v in sd.items() if isinstance(v, QuantTensor)} == {
        "model.embed_tokens.weight": "q8_0", p + "self_attn.q_proj.weight": "q4_1",
        p + "self_attn.k_proj.weight": "q4_1", p + "self_attn.v_proj.weight": "q4_1", p + "mlp.down_proj.weight": "q4_0"}
    assert sd[p + "self_attn.o_proj.weight"].dtype == torch.bfloat16  # IQ4_NL: de-quantized into the run's dtype
    assert torch.equal(sd["model.embed_tokens.weight"].dequantize(), torch.from_numpy(values["token_embd.weight"]))
    assert torch.equal(sd[p + "mlp.down_proj.weight"].dequantize(torch.float32), torch.from_numpy(values["blk.0.ffn_down.weight"]))
    for name, heads in (("q", 4), ("k", 2)):  # llama.cpp's RoPE row order undone, as transformers does
        want = torch.from_numpy(values[f"blk.0.attn_{name}.weight"])
        want = want.reshape(heads, -1, 2, 64).transpose(1, 2).reshape(want.shape)
        assert torch.equal(sd[p + f"self_attn.{name}_proj.weight"].dequantize(torch.float32), want), name
    with pytest.raises(GGUFError, match="unexpected tensor 'blk.0.ffn_up.weight'"):
        read_gguf(tmp_path / "tiny.gguf", [n for n in names if "up_proj" not in n], cfg, True, torch.float32,
                  torch.float32, torch.device("cpu"))


def layer_types(qkv, o, gate_up, down) -> dict[str, str]:
    """:func:`tiny_gguf`'s types for its one layer (a Q8_0 embedding)."""
    b = "blk.0."
    return {"token_embd.weight": "Q8_0", b + "attn_q.weight": qkv[0], b + "attn_k.weight": qkv[1],
            b + "attn_v.weight": qkv[2], b + "attn_output.weight": o, b + "ffn_gate.weight": gate_up[0],
            b + "ffn_up.weight": gate_up[1], b + "ffn_down.weight": down}


# every format but Q4_0/Q4_1 kept; then Q4_K_M's mixes: Q5_0 q/k beside a Q8_0 v, gate and up in two K-quants,
# each fused matrix kept in parts of their own formats (QuantParts: no matrix de-quantized)
K_FILES = {
    "k-quants": (layer_types(("Q4_K",) * 3, "Q5_K", ("Q5_1", "Q5_1"), "Q6_K"),
                 "kept quantized: 3 Q4_K, 2 Q5_1, 1 Q8_0, 1 Q5_K, 1 Q6_K",
                 ["q4_k", "q5_1", "q5_k", "q6_k", "q8_0"]),
    "mixed": (layer_types(("Q5_0", "Q5_0", "Q8_0"), "Q5_0", ("Q4_K", "Q6_K"), "Q5_0"),
              "kept quantized: 4 Q5_0, 2 Q8_0, 1 Q4_K, 1 Q6_K",
              ["q4_k", "q5_0", "q6_k", "q8_0"]),
}


@pytest.mark.skipif(not kernels.available() or kernels.int_isa() == "none", reason="no integer path: nothing packed")
@pytest.mark.parametrize("file", K_FILES)
def test_a_packed_load_writes_each_matrix_once_where_it_stays(file, tmp_path):
    """``read_gguf(packs=True)`` (the integer path's load) packs each matrix straight into one mapping: the bytes
    :func:`pack` gives the file's blocks, fused parts side by side, so that fusing q/k/v and gate/up is a view of that
    mapping (no copy), and moving weights onto huge pages later moves nothing. A part placed apart from its group,
    or packed into another's place, fails it."""
    from peagle.models.quant import QuantParts, in_arena

    types, _, _ = K_FILES[file]
    tiny_gguf(tmp_path / "k.gguf", types, hidden=256)
    cfg = tiny_cfg(256)
    # bf16 nominal (as generate loads): a packed fused weight must not look like a bf16 matrix to pack_model
    args = (tmp_path / "k.gguf", tiny_names(cfg), cfg, True, torch.bfloat16, torch.float32, torch.device("cpu"))
    plain, packed = read_gguf(*args), read_gguf(*args, packs=True)
    for name, w in packed.items():
        if isinstance(w, QuantTensor):
            assert w.packed and in_arena(w.blocks) and torch.equal(w.blocks, pack(plain[name].blocks)), name
    with torch.device("meta"):
        model = build_target(cfg, (0, 1, 1))
    model.load_checkpoint(packed)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    for w in (attn.qkv_proj.weight, mlp.gate_up_proj.weight):
        blocks = [p.blocks for p in w.parts] if isinstance(w, QuantParts) else [w.blocks]
        assert all(in_arena(b) for b in blocks)  # fused where they lay: a view, or parts
    before = attn.qkv_proj.weight
    pack_model(model, model.model.embed_tokens)
    assert all(in_arena(b) for b in ([p.blocks for p in before.parts] if isinstance(before, QuantParts)
                                     else [before.blocks]))


@pytest.mark.parametrize("path", [None] + [pytest.param(isa, marks=pytest.mark.skipif(
    not INT_PATH or isa not in torch.ops.peagle.int_isas(), reason=f"this CPU (or the kernels' absence) has no {isa}"))
    for isa in ("avx512vnni", "avxvnni", "avx2")])
@pytest.mark.parametrize("file", K_FILES)
def test_a_k_quant_gguf_runs_kept_quantized_as_its_de_quantized_copy(file, path, tmp_path, capsys):
    """Tiny GGUFs with the K-quants and 5-bit formats (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1; Q8_0 beside), and with
    Q4_K_M's mixes of formats in fused matrices: each matrix is kept as stored (or as the line says),
    de-quantizes to gguf's values, and the model gives the bits of the same model loaded de-quantized (the
    float path, ``--compute exact``: the same kernel on the same values); packed for the integer path its
    logits stay close, and speculation on it is plain decoding on every instruction set this CPU has (``path``:
    None, the file's blocks; an integer path, the same packed for it, skipped with the reason where absent)."""
    types, line, kept = K_FILES[file]
    values = tiny_gguf(tmp_path / "k.gguf", types, hidden=256)
    cfg = tiny_cfg(256)
    names = tiny_names(cfg)
    keep = kernels.available()
    sd = read_gguf(tmp_path / "k.gguf", names, cfg, keep, torch.float32, torch.float32, torch.device("cpu"))
    if keep:
        assert capsys.readouterr().err == f"peagle: k.gguf: {line}\n"
    plain = {k: v.dequantize() if isinstance(v, QuantTensor) else v for k, v in sd.items()}
    p = "model.layers.0."
    for name, hf in (("ffn_down", "mlp.down_proj"), ("attn_output", "self_attn.o_proj"), ("attn_v", "self_attn.v_proj"),
                     ("ffn_up", "mlp.up_proj")):
        assert torch.equal(plain[p + hf + ".weight"], torch.from_numpy(values[f"blk.0.{name}.weight"])), name
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(0))
    models = []
    for weights in (sd, plain):
        with torch.device("meta"):
            m = build_target(cfg, (0, 1, 1))
        m.load_checkpoint(dict(weights))
        models.append(m.eval())
    assert formats(models[0]) == (kept if keep else [])
    ref, _ = run_full(models[1], ids)
    got, _ = run_full(models[0], ids)
    assert torch.equal(got, ref)
    if path is None:
        return
    with kernels.use_isa({"avx512vnni": "avx512"}.get(path, path)):
        assert kernels.int_isa() == path
        pack_model(models[0], models[0].model.embed_tokens)
        assert models[0].precision == f"GGUF {'/'.join(kept).upper()} weights, int8 compute"
        fast, _ = run_full(models[0], ids)
        err = (fast - ref).abs()  # every matrix on 8-bit activations, random blocks: the error compounds
        assert err.mean() < 0.02 * ref.abs().max() and err.max() < 0.15 * ref.abs().max(), (err.mean(), err.max())
        assert_lossless_on_path(models[0], "parallel")
