"""Which kernel runs an operation: one table, as ggml-cpu's ``type_traits_cpu[]`` maps a weight type to its
``vec_dot``. Every place that runs an operation peagle has a native kernel for asks :func:`pick` (or :func:`run`)
and does not test conditions of its own; the load path asks :func:`on_device` (does the library run this
device's passes: weights kept in their blocks, float32 activations).

An :class:`Entry` per (operation, weight format, instruction set) holds its kernel and its one predicate; the
entries of an (operation, format) are tried in order and the last is torch's, which always holds. The native
entries name which of the library's paths runs (``cpu``: the float path, ``cpu-int``: the integer path of packed
GGUF blocks, ``cpu-bf16``: bf16 dot products of packed bf16 pairs); the library picks that path's instruction set
at run time (AMX, AVX-512, AVX2, scalar: :meth:`Entry.runs` names it). Torch kernels that are code of a higher
layer (the tree's verification, the drafts' expansion, a GGUF weight's row lookup) are given to their entry by
the module that writes them (:func:`provides`), so this module imports nothing above ``peagle.kernels``.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from peagle import kernels
from peagle.kernels.blocks import BLOCK_SIZES

HAVE_TRITON = importlib.util.find_spec("triton") is not None  # found, not imported: CPU runs never need it

NATIVE = ("cpu", "cpu-int", "cpu-bf16")
_provided: dict[tuple[str, str, str], Callable] = {}


@dataclass(frozen=True)
class Entry:
    """One row of the table: operation ``op`` on weights of format ``format`` (``any`` for operations without
    weights) runs ``kernel`` on ``isa`` (one of :data:`NATIVE`, ``triton`` or ``torch``) where ``when`` holds of
    the operation's arguments. ``kernel`` None: given by :func:`provides`, or (``attention``,
    ``decoder_layers``, ``draft``) a path its caller runs, the entry saying only whether it may."""

    op: str
    format: str
    isa: str
    when: Callable[..., bool]
    kernel: Callable | None = None

    @property
    def native(self) -> bool:
        return self.isa in NATIVE

    def runs(self) -> str:
        """The instruction set this entry runs on here: the library's choice for its path, or ``torch``/``triton``."""
        path = {"cpu": kernels.isa, "cpu-int": kernels.int_isa, "cpu-bf16": kernels.bf16_isa}.get(self.isa)
        return path() if path else self.isa

    def __call__(self, *args):
        fn = self.kernel or _provided.get((self.op, self.format, self.isa))
        if fn is None:
            raise RuntimeError(f"no kernel for {self.op} on {self.format} weights ({self.isa}): its caller runs it")
        return fn(*args)


def provides(op: str, isa: str, *formats: str) -> Callable[[Callable], Callable]:
    """Decorator: ``fn`` is the kernel of ``op``'s ``isa`` entries for ``formats`` (``any`` where none given)."""
    def give(fn: Callable) -> Callable:
        for fmt in formats or ("any",):
            if (op, fmt) not in TABLE or not any(e.isa == isa for e in TABLE[op, fmt]):
                raise KeyError(f"the kernel table has no entry ({op}, {fmt}, {isa})")
            _provided[op, fmt, isa] = fn
        return fn
    return give


def weight_format(w: torch.Tensor) -> str:
    """The table's key for weight ``w``: ``parts`` (several GGUF formats fused), ``gguf`` (a file's blocks),
    ``packed`` (blocks packed for the integer path), ``packed-bf16`` (bf16 pairs packed for bf16 dot products),
    ``mkldnn`` (oneDNN's blocked layout), or ``float`` (a plain matrix, any float dtype)."""
    if hasattr(w, "parts"):
        return "parts"
    blocks = getattr(w, "blocks", None)
    if blocks is not None:
        size, sizes = blocks.shape[-1], BLOCK_SIZES
        return "packed-bf16" if size == sizes.bf16_pair else "packed" if size in sizes.packed else "gguf"
    return "mkldnn" if w.is_mkldnn else "float"


def on_device(device: torch.device, head_dim: int | None = None, group: int | None = None) -> bool:
    """Whether the library runs ``device``'s passes (heads within its limits where given): what the load path
    stores and computes in follows (float32 activations, GGUF blocks kept, a float16 KV cache)."""
    return kernels.native(device, head_dim, group)


