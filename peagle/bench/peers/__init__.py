"""The systems ``peagle.bench.baseline`` compares, one module each behind one interface, so the
orchestration (interleaving, rotating order, medians, tables) is written once for all of them:

* :mod:`.engine`: peagle's engine, one peer per method (plain decoding and each shipped head);
* :mod:`.hf`: HF transformers ``generate``, the reference the engine's tokens are checked against;
* :mod:`.llamacpp`: llama.cpp in-process (llama-cpp-python), one peer per GGUF precision: the CPU anchor;
  the same module finds its GGUF files and its own binaries (``llama-bench``, ``llama-server``), which
  ``bench baseline``'s llama-bench section and ``bench serving`` run.

Every peer decodes greedily exactly ``n`` new tokens (EOS ignored) from token ids it is given (the
engine's tokenizer and chat template for all), so the peers' tokens and rates compare one to one.
"""
from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

# the weights' precision in llama.cpp's GGUF names, so each peagle row finds its llama.cpp peer
PRECISION = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


class PeerError(RuntimeError):
    """A peer broke the interface (wrong token count, times out of order): its figures would mislead."""


@dataclasses.dataclass
class Decode:
    """One greedy request, timed from the call: the first token after ``ttft_s``, the last after ``elapsed_s``."""
    tokens: list[int]
    ttft_s: float
    elapsed_s: float
    acceptance_length: float | None = None   # speculative peers: tokens per target pass


@dataclasses.dataclass(kw_only=True)
class Peer(abc.ABC):
    name: str        # its key in the tables and the JSON: hf, none, parallel, llamacpp-F32, ...
    system: str      # "peagle", "HF transformers", "llama.cpp": ratios pair peagle with llama.cpp
    label: str       # its row in the tables
    precision: str   # the weights' precision, in :data:`PRECISION`'s names (llama.cpp's also Q4_1, Q8_0)
    threads: str     # the pool it runs on, for the tables ("torch 2", "llama.cpp 2")
    note: str = ""   # how it is configured where that is not its defaults (said under the table)

    def prepare(self) -> None:
        """Size the thread pool this peer runs on: peers size torch's pool differently, so the
        orchestration calls this (after a pause) whenever it switches peers."""

    @abc.abstractmethod
    def decode(self, ids: list[int], n: int) -> Decode:
        """Greedy decoding of exactly ``n`` new tokens after ``ids``, EOS ignored."""


@runtime_checkable
class Prefills(Protocol):
    """A peer that can time a prefill alone (``ids`` into an empty cache, up to its first token):
    those join the prefill table."""

    def prefill_s(self, ids: list[int]) -> float: ...


def checked_decode(peer: Peer, ids: list[int], n: int) -> Decode:
    """``peer.decode``, held to the interface: a peer that stops early (at EOS, say) or mistimes
    its first token would be compared on other work than its peers."""
    d = peer.decode(ids, n)
    if len(d.tokens) != n:
        raise PeerError(f"{peer.name} gave {len(d.tokens)} tokens, {n} asked for")
    if not 0 < d.ttft_s <= d.elapsed_s:
        raise PeerError(f"{peer.name}: first token after {d.ttft_s} s, last after {d.elapsed_s} s")
    return d


def time_once(fn: Callable[[], object], device: torch.device | None = None) -> float:
    """Seconds ``fn`` takes, the device's queued work included."""
    t0 = time.perf_counter()
    fn()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
