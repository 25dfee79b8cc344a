"""An engine factory for the server's fault tests. The engine runs in its own process, so a test
cannot patch it from outside: this engine carries its faults from the start, each one triggered
by a marker in a request's prompt text, and behaves normally for every other request."""
from __future__ import annotations

import time

import torch

from peagle.engine.llm_engine import LLMEngine

RAISE, NAN, SLOW = "inject-raise", "inject-nan", "inject-slow"


def faulty_engine(**kwargs) -> LLMEngine:
    engine = LLMEngine.from_pretrained(**kwargs)
    tok = engine.tokenizer
    marked: dict[str, str] = {}   # request id -> its prompt's text

    def running(marker: str) -> bool:
        for seq in engine.running:
            if seq.request_id not in marked:
                marked[seq.request_id] = tok.decode(seq.prompt_ids)
        return any(marker in marked[s.request_id] for s in engine.running)

    real_propose, real_decode, real_step = engine.runner.propose, engine.target.decode, engine.step
    proposals = [0]

    def propose(*args):  # raises in the middle of the third step that drafts for a marked request
        if running(RAISE):
            proposals[0] += 1
            if proposals[0] % 3 == 0:
                raise RuntimeError("injected fault")
        return real_propose(*args)

    def decode(*args):  # the target's pass (its argmax left to the engine where the logits are replaced)
        logits, taps, best = real_decode(*args)
        return (torch.full_like(logits, float("nan")), taps, None) if running(NAN) else (logits, taps, best)

    def step():  # a marked request takes seconds: still running when its client goes
        if running(SLOW):
            time.sleep(0.03)
        return real_step()

    engine.runner.propose, engine.target.decode, engine.step = propose, decode, step
    return engine