def runs_packed(fmt: str) -> bool:
    """Whether the library has a path here for weights packed as ``fmt`` (``packed``: the integer path,
    ``packed-bf16``: bf16 dot products): what the loader packs for."""
    return any(e.native and e.runs() != "none" for e in TABLE["linear", fmt])


# The predicates: each written once, shared by the entries it gates.
def _rows(x: torch.Tensor, *_) -> bool:
    """Activations the kernels take: float32 on the CPU, no gradient wanted, the library loaded."""
    return kernels.native(x)


def _rows_2d(x: torch.Tensor, *_) -> bool:
    return x.dim() == 2 and kernels.native(x)


def _rows_contiguous(x: torch.Tensor, *_) -> bool:
    return x.dim() == 2 and x.is_contiguous() and kernels.native(x)


def _plain(x: torch.Tensor, w: torch.Tensor, *_) -> bool:
    return w.is_contiguous() and kernels.native(x)


def _tensor_device(t: torch.Tensor, *_) -> bool:
    return kernels.native(t.device)


def _attention(x: torch.Tensor, cache, meta, head_dim: int, group: int) -> bool:
    """peagle's attention kernel: a paged KV cache, a layout it reads (``meta.kernel_ok``), heads within limits."""
    return getattr(cache, "paged", False) and getattr(meta, "kernel_ok", False) and kernels.native(x, head_dim, group)


def _layers(x: torch.Tensor, caches: list, meta, head_dim: int, group: int, ready: Callable[[], bool]) -> bool:
    """Every layer in one call: rows the attention kernel takes whole, and the model's layers stackable (``ready``,
    asked last: it may list the weights)."""
    return x.dim() == 2 and _attention(x, caches[0], meta, head_dim, group) and not meta.long_groups and ready()


def _draft(taps: torch.Tensor, caches: list, longest: int, head_dim: int, group: int,
           ready: Callable[[], bool]) -> bool:
    """A whole drafting pass in one call: its spans the attention kernel takes whole, the drafter's own pass
    with weights the kernels read as they are (``ready``)."""
    return (kernels.native(taps, head_dim, group) and getattr(caches[0], "paged", False)
            and longest <= kernels.limits().span_rows and ready())


def _cuda_triton(ids: torch.Tensor, *_) -> bool:
    return ids.is_cuda and HAVE_TRITON


def _always(*_) -> bool:
    return True


# The torch kernels this layer writes.
def _mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x @ w.t()
    return out if bias is None else out + bias


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dim() == 2 and x.is_contiguous():  # decoding's rows as they come (three operators fewer)
        return torch.ops.peagle.rms_norm(x, w, eps)
    return torch.ops.peagle.rms_norm(x.reshape(-1, x.shape[-1]).contiguous(), w, eps).view(x.shape)


def _add_rms_norm_torch(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    h = residual + x
    return run("rms_norm", h, w, eps), h


def _move_rows_torch(caches: list, src: torch.Tensor, dst: torch.Tensor) -> None:
    for c in caches:
        c.k.index_copy_(0, dst, c.k.index_select(0, src))
        c.v.index_copy_(0, dst, c.v.index_select(0, src))


def _linear_entries(fmt: str) -> tuple[Entry, ...]:
    native = {"parts": Entry("linear", fmt, "cpu", _rows, lambda x, w, b=None: torch.ops.peagle.linear_parts(
                  x, [p.blocks for p in w.parts], b)),
              "gguf": Entry("linear", fmt, "cpu", _rows, lambda x, w, b=None: torch.ops.peagle.linear(x, w.blocks, b)),
              "packed": Entry("linear", fmt, "cpu-int", _rows,
                              lambda x, w, b=None: torch.ops.peagle.linear(x, w.blocks, b)),
              "packed-bf16": Entry("linear", fmt, "cpu-bf16", _rows,
                                   lambda x, w, b=None: torch.ops.peagle.linear(x, w.blocks, b)),
              "float": Entry("linear", fmt, "cpu", _plain, lambda x, w, b=None: torch.ops.peagle.linear(x, w, b))}
    if fmt == "mkldnn":
        fallback = Entry("linear", fmt, "torch", _always,
                         lambda x, w, b=None: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""))
    elif fmt == "float":
        fallback = Entry("linear", fmt, "torch", _always, _mm)
    else:  # de-quantized for the call
        fallback = Entry("linear", fmt, "torch", _always, lambda x, w, b=None: _mm(x, w.dequantize(x.dtype), b))
    return ((native[fmt],) if fmt in native else ()) + (fallback,)


