"""GGUF weights as they ship: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 matrices kept in their 32-weight blocks and Q4_K,
Q5_K, Q6_K ones in their 256-weight super-blocks, as the file stores them, for peagle's CPU kernels, read
from the ``.gguf`` file without de-quantizing the model.

A quantized matrix is a :class:`QuantTensor`: to the model it looks like the ``[out, in]`` weight it
stands for (shape, a nominal dtype, a parameter of its module, concatenated like one when q/k/v and
gate/up are fused), while peagle's operators get its blocks, uint8 ``[out, in / 32, block bytes]`` (the
block size names the format: ``peagle/kernels/csrc/kernels.h``), and an embedding lookup de-quantizes
only the rows it looks up. Blocks run along a row, so a row permutation or concatenation is exact. Every
format has an integer path too: for it (``--compute fast``) a loaded model's blocks are packed
(:func:`~peagle.models.layers.pack_model`: 16 rows interleaved,
uint8 ``[out / 16, in / block weights, packed bytes]``, the same values: a permutation
of the bytes for Q8_0/Q4_0/Q4_1, of the bits for the others, the K-quants' integer scales kept as bytes: within
3% of the file's size); so are
its bfloat16 matrices for the bf16 dot-product path (:func:`pack_bf16`, uint8 ``[out / 16, in / 2, 64]``),
a QuantTensor of format ``bf16`` (not GGUF-quantized: its values are the matrix's own). With ``--compute
exact`` the file's blocks stay as they are, on the float32 path (``kernels.h``: chunk_values).
"""
from __future__ import annotations

import mmap
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from peagle import kernels
from peagle.kernels import table
from peagle.kernels.blocks import BLOCK_SIZES
from peagle.memory import HUGE_PAGE, anonymous_memory
from peagle.models.fused import fused_groups
from peagle.models.packed_cache import PackedCache

