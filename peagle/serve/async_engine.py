"""Runs the (single-threaded) engine in a background thread and streams tokens to asyncio callers.

All engine calls, the tokenizer's included, happen on that thread: requests and aborts are handed
over through a queue, and each step's new tokens and text are posted back to the caller's event
loop. A step that raises fails the requests it was running (their callers get an
:class:`EngineError`, their KV blocks are freed) and the loop goes on with the others.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading

from dataclasses import dataclass
from typing import AsyncIterator

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams, TokenLogprob
from peagle.engine.sequence import Sequence
from peagle.serve.metrics import Metrics

log = logging.getLogger("peagle.serve")


class QueueFullError(RuntimeError):
    pass


class EngineError(RuntimeError):
    """The engine failed while running the request (not the request's fault)."""


@dataclass
class Delta:
    """What one engine step added to a request."""
    token_ids: list[int]
    text: str            # the new text: a stream's pieces add up to the final, stop-cut text
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list[TokenLogprob]   # one per new token, when asked for
    token_texts: dict[int, str]    # the text of every token named in ``logprobs``


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue: int = 256, metrics: Metrics | None = None):
        self.engine, self.max_queue = engine, max_queue
        self.metrics = metrics or Metrics()
        self._inbox: queue.Queue = queue.Queue()
        # request id -> (its caller's loop, its queue, tokens sent, characters sent)
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int, int]] = {}
        self._pending = 0  # accepted, not yet finished; bounded by max_queue + max_num_seqs
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peagle-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=10)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> AsyncIterator[Delta]:
        """Yield a :class:`Delta` per step that produced tokens; aborts the request if the caller stops early."""
        with self._lock:
            if self._pending >= self.max_queue + self.engine.cfg.max_num_seqs:
                raise QueueFullError("the request queue is full")
            self._pending += 1
        loop = asyncio.get_running_loop()
        out: asyncio.Queue = asyncio.Queue()
        done = False
        self._streams[request_id] = (loop, out, 0, 0)
        self._inbox.put(("add", request_id, prompt_ids, params))
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    done = True
                    return
        finally:
            if not done:
                self._inbox.put(("abort", request_id))

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while not self._stop.is_set():
            block = not self.engine.has_unfinished()
            try:
                while True:
                    msg = self._inbox.get(block=block, timeout=0.5 if block else None)
                    block = False
                    if msg is None:
                        return
                    self._handle(msg)
            except queue.Empty:
                pass
            if self.engine.has_unfinished():
                try:
                    for seq in self.engine.step().updated:
                        self._post(seq)
                except Exception as e:
                    log.exception("an engine step failed; failing the requests it ran")
                    self._fail_running(EngineError(f"the engine failed while running this request: {e}"))
            self.metrics.observe_step(self.engine)

    def _fail_running(self, error: EngineError) -> None:
        for seq in list(self.engine.running):
            self.engine.abort(seq.request_id)  # frees its blocks
            self.metrics.observe_finished(seq)
            self._finish_stream(seq.request_id, error)

    def _handle(self, msg) -> None:
        if msg[0] == "add":
            _, rid, prompt_ids, params = msg
            try:
                self.engine.add_request(prompt_ids, params, rid)
            except Exception as e:  # refused: tell the caller
                self._finish_stream(rid, e)
        elif msg[0] == "abort":
            for seq in list(self.engine.running) + list(self.engine.waiting):
                if seq.request_id == msg[1]:
                    self.engine.abort(msg[1])
                    self.metrics.observe_finished(seq)
            self._finish_stream(msg[1], None)

    def _post(self, seq: Sequence) -> None:
        entry = self._streams.get(seq.request_id)
        if entry is None:
            return
        loop, out, sent, chars = entry
        n = len(seq.output_ids)
        text = seq.text if seq.finished else seq.detok.stable if seq.detok is not None else ""
        logprobs = seq.logprobs[sent:n]
        tok = self.engine.tokenizer
        ids = {i for lp in logprobs for i in [lp.token_id, *(t for t, _ in lp.top)]}
        texts = {i: tok.decode([i]) for i in ids} if tok is not None else {}
        delta = Delta(seq.output_ids[sent:], text[chars:], seq.finish_reason, len(seq.prompt_ids), n, logprobs, texts)
        self._streams[seq.request_id] = (loop, out, n, len(text))
        if seq.finished:  # counted out before the caller hears of it: it may send its next request at once
            self.metrics.observe_finished(seq)
            self._finish_stream(seq.request_id, None)
        _send(loop, out, delta)

    def _finish_stream(self, rid: str, error: BaseException | None) -> None:
        entry = self._streams.pop(rid, None)
        if entry is None:
            return
        with self._lock:
            self._pending -= 1
        if error is not None:
            loop, out, *_ = entry
            _send(loop, out, error)


def _send(loop: asyncio.AbstractEventLoop, out: asyncio.Queue, item) -> None:
    try:
        loop.call_soon_threadsafe(out.put_nowait, item)
    except RuntimeError:  # the caller's event loop has closed (the server is shutting down)
        pass