def _dequantize_rows_entries(fmt: str) -> tuple[Entry, ...]:
    return (Entry("dequantize_rows", fmt, "cpu", lambda w, ids: kernels.native(w.blocks.device),
                  lambda w, ids: torch.ops.peagle.dequantize_rows(w.blocks, ids)),
            Entry("dequantize_rows", fmt, "torch", _always))


TABLE: dict[tuple[str, str], tuple[Entry, ...]] = {
    **{("linear", f): _linear_entries(f) for f in ("parts", "gguf", "packed", "packed-bf16", "mkldnn", "float")},
    **{("dequantize_rows", f): _dequantize_rows_entries(f) for f in ("gguf", "packed", "packed-bf16")},
    ("rms_norm", "any"): (Entry("rms_norm", "any", "cpu", _rows, _rms_norm),
                          Entry("rms_norm", "any", "torch", _always,
                                lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps))),
    ("add_rms_norm", "any"): (
        Entry("add_rms_norm", "any", "cpu", _rows_2d, lambda x, r, w, eps: torch.ops.peagle.add_rms_norm(
            x.contiguous(), r.contiguous(), w, eps)),
        Entry("add_rms_norm", "any", "torch", _always, _add_rms_norm_torch)),
    ("silu_mul", "any"): (Entry("silu_mul", "any", "cpu", _rows_2d, lambda g, inter: torch.ops.peagle.silu_mul(g)),
                          Entry("silu_mul", "any", "torch", _always,
                                lambda g, inter: F.silu(g[..., :inter]) * g[..., inter:])),
    ("greedy", "any"): (Entry("greedy", "any", "cpu", _rows_contiguous, lambda logits: _greedy_native(logits)),
                        Entry("greedy", "any", "torch", _always,
                              lambda logits: (logits.argmax(-1), logits.isfinite().all(-1)))),
    ("argmax", "any"): (Entry("argmax", "any", "cpu", _rows_contiguous,
                              lambda logits: torch.ops.peagle.argmax(logits)[1]),
                        Entry("argmax", "any", "torch", _always, lambda logits: logits.argmax(-1))),
    ("accept_paths", "any"): (
        Entry("accept_paths", "any", "cpu", _tensor_device, lambda y, tb: torch.ops.peagle.accept_paths(
            y.long().contiguous(), tb.tokens, tb.parents, tb.depths, tb.lineage)),
        Entry("accept_paths", "any", "torch", _always)),
    ("expand", "any"): (Entry("expand", "any", "triton", _cuda_triton), Entry("expand", "any", "cpu", _tensor_device),
                        Entry("expand", "any", "torch", _always)),
    ("move_rows", "any"): (
        Entry("move_rows", "any", "cpu", lambda caches, src, dst: kernels.native(src.device),
              lambda caches, src, dst: torch.ops.peagle.move_rows([c.k for c in caches] + [c.v for c in caches],
                                                                   src, dst)),
        Entry("move_rows", "any", "torch", _always, _move_rows_torch)),
    ("attention", "any"): (Entry("attention", "any", "cpu", _attention), Entry("attention", "any", "torch", _always)),
    ("decoder_layers", "any"): (Entry("decoder_layers", "any", "cpu", _layers),
                                Entry("decoder_layers", "any", "torch", _always)),
    ("draft", "any"): (Entry("draft", "any", "cpu", _draft), Entry("draft", "any", "torch", _always)),
}
_WEIGHTED = {"linear": 1, "dequantize_rows": 0}  # the argument whose format keys the operation's entries


def _greedy_native(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, tokens = torch.ops.peagle.argmax(logits)
    return tokens, values.isfinite()


def pick(op: str, *args) -> Entry:
    """The entry that runs ``op`` on these arguments (its kernel's): the first of its (operation, format) row whose
    predicate holds."""
    i = _WEIGHTED.get(op)
    for e in TABLE[op, "any" if i is None else weight_format(args[i])]:
        if e.when(*args):
            return e
    raise AssertionError(f"the kernel table's {op} row ends without torch's entry")


def run(op: str, *args):
    """``op`` on ``args``, by the kernel :func:`pick` chooses."""
    return pick(op, *args)(*args)