DEQUANT_ROWS = 1024  # rows de-quantized at a time (QuantTensor.dequantize)


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF block format: its name (the kernels' and GGUF's), block size in bytes, its packed size
    (:func:`pack`'s last dimension), whether it stores a min per block, whether its quants are nibbles (else
    int8), the weights a block holds, and whether its blocks are plain (a fp16 scale (and min), then the
    quants as they are: de-quantized in torch here; the others, with high-bit planes or a K-quant's
    super-block, through gguf's own code)."""

    name: str
    block_bytes: int
    packed_bytes: int
    has_min: bool
    nibbles: bool
    weights: int
    plain: bool = True

    @property
    def scale_bytes(self) -> int:
        return 4 if self.has_min else 2


def _format(name: str, has_min: bool, nibbles: bool, plain: bool = True) -> BlockFormat:
    """Format ``name`` with its sizes as the kernels publish them (:data:`peagle.kernels.blocks.BLOCK_SIZES`)."""
    block_bytes, packed_bytes, weights = BLOCK_SIZES.formats[name]
    return BlockFormat(name, block_bytes, packed_bytes, has_min, nibbles, weights, plain)


FORMATS = {f.name: f for f in (
    _format("q8_0", False, False), _format("q4_0", False, True), _format("q4_1", True, True),
    _format("q5_0", False, True, plain=False), _format("q5_1", True, True, plain=False),
    _format("q4_k", True, True, plain=False), _format("q5_k", True, True, plain=False),
    _format("q6_k", False, False, plain=False))}
BY_SIZE = {f.block_bytes: f for f in FORMATS.values()}  # the block size names the format
QBLOCK = FORMATS["q8_0"].weights  # weights per block (a K-quant's super-block: 8 of them)
GROUP = BLOCK_SIZES.group  # columns a packed block interleaves
PACKED = {f.packed_bytes: f for f in FORMATS.values()}  # a packed group's size names it too
BF16_PAIR = BLOCK_SIZES.bf16_pair  # bytes of a packed bf16 matrix's (group, k pair): 16 columns' weights k, k+1


def blocks_of(data: np.ndarray, fmt: str) -> torch.Tensor:
    """A matrix's GGUF bytes (``[N, nb * block_bytes]``) as the kernels take them: a CPU tensor, uint8
    ``[N, nb, block_bytes]``, on ``data``'s memory where it is a writable C-ordered uint8 array (the loader's,
    read for it: no second copy of a 170 MB embedding), else on a copy."""
    f = FORMATS[fmt]
    data = np.require(data, np.uint8, ["C", "W"])
    return torch.from_numpy(data.reshape(data.shape[0], -1, f.block_bytes))


def dequantize(blocks: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """GGUF blocks ``[N, nb, block_bytes]`` -> ``[N, nb * weights]`` in ``dtype``: the float32 values gguf's
    ``dequantize`` gives (q * d exact, + m rounded once; the formats that are not plain through gguf's own
    code, on the host), then cast."""
    f = BY_SIZE[blocks.shape[-1]]
    if not f.plain:
        import gguf

        kind = getattr(gguf.GGMLQuantizationType, f.name.upper())
        w = gguf.quants.dequantize(blocks.cpu().reshape(blocks.shape[0], -1).numpy(), kind)
        return torch.from_numpy(w).to(device=blocks.device, dtype=dtype)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [N, nb, 1]
    q = blocks[..., f.scale_bytes:]
    if f.nibbles:
        q = torch.cat([q & 15, q >> 4], dim=-1).to(torch.int32)  # low nibbles: weights 0..15
        q = q if f.has_min else q - 8
    else:
        q = q.contiguous().view(torch.int8).to(torch.int32)
    w = q.float() * d
    if f.has_min:
        w = w + blocks[..., 2:4].contiguous().view(torch.float16).float()
    return w.reshape(blocks.shape[0], -1).to(dtype)


QUANT_ROWS = 128  # rows quantized at a time (2 threads, 16,384 x 2,048: 16-1,024 rows took 0.08-0.20 s, 128 0.08-0.12)


def quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """A float matrix ``[N, K]`` as GGUF ``fmt`` blocks ``[N, K / 32, block_bytes]`` on the CPU: the bytes gguf's
    own quantizer writes. For the plain formats its numpy arithmetic (float32, the same operations) over whole
    slices of rows in torch: gguf's loops over 16 rows at a time took 1.8 s of a random 1B-sized head's 3.0 s
    load. The other formats through gguf's code."""
    f = FORMATS[fmt]
    if w.dim() != 2 or w.shape[1] % f.weights:
        raise ValueError(f"quantize: a matrix of whole {fmt} blocks ({f.weights} weights a row), got {tuple(w.shape)}")
    w = w.detach().float().cpu()
    if not f.plain:
        import gguf

        return blocks_of(gguf.quants.quantize(w.numpy(), getattr(gguf.GGMLQuantizationType, fmt.upper())), fmt)
    n, nb = w.shape[0], w.shape[1] // f.weights
    out = torch.empty(n, nb, f.block_bytes, dtype=torch.uint8)
    for i in range(0, n, QUANT_ROWS):
        out[i:i + QUANT_ROWS] = _quantize_blocks(w[i:i + QUANT_ROWS].reshape(-1, nb, f.weights), fmt)
    return out


def _quantize_blocks(b: torch.Tensor, fmt: str) -> torch.Tensor:
    """gguf's ``quantize_blocks`` of Q8_0, Q4_0 and Q4_1 (``gguf/quants.py``) over float32 blocks ``[..., 32]``."""
    def f16(x: torch.Tensor) -> torch.Tensor:
        return x.half().view(torch.uint8)

    def inverse(d: torch.Tensor) -> torch.Tensor:
        return torch.where(d == 0, 0.0, 1 / d)

    if fmt == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        x = b * inverse(d)
        a = x.abs()
        floored = a.floor()
        q = x.sign() * (floored + (2 * (a - floored)).floor())  # gguf's np_roundf: halves away from zero
        return torch.cat([f16(d), q.to(torch.int8).view(torch.uint8)], -1)
    if fmt == "q4_0":
        d = b.gather(-1, b.abs().argmax(-1, keepdim=True)) / -8
        q = (b * inverse(d) + 8.5).trunc().to(torch.uint8).clamp(0, 15)
        heads = [f16(d)]
    else:  # q4_1
        lo = b.amin(-1, keepdim=True)
        d = (b.amax(-1, keepdim=True) - lo) / 15
        q = ((b - lo) * inverse(d) + 0.5).trunc().to(torch.uint8).clamp(0, 15)
        heads = [f16(d), f16(lo)]
    half = q.shape[-1] // 2
    return torch.cat([*heads, q[..., :half] | (q[..., half:] << 4)], -1)


def unify_fused(sd: dict[str, torch.Tensor], groups: dict[str, list[str]], dtype: torch.dtype) -> Counter[str]:
    """Each group of matrices fused into one (q/k/v, gate/up) in place: quantized ones stay as they are (several
    formats fuse as :class:`QuantParts`); quantized ones beside float ones are de-quantized into ``dtype``.
    Returns how many matrices of each format were de-quantized."""
    dropped: Counter[str] = Counter()
    for names in groups.values():
        ts = [sd[n] for n in names]
        if all(quantized(t) for t in ts) or not any(quantized(t) for t in ts):
            continue
        for n, t in zip(names, ts):
            if quantized(t):
                dropped[t.format.upper()] += 1
                sd[n] = t.dequantize(dtype)
    return dropped


def packable(blocks: torch.Tensor) -> bool:
    """Whether :func:`pack` takes these file blocks: whole groups of 16 rows."""
    return blocks.shape[0] % GROUP == 0


def pack(blocks: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The file's blocks ``[N, nb, block_bytes]`` (N a multiple of 16) packed for the kernels' integer path,
    ``[N / 16, nb, packed bytes]`` (into ``out`` where given): 16 columns' scales, (mins,) high bits, then quants
    interleaved so that a vector's lanes are columns (the layout: ``peagle/kernels/csrc/kernels.h``), the same
    values (the kernels pack: needs them)."""
    return torch.ops.peagle.pack(blocks, out)


def pack_owned(blocks: torch.Tensor) -> torch.Tensor:
    """:func:`pack` for blocks nothing else holds: in the formats whose packed group is the size of its 16 rows
    (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) packed into their own memory, :data:`DEQUANT_ROWS` rows at a time, so that a
    large matrix is not held twice at load (Gemma 3's 170 MB Q8_0 embedding); the same bytes as :func:`pack`."""
    n, nb, size = blocks.shape
    f = BY_SIZE[size]
    if f.packed_bytes != GROUP * size:
        return pack(blocks)
    for i in range(0, n, DEQUANT_ROWS):
        blocks[i:i + DEQUANT_ROWS] = pack(blocks[i:i + DEQUANT_ROWS]).view(-1, nb, size)
    return blocks.view(n // GROUP, nb, f.packed_bytes)


def bf16_packable(w: torch.Tensor) -> bool:
    """Whether :func:`pack_bf16` takes ``w``: a plain bfloat16 ``[N, K]`` matrix on the CPU (not a QuantTensor
    standing for one), N a multiple of 16, K even."""
    return (w.dtype == torch.bfloat16 and w.dim() == 2 and w.device.type == "cpu" and not w.is_mkldnn
            and not isinstance(w, (QuantTensor, QuantParts))
            and w.shape[0] % GROUP == 0 and w.shape[1] % 2 == 0)


def pack_bf16(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A bfloat16 matrix ``[N, K]`` packed for the kernels' bf16 dot-product path, uint8 ``[N / 16, K / 2, 64]``
    (into ``out`` where given): 16 columns interleaved, column c's weights k, k+1 at bytes 4c .. 4c+3 of pair k / 2's
    vector (the layout: ``peagle/kernels/csrc/kernels.h``). A permutation of the matrix's bytes."""
    n, k = w.shape
    pairs = w.contiguous().view(torch.int32).view(n // GROUP, GROUP, k // 2)  # weights k, k+1 as one int32
    if out is None:
        return pairs.transpose(1, 2).contiguous().view(torch.uint8)
    out.view(torch.int32).copy_(pairs.transpose(1, 2))
    return out


def bf16_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of a :func:`pack_bf16`-ed matrix as bfloat16 ``[len(rows), K]``: the packing undone for them."""
    pairs = packed.view(torch.int32)  # [N / 16, K / 2, 16]
    return pairs[rows // GROUP, :, rows % GROUP].contiguous().view(torch.bfloat16)


@table.provides("dequantize_rows", "torch", "packed-bf16")
def _bf16_rows_of(w: "QuantTensor", rows: torch.Tensor) -> torch.Tensor:
    return bf16_rows(w.blocks, rows)


@table.provides("dequantize_rows", "torch", "gguf", "packed")
def _gguf_rows_of(w: "QuantTensor", rows: torch.Tensor) -> torch.Tensor:
    return dequantize(w.blocks[rows])


class QuantTensor(torch.Tensor):
    """A quantized ``[out, in]`` matrix standing for its de-quantized values in ``dtype`` (nominal: no
    such copy exists), its GGUF blocks in ``blocks``, as the file stores them or :func:`pack`-ed for the
    kernels' integer path (:attr:`packed`); or a bfloat16 matrix :func:`pack_bf16`-ed for the bf16
    dot-product path (format ``bf16``), standing for its values the same way. Supports what loading and running a model asks of a
    weight: detach, concatenation along rows, embedding lookups and row indexing (those rows
    de-quantized), ``.to`` (the whole matrix de-quantized, for callers that want a plain copy), and
    peagle's operators (given the blocks); anything else is refused with a clear error."""

    blocks: torch.Tensor

    @staticmethod
    def __new__(cls, blocks: torch.Tensor, dtype: torch.dtype):
        if blocks.dtype != torch.uint8 or blocks.dim() != 3 or blocks.shape[2] not in {**BY_SIZE, **PACKED, BF16_PAIR: 0}:
            raise ValueError(f"GGUF blocks are uint8 [rows, blocks, one of {sorted(BY_SIZE)} bytes] (packed: "
                             f"[rows / 16, blocks, one of {sorted(PACKED)}]; packed bf16: [rows / 16, in / 2, "
                             f"{BF16_PAIR}]), got {blocks.dtype} {tuple(blocks.shape)}")
        size = blocks.shape[2]
        packed = size in PACKED or size == BF16_PAIR
        per_block = 2 if size == BF16_PAIR else {**BY_SIZE, **PACKED}[size].weights
        shape = (blocks.shape[0] * (GROUP if packed else 1), blocks.shape[1] * per_block)
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=blocks.device)

    def __init__(self, blocks: torch.Tensor, dtype: torch.dtype):
        self.blocks = blocks.contiguous()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def packed(self) -> bool:
        return self.blocks.shape[2] in PACKED or self.format == "bf16"

    @property
    def format(self) -> str:
        """The GGUF block format (``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``q4_k``, ``q5_k``, ``q6_k``), or ``bf16``."""
        size = self.blocks.shape[2]
        return "bf16" if size == BF16_PAIR else {**BY_SIZE, **PACKED}[size].name

    def __repr__(self) -> str:
        return f"QuantTensor({self.format}, {tuple(self.shape)}, nominal {self.dtype})"

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole matrix in ``dtype`` (nominal by default), in slices of rows: the integer and float32
        temporaries of :func:`dequantize` stay small beside the result."""
        out = torch.empty(self.shape, dtype=dtype or self.dtype, device=self.blocks.device)
        for i in range(0, self.shape[0], DEQUANT_ROWS):
            out[i:i + DEQUANT_ROWS] = self.rows(torch.arange(i, min(i + DEQUANT_ROWS, self.shape[0]),
                                                             device=self.blocks.device), out.dtype)
        return out

    def detach(self) -> QuantTensor:
        # a method of its own, so that nn.Parameter's detach at load does not dispatch: torch's first
        # __torch_dispatch__ on a tensor subclass imports torch.distributed.tensor and sympy (~0.5 s of a start) to
        # test for a DTensor. Loading then dispatches nothing (cat_rows too), and running runs the kernels on blocks
        return QuantTensor(self.blocks, self.dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows ``ids`` (any shape) de-quantized: ``[*ids.shape, in]`` (one native call on the CPU, an
        embedding lookup a step; packed GGUF blocks exist only with the kernels)."""
        flat = ids.reshape(-1).to(self.blocks.device)
        return table.run("dequantize_rows", self, flat).to(dtype or self.dtype).view(*ids.shape, self.shape[1])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func.namespace == "peagle":  # the kernels take the blocks (the last dimension names the format)
            def unwrap(a):
                return a.blocks if isinstance(a, QuantTensor) else [unwrap(t) for t in a] if isinstance(a, list) else a
            return func(*[unwrap(a) for a in args], **kwargs)
        if func is aten.detach.default:
            return args[0].detach()
        if func is aten.cat.default and (args[1] if len(args) > 1 else kwargs.get("dim", 0)) == 0:
            if rows_of_one_width(args[0]):  # else cat_rows would hand the call back here
                return cat_rows(args[0])
        if func is aten.embedding.default:
            return args[0].rows(args[1])
        if func is aten.index.Tensor and isinstance(args[0], QuantTensor) and len(args[1]) == 1:
            return args[0].rows(args[1][0])
        if func is aten._to_copy.default:
            s = args[0]
            return s.dequantize(kwargs.get("dtype") or s.dtype).to(kwargs.get("device") or s.device)
        raise NotImplementedError(f"{func} is not supported on a GGUF-quantized weight; load the target with "
                                  "--quantization none")


def rows_of_one_width(ts: list[torch.Tensor]) -> bool:
    """Whether ``ts`` are GGUF matrices of one width: what :func:`cat_rows` fuses itself."""
    return all(isinstance(t, QuantTensor) and t.shape[1] == ts[0].shape[1] for t in ts)


def cat_rows(ts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(ts)`` along rows, without torch's dispatch where ``ts`` are GGUF matrices of one width (its first
    dispatch to a tensor subclass costs a start ~0.5 s: :meth:`QuantTensor.detach`): one :class:`QuantTensor` where
    they share a format, else their :class:`QuantParts`."""
    if not rows_of_one_width(ts):
        return torch.cat(ts, dim=0)
    if all(t.blocks.shape[1:] == ts[0].blocks.shape[1:] for t in ts):
        view = adjacent(ts)
        return QuantTensor(torch.cat([t.blocks for t in ts]) if view is None else view, ts[0].dtype)
    return QuantParts(list(ts), ts[0].dtype)  # formats of their own: fused as parts


def adjacent(ts: list[QuantTensor]) -> torch.Tensor | None:
    """The blocks of ``ts`` as one view where they lie one after another in one memory (a packed load places fused
    matrices so: fusing them then copies nothing), else None."""
    b = [t.blocks for t in ts]
    size = lambda x: x.numel() * x.element_size()  # noqa: E731
    if any(x.untyped_storage().data_ptr() != b[0].untyped_storage().data_ptr() for x in b) or any(
            x.data_ptr() + size(x) != y.data_ptr() for x, y in zip(b, b[1:])):
        return None
    return b[0].as_strided((sum(x.shape[0] for x in b), *b[0].shape[1:]), b[0].stride())


class QuantParts(torch.Tensor):
    """A fused matrix (q/k/v, gate/up) whose parts are GGUF matrices in formats of their own, as ``llama-quantize``
    writes Q4_K_M, Q5_K_M and Q6_K files (attn_v in Q6_K beside Q4_K attn_q and attn_k in some layers): each part
    keeps its blocks and runs the integer path, the fused linear filling each part's columns
    (``peagle::linear_parts``: the bits of one fused matrix). Stands for the ``[sum of rows, in]`` matrix as a
    :class:`QuantTensor` does; detach and ``.to`` (de-quantized) are supported, anything else refused."""

    parts: list[QuantTensor]

    @staticmethod
    def __new__(cls, parts: list[QuantTensor], dtype: torch.dtype):
        return torch.Tensor._make_wrapper_subclass(cls, (sum(p.shape[0] for p in parts), parts[0].shape[1]),
                                                   dtype=dtype, device=parts[0].device)

    def __init__(self, parts: list[QuantTensor], dtype: torch.dtype):
        self.parts = list(parts)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def packed(self) -> bool:
        return all(p.packed for p in self.parts)

    @property
    def format(self) -> str:
        return "+".join(p.format for p in self.parts)

    def __repr__(self) -> str:
        return f"QuantParts({self.format}, {tuple(self.shape)}, nominal {self.dtype})"

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype or self.dtype) for p in self.parts])

    def detach(self) -> QuantParts:  # not dispatched: QuantTensor.detach
        return QuantParts(self.parts, self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:
            return args[0].detach()
        if func is torch.ops.aten._to_copy.default:
            s = args[0]
            return s.dequantize(kwargs.get("dtype") or s.dtype).to(kwargs.get("device") or s.device)
        raise NotImplementedError(f"{func} is not supported on a fused GGUF weight of several formats; load the "
                                  "target with --quantization none")


def blocks_of_weight(w: torch.Tensor) -> list[torch.Tensor]:
    """The block tensors behind a GGUF weight: a :class:`QuantTensor`'s one, a :class:`QuantParts`' each."""
    return [p.blocks for p in w.parts] if isinstance(w, QuantParts) else [w.blocks] if isinstance(w, QuantTensor) else []


def weight_bytes(w: torch.Tensor) -> int:
    """The bytes a pass reads of weight ``w`` (a GGUF weight's blocks)."""
    blocks = blocks_of_weight(w)
    return sum(b.numel() for b in blocks) if blocks else w.numel() * w.element_size()


def operand(w: torch.Tensor | None) -> torch.Tensor | None:
    """What peagle's native operators take for weight ``w``: a :class:`QuantTensor`'s blocks, else ``w`` itself."""
    return w.blocks if isinstance(w, QuantTensor) else w


def read_as_is(w: torch.Tensor) -> bool:
    """Whether peagle's linear reads ``w`` as it is (GGUF or packed blocks, or a plain contiguous matrix)."""
    return isinstance(w, QuantTensor) or (w.is_contiguous() and not w.is_mkldnn)


def quantized(w: torch.Tensor) -> bool:
    """Whether ``w`` is GGUF-quantized (a :class:`QuantTensor` of a GGUF format, not packed bf16, or
    :class:`QuantParts`)."""
    return isinstance(w, QuantParts) or (isinstance(w, QuantTensor) and w.format in FORMATS)


def formats(model: torch.nn.Module, packed: bool | None = None) -> list[str]:
    """The block formats ``model``'s weights are kept in (empty: none kept quantized); ``packed``: only those
    packed (True) or only those not (False)."""
    parts = [q for p in model.parameters() if quantized(p)
             for q in (p.parts if isinstance(p, QuantParts) else [p]) if packed is None or q.packed == packed]
    return sorted({q.format for q in parts})


def packed_matrices(model: torch.nn.Module) -> list[QuantTensor]:
    """``model``'s packed matrices (GGUF blocks and bf16 pairs; a fused matrix's parts apart) in its order: what a
    decoding step streams."""
    return [q for p in model.parameters() if isinstance(p, (QuantTensor, QuantParts))
            for q in (p.parts if isinstance(p, QuantParts) else [p]) if q.packed]


def onto_huge_pages(weights: list[QuantTensor]) -> None:
    """``weights``' blocks (CPU ones; blocks shared by several weights once) moved into one mapping backed by 2 MB
    pages (:func:`~peagle.memory.anonymous_memory`). A decoding step streams every packed weight; on 4 KB pages it
    also misses the TLB on each of ~70,000 pages a step (the default model in bf16; llama.cpp maps the file, whose
    page cache the kernel may keep in large folios): a plain step 5-9% faster, a round of 8 rows 0-3% (Zen 4).
    The same bytes, in new tensors: a block tensor packed where it lay is a view whose base (the
    file's blocks) it would keep alive if its storage were swapped in place."""
    sharing: dict[int, list[QuantTensor]] = {}  # the weights of each blocks tensor
    for w in weights:
        if w.blocks.device.type == "cpu" and w.blocks.is_contiguous() and not in_arena(w.blocks):
            sharing.setdefault(w.blocks.data_ptr(), []).append(w)
    span = lambda b: -(-b.numel() * b.element_size() // 64) * 64  # noqa: E731  (cache-line aligned)
    total = sum(span(ws[0].blocks) for ws in sharing.values())
    if total < HUGE_PAGE:
        return
    arena, at = anonymous_memory(total, huge=True), 0
    for ws in sharing.values():  # one at a time, each old one freed as it goes: the model is not held twice
        b = ws[0].blocks
        home = arena[at:at + b.numel() * b.element_size()].view(b.dtype).view(b.shape).copy_(b)
        for w in ws:
            w.blocks = home
        at += span(b)


_ARENAS: list[tuple[int, int]] = []  # the address ranges of the mappings packed loads wrote weights into


def in_arena(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a mapping a packed load made (huge pages already: nothing to move)."""
    return any(lo <= t.data_ptr() < hi for lo, hi in _ARENAS)


def pack_bf16_rows(w: torch.Tensor) -> torch.Tensor | None:
    """:func:`pack_bf16` of a float32 ``[N, K]`` matrix's values as bfloat16 (N a multiple of 16), or None if one
    is not a bfloat16 value; :data:`DEQUANT_ROWS` rows at a time, the same bytes (row groups are packed apart):
    at load no whole bf16 copy and no second float32 table stand beside the float32 table and the result."""
    n, k = w.shape
    out = torch.empty(n // GROUP, k // 2, BF16_PAIR, dtype=torch.uint8, device=w.device)
    for i in range(0, n, DEQUANT_ROWS):
        rows = w[i:i + DEQUANT_ROWS]
        r16 = rows.bfloat16()
        if not torch.equal(r16.to(rows.dtype), rows):
            return None
        out[i // GROUP:(i + rows.shape[0]) // GROUP] = pack_bf16(r16)
    return out


def integer_path(model: torch.nn.Module) -> bool:
    """Whether ``model``'s quantized weights run the integer path (packed), not float32 arithmetic."""
    return bool(formats(model, packed=True))


def bf16_dots(model: torch.nn.Module) -> bool:
    """Whether ``model``'s bfloat16 weights run the bf16 dot-product path (packed), not float32 arithmetic."""
    return any(isinstance(p, QuantTensor) and p.format == "bf16" for p in model.parameters())


# ---------------------------------------------------------------------------------------- GGUF files
class GGUFError(ValueError):
    """A GGUF file that cannot be read as the target its metadata describes."""


def _reverse_permute(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's RoPE permutation of attn_q/attn_k (as transformers does:
    per head, the interleaved halves back to rotate-half order)."""
    dim = rows // heads // 2
    return torch.arange(rows, device="cpu").reshape(heads, dim, 2).transpose(1, 2).reshape(rows)


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUFValueType


def gguf_tensors(path: Path) -> tuple[str, list[tuple[str, object, list[int], int, int]]]:
    """A GGUF file's ``general.architecture`` and its tensors as ``(name, GGMLQuantizationType, shape (the file's
    order), data offset, bytes)``, read from its header alone: the metadata values are stepped over, not parsed
    (``gguf.GGUFReader`` makes numpy views of each of a 262k-token vocabulary's strings: 690 MB at load and
    9 s on Gemma 3)."""
    import gguf

    length = struct.Struct("<Q").unpack_from
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str):
            nonlocal pos
            vals = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return vals[0] if len(vals) == 1 else vals

        def string() -> bytes:
            nonlocal pos
            n = take("Q")
            pos += n
            if pos > len(buf):
                raise ValueError("a string runs past the end of the file")
            return buf[pos - n:pos]

        def skip(vtype: int) -> None:
            nonlocal pos
            if vtype == 8:
                string()
            elif vtype == 9:
                item, count = take("IQ")
                if item in _SCALARS:
                    pos += count * struct.calcsize(_SCALARS[item])
                elif item == 8:  # a vocabulary: its lengths stepped over in one loop, not three calls a string
                    for _ in range(count):  # (a 49,152-token file's header: 89-105 -> 22-25 ms, a start's)
                        pos += 8 + length(buf, pos)[0]
                    if pos > len(buf):
                        raise ValueError("a string runs past the end of the file")
                else:
                    for _ in range(count):
                        skip(item)
            else:
                pos += struct.calcsize(_SCALARS[vtype])

        magic, version, n_tensors, n_kv = take("IIQQ")
        if magic != gguf.GGUF_MAGIC or version not in (2, 3):
            raise ValueError(f"not a little-endian GGUF v2/v3 file (magic {magic:#x}, version {version})")
        arch, alignment = "", gguf.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key, vtype = string(), take("I")
            if key == b"general.architecture" and vtype == 8:
                arch = string().decode()
            elif key == b"general.alignment" and vtype == 4:
                alignment = take("I")
                if alignment <= 0 or alignment & (alignment - 1):
                    raise ValueError(f"general.alignment {alignment} is not a positive power of two")
            else:
                skip(vtype)
        infos, seen = [], set()
        for _ in range(n_tensors):
            name = string().decode()
            if name in seen:
                raise ValueError(f"tensor {name} appears twice")
            seen.add(name)
            n_dims = take("I")
            if not 1 <= n_dims <= 4:
                raise ValueError(f"tensor {name} has {n_dims} dimensions (GGUF's are 1 to 4)")
            shape = [int(d) for d in struct.unpack_from(f"<{n_dims}Q", buf, pos)]
            pos += 8 * n_dims
            ttype, offset = take("IQ")
            infos.append((name, gguf.GGMLQuantizationType(ttype), shape, offset))
        start = -(-pos // alignment) * alignment
        end = len(buf)
    tensors = []
    for name, ttype, shape, offset in infos:
        block, size = gguf.GGML_QUANT_SIZES[ttype]
        if any(d <= 0 for d in shape) or shape[0] % block:
            raise ValueError(f"tensor {name} has shape {shape}, not whole {ttype.name} blocks of {block}")
        nbytes = int(np.prod(shape)) * size // block
        if offset % alignment or start + offset + nbytes > end:
            raise ValueError(f"tensor {name}'s data (offset {offset}, {nbytes} bytes) is misaligned or runs past the "
                             f"end of the file ({end} bytes)")
        tensors.append((name, ttype, shape, start + offset, nbytes))
    return arch, tensors


def bf16_packed(name: str, ttype, shape: list[int], to_hf: dict[str, str]) -> bool:
    """Whether a packed load with bf16 dot products packs file tensor ``name`` for them: a BF16 linear layer's
    matrix or the embedding (looked up from the packed rows, and the LM head where it is tied: one table, not a
    float32 one beside a packed one), rows in whole groups of 16, an even width (as :func:`bf16_packable` asks)."""
    return (ttype.name == "BF16" and len(shape) == 2 and shape[1] % GROUP == 0 and shape[0] % 2 == 0
            and to_hf.get(name, "").endswith(("_proj.weight", "lm_head.weight", "embed_tokens.weight")))


def packed_places(tensors: list, to_hf: dict[str, str], keepable: dict,
                  bf16: bool = False) -> dict[str, tuple[int, int]]:
    """Where a packed load puts each matrix it packs: ``{file name: (byte offset, bytes)}`` in one mapping, the parts
    of each fused group (q, k, v; gate, up) side by side in their order (fusing them is then a view), each start a
    multiple of 64 bytes. The matrices packed: kept formats, 2-D, rows in whole groups of 16; with ``bf16``, the
    linear layers' BF16 matrices too (:func:`bf16_packed`)."""
    sizes = {}
    for name, ttype, shape, _, _ in tensors:
        if ttype in keepable and len(shape) == 2 and name in to_hf and shape[1] % GROUP == 0:
            f = FORMATS[keepable[ttype]]
            if shape[0] % f.weights == 0:
                sizes[name] = shape[1] // GROUP * (shape[0] // f.weights) * f.packed_bytes
        elif bf16 and bf16_packed(name, ttype, shape, to_hf):
            sizes[name] = shape[0] * shape[1] * 2
    by_hf = {to_hf[n]: n for n in sizes}
    groups = [[by_hf[p] for p in parts] for parts in fused_groups(by_hf).values()]
    grouped = {n for g in groups for n in g}
    places, at = {}, 0
    for group in groups + [[n] for n in sizes if n not in grouped]:
        for n in group:
            places[n] = (at, sizes[n])
            at += sizes[n]
        at = -(-at // 64) * 64
    return places


def read_gguf(path: Path, names: list[str], cfg, keep: bool, dtype: torch.dtype, compute: torch.dtype,
              device: torch.device, packs: bool = False, cache: Path | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a GGUF file under the HF names ``names`` (the state dict the model expects), in HF's
    conventions (llama.cpp's q/k row order undone; Gemma's norms stored as ``1 + w`` back to ``w``, as
    transformers reads them). With ``keep``, matrices in a block format of :data:`FORMATS` stay quantized
    (:class:`QuantTensor`, nominally ``compute`` for the embedding and ``dtype`` for the linear layers, as
    :func:`set_precision` would leave them), with one line saying how many of each format, and which
    quantized tensors were not kept; every other tensor is de-quantized into ``dtype`` (floating point: the
    loader then casts what is not a linear weight), one tensor at a time. With ``packs`` (the integer path) each
    kept matrix (and, with bf16 weights and dot products, each BF16 linear matrix: :func:`bf16_packed`) is read
    once and packed straight into its place in one mapping of huge pages (:func:`packed_places`: fused parts side
    by side), the file's bytes never held beside the model: the model's memory is the file's size;
    with a ``cache`` folder too, that mapping is a cache file there (:mod:`peagle.models.packed_cache`), which the
    next load maps instead of packing."""
    import gguf

    try:
        arch_name, tensors = gguf_tensors(path)
    except Exception as e:  # a truncated or foreign file: struct, unicode and value errors of every kind
        raise GGUFError(f"corrupt or unreadable GGUF file {path}: {type(e).__name__}: {e}") from None
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    if arch is None:
        raise GGUFError(f"{path}: no or unknown general.architecture {arch_name!r} in the GGUF metadata")
    tmap = gguf.get_tensor_name_map(arch, cfg.num_layers)
    to_hf: dict[str, str] = {}
    for hf in names:
        base, _, suffix = hf.rpartition(".")
        g = tmap.get_name(base)
        if g is not None:
            to_hf[f"{g}.{suffix}"] = hf
    permute = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads} if cfg.model_type in ("llama", "mistral") else {}
    keepable = {getattr(gguf.GGMLQuantizationType, n.upper()): n for n in FORMATS} if keep else {}
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    out: dict[str, torch.Tensor] = {}
    kept: Counter[str] = Counter()
    converted: Counter[str] = Counter()
    bf16 = packs and dtype == torch.bfloat16 and table.runs_packed("packed-bf16")  # as pack_model packs them
    places = packed_places(tensors, to_hf, keepable, bf16) if packs else {}
    layout = {"permute": permute, "formats": sorted(keepable.values()), "bf16": bf16}
    cache = PackedCache.of(cache, path, tensors, places, layout, kernels.STAMP.read_text(),
                           f"{kernels.int_isa()} {kernels.bf16_isa()}") if places and cache is not None else None
    arena = cache.load() if cache is not None else None
    cached = arena is not None  # every packed matrix is in the cache: the file's copies are not read
    writer = cache.create() if places and not cached and cache is not None else None
    if places and not cached and writer is None:
        arena = anonymous_memory(max(a + n for a, n in places.values()), huge=True)  # no cache: packed in place
    # a matrix for the cache is packed into a scratch buffer and written to the file by pwrite: the page cache then
    # holds it in large folios, which map as 2 MB pages (packing through a shared mapping of the file faulted it in
    # 4 KB pages: an 8B step 14% slower)
    scratch = anonymous_memory(max(n for _, n in places.values()), huge=True) if writer is not None else None

    def home(name: str, n_rows: int, width: int) -> torch.Tensor:
        """Where matrix ``name`` is packed: its place in the arena, or the scratch buffer."""
        start, size = places[name]
        return (arena[start:start + size] if scratch is None else scratch[:size]).view(n_rows // GROUP, -1, width)

    with open(path, "rb") as fh:
        # a packed matrix is packed from the file's pages as they lie (mapped copy-on-write, never written), then
        # those pages leave the process: no copy of its bytes first (reading an 8B file's 4.2 GB into a buffer took
        # 4.4 s of a 15 s start), and no more of the file held at once than one matrix
        pages = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if places and not cached else None
        mapped = np.frombuffer(pages, dtype=np.uint8) if pages is not None else None

        def packed(name: str, offset: int, nbytes: int, blocks: torch.Tensor) -> None:
            """Matrix ``name`` packed: written to the cache where one is being made; its file pages released."""
            if writer is not None:
                writer.write(places[name][0], blocks)
            first = offset // mmap.PAGESIZE * mmap.PAGESIZE
            pages.madvise(mmap.MADV_DONTNEED, first, offset + nbytes - first)

        for name, ttype, shape, offset, nbytes in tensors:
            hf = to_hf.get(name)
            if hf is None:
                raise GGUFError(f"{path}: unexpected tensor {name!r} for a {cfg.model_type} model")
            n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if cached and name in places:
                continue  # made from the cache below
            # a packed matrix from the file's mapped pages; any other tensor read into a buffer of its own
            if name in places:  # gguf_tensors checked that it lies inside the file
                data = mapped[offset:offset + nbytes]
            else:
                data = np.empty(nbytes, dtype=np.uint8)
                fh.seek(offset)
                if fh.readinto(data) != nbytes:
                    raise GGUFError(f"{path}: truncated: tensor {name} ends past the end of the file")
            data = data.reshape(n_rows, -1)
            order = next((_reverse_permute(n_rows, h).numpy() for k, h in permute.items() if f".{k}." in hf), None)
            if name in places and ttype not in keepable:  # a BF16 matrix for the bf16 dot products
                w = torch.from_numpy(data if order is None else data[order]).view(torch.bfloat16)
                packed(name, offset, nbytes, pack_bf16(w, home(name, n_rows, BF16_PAIR)))
                continue
            if ttype in keepable and len(shape) == 2:
                f = FORMATS[keepable[ttype]]
                if shape[0] % f.weights or data.shape[1] != shape[0] // f.weights * f.block_bytes:
                    raise GGUFError(f"{path}: tensor {name} has {data.shape[1]} bytes a row for {f.name} {tuple(shape)}")
                blocks = blocks_of(data if order is None else data[order], f.name)
                if name in places:
                    packed(name, offset, nbytes, pack(blocks, home(name, n_rows, f.packed_bytes)))
                    continue
                out[hf] = QuantTensor(blocks, compute if hf.endswith("embed_tokens.weight") else dtype)
                kept[ttype.name] += 1
                continue
            if ttype not in plain:
                converted[ttype.name] += 1
            try:
                w = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(data, ttype)))
            except (NotImplementedError, ValueError) as e:
                raise GGUFError(f"{path}: cannot read tensor {name} ({ttype.name}): {e}") from None
            w = w.reshape(list(reversed(shape))) if len(shape) > 1 else w.reshape(-1)
            if order is not None:
                w = w[torch.from_numpy(order)]
            if cfg.model_type == "gemma3_text" and hf.endswith("norm.weight"):
                w = w - 1  # llama.cpp stores Gemma's norms as 1 + w
            out[hf] = w.to(device=device, dtype=dtype if w.is_floating_point() else None)
        if pages is not None:
            data = blocks = mapped = w = None  # the last views of the mapping
            pages.close()
    if writer is not None:
        arena = writer.commit()  # the cache, mapped (None where it could not be kept: packed in memory again)
        if arena is None:
            return read_gguf(path, names, cfg, keep, dtype, compute, device, packs)
    if arena is not None:
        _ARENAS.append((arena.data_ptr(), arena.data_ptr() + arena.numel()))
    for name, ttype, shape, _, _ in tensors:  # every packed matrix, a view of its place
        if name in places:
            hf, n_rows = to_hf[name], int(np.prod(shape[1:]))
            start, size = places[name]
            width = BF16_PAIR if ttype not in keepable else FORMATS[keepable[ttype]].packed_bytes
            out[hf] = QuantTensor(arena[start:start + size].view(n_rows // GROUP, -1, width),
                                  compute if hf.endswith("embed_tokens.weight") else dtype)
            kept[ttype.name] += ttype in keepable
    dropped = unify_fused(out, fused_groups(out), dtype)
    kept.subtract(dropped)
    if keep:
        def count(c: Counter) -> str:
            return ", ".join(f"{n} {t}" for t, n in c.most_common() if n > 0)

        line = f"peagle: {path.name}: kept quantized: {count(kept) or 'none'}"
        if converted:
            line += (f"; de-quantized to {str(dtype).removeprefix('torch.')}: {count(converted)} (peagle keeps "
                     f"{', '.join(n.upper() for n in FORMATS)} matrices quantized)")
        if dropped:
            line += (f"; de-quantized to {str(dtype).removeprefix('torch.')}: {count(dropped)} (fused q/k/v or "
                     "gate/up beside float matrices)")
        print(line, file=sys.stderr)
    return out
