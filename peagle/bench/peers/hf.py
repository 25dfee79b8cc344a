"""HF transformers as a peer: ``generate`` greedy (``min_new_tokens`` = ``max_new_tokens``, so EOS is
masked rather than ending the request), its forward into a ``DynamicCache`` for prefill and passes.
It runs in the engine's weight dtype (HF has one dtype for weights and arithmetic)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peagle.bench.peers import PRECISION, Decode, Peer, time_once


def first_token_streamer():
    from transformers.generation.streamers import BaseStreamer

    class FirstTokenTimer(BaseStreamer):
        """``generate`` puts the prompt first, then each new token: the second put is the first token."""

        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2 and self.first is None:
                self.first = time.perf_counter()

        def end(self):
            pass

    return FirstTokenTimer()


@dataclasses.dataclass(kw_only=True)
class HFPeer(Peer):
    model: Any
    torch_threads: int

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prepare(self) -> None:
        torch.set_num_threads(self.torch_threads)

    def decode(self, ids: list[int], n: int) -> Decode:
        x = torch.tensor([ids], device=self.device)
        streamer = first_token_streamer()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n, pad_token_id=self.model.config.eos_token_id,
                                      streamer=streamer)
            t1 = time.perf_counter()
        return Decode(tokens=out[0, len(ids):].tolist(), ttft_s=streamer.first - t0, elapsed_s=t1 - t0)

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
