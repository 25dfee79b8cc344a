"""HF transformers as a peer: ``generate`` greedy (``min_new_tokens`` = ``max_new_tokens``, so EOS is
masked rather than ending the request), its forward into a ``DynamicCache`` for prefill and passes.
It runs in the engine's weight dtype (HF has one dtype for weights and arithmetic). ``bench sweep``
runs its ``generate`` on whole workloads too, ending at EOS, plain and with prompt lookup."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peagle.bench.peers import PRECISION, Decode, Peer, time_once


def token_streamer(on_token: Callable[[float], None]):
    """A ``generate`` streamer that calls ``on_token(time)`` as each step's new tokens come (``generate``
    puts the prompt first: that put is not a token)."""
    from transformers.generation.streamers import BaseStreamer

    class TokenTimer(BaseStreamer):
        def __init__(self):
            self.prompt_seen = False

        def put(self, value):
            if self.prompt_seen:
                on_token(time.perf_counter())
            self.prompt_seen = True

        def end(self):
            pass

    return TokenTimer()


@dataclasses.dataclass(kw_only=True)
class HFPeer(Peer):
    model: Any
    torch_threads: int

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prepare(self) -> None:
        torch.set_num_threads(self.torch_threads)

    def generate(self, ids: list[int], n: int, streamer=None, exact: bool = False,
                 prompt_lookup: int | None = None) -> list[int]:
        """Greedy ``generate``: up to ``n`` new tokens after ``ids`` (``exact``: ``n``, EOS masked); with
        ``prompt_lookup``, HF's prompt-lookup decoding, drafting that many tokens."""
        x = torch.tensor([ids], device=self.device)
        extra = {"min_new_tokens": n} if exact else {}
        if prompt_lookup:
            extra["prompt_lookup_num_tokens"] = prompt_lookup
        out = self.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                  pad_token_id=self.model.config.eos_token_id, streamer=streamer, **extra)
        return out[0, len(ids):].tolist()

    def decode(self, ids: list[int], n: int) -> Decode:
        times: list[float] = []
        streamer = token_streamer(times.append)
        with torch.inference_mode():
            t0 = time.perf_counter()
            tokens = self.generate(ids, n, streamer, exact=True)
            t1 = time.perf_counter()
        return Decode(tokens=tokens, ttft_s=times[0] - t0, elapsed_s=t1 - t0)

    def prefill_s(self, ids: list[int]) -> float:
        """Its forward over the prompt into a fresh DynamicCache, logits of the last row only."""
        from transformers import DynamicCache

        x = torch.tensor([ids], device=self.device)
        with torch.inference_mode():
            return time_once(lambda: self.model(x, past_key_values=DynamicCache(config=self.model.config),
                                                use_cache=True, logits_to_keep=1), self.device)

    @contextmanager
    def verify_timer(self, ctx: list[int], new_ids: list[int]) -> Iterator[Callable[[int], float]]:
        """Its forward over n tokens after ``ctx`` in a DynamicCache, cropped back after each pass."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            self.model(torch.tensor([ctx], device=self.device), past_key_values=cache, use_cache=True,
                       logits_to_keep=1)

        def one_pass(n: int) -> float:
            x = torch.tensor([new_ids[:n]], device=self.device)
            with torch.inference_mode():
                t = time_once(lambda: self.model(x, past_key_values=cache, use_cache=True, logits_to_keep=0),
                              self.device)
            cache.crop(-n)
            return t

        yield one_pass


def load(path, dtype: torch.dtype, device: torch.device, threads: int) -> HFPeer:
    """The target's HF checkpoint in ``dtype`` on ``device``, run on ``threads`` torch threads."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    return HFPeer(name="hf", system="HF transformers", label="HF transformers `generate`", precision=PRECISION[dtype],
                  threads=f"torch {threads}", model=model, torch_threads=threads)
