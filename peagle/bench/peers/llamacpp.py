"""llama.cpp in-process as a peer (llama-cpp-python): the default model's GGUF in one precision
(:func:`peagle.bench.llamacpp.gguf_file`), fed the engine's token ids, greedy token by token as
its own examples decode; EOS is a token like any other, as with the engine's ``ignore_eos``."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from peagle.bench.llamacpp import config_note, gguf_file, safe_batch
from peagle.bench.peers import Decode, Peer


@dataclasses.dataclass(kw_only=True)
class LlamaCppPeer(Peer):
    llm: Any   # llama_cpp.Llama

    def first_token(self, ids: list[int]) -> int:
        """The prompt into an empty cache, then its greedy token."""
        self.llm.reset()
        self.llm.eval(ids)
        return self.llm.sample(temp=0.0)

    def decode(self, ids: list[int], n: int) -> Decode:
        t0 = time.perf_counter()
        tokens = [self.first_token(ids)]
        ttft = time.perf_counter() - t0
        while len(tokens) < n:
            self.llm.eval(tokens[-1:])
            tokens.append(self.llm.sample(temp=0.0))
        return Decode(tokens=tokens, ttft_s=ttft, elapsed_s=time.perf_counter() - t0)

    def prefill_s(self, ids: list[int]) -> float:
        t0 = time.perf_counter()
        self.first_token(ids)
        return time.perf_counter() - t0


def load(kind: str, threads: int, n_ctx: int) -> LlamaCppPeer:
    """llama.cpp on the ``kind`` GGUF (converted once from the shipped file), ``threads`` threads for
    decode and prompt alike, a context of ``n_ctx`` tokens (the longest prompt and its tokens must fit)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_file(kind)), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=safe_batch(kind) or 512, verbose=False)
    note = config_note(kind)
    return LlamaCppPeer(name=f"llamacpp-{kind}", system="llama.cpp", label=f"llama.cpp `{kind}`", precision=kind,
                        threads=f"llama.cpp {threads}", note="" if note == "defaults" else note, llm=llm)
