"""The server's side of the engine: starts the engine core process (:mod:`peagle.serve.engine_core`)
and streams its tokens to asyncio callers.

Requests and aborts go to the engine through a sender thread (a large prompt never blocks the event
loop on a full pipe); a reader thread takes each step's outputs, hands them to the callers' event
loop in one wake-up per step (a request that is not streamed hears only of its end: the engine
holds its output until then) and moves the engine's figures into Prometheus. This process runs no torch op: the engine process's main thread
is the only one that does.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
from typing import AsyncIterator

from peagle.engine.sampling import SamplingParams
from peagle.request_checks import RequestError
from peagle.serve.engine_core import Delta, EngineInfo, EngineSpec, Failure, run_engine_core
from peagle.serve.metrics import Metrics

__all__ = ["AsyncEngine", "Delta", "EngineError", "EngineSpec", "QueueFullError"]


class QueueFullError(RuntimeError):
    pass


class EngineError(RuntimeError):
    """The engine failed while running the request (not the request's fault)."""


class AsyncEngine:
    def __init__(self, spec: EngineSpec, max_queue: int = 256, metrics: Metrics | None = None):
        """Start the engine process and wait until its engine is built; its error, if it cannot be."""
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads or CUDA state
        inbox, self._to_engine = ctx.Pipe(duplex=False)
        self._from_engine, outbox = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=run_engine_core, args=(inbox, outbox, spec), name="peagle-engine",
                                 daemon=True)
        self._proc.start()
        inbox.close()   # only the engine holds these ends: when it dies, our reads see EOF
        outbox.close()
        try:
            kind, info = self._from_engine.recv()
        except EOFError:
            self._proc.join()
            raise RuntimeError(f"the engine process died while starting (exit code {self._proc.exitcode})") from None
        if kind == "failed":
            self._proc.join()
            raise RuntimeError(info)
        self.info: EngineInfo = info
        # request id -> (its caller's event loop, its queue); popped at the request's final output
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._dead = False
        self._outgoing: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="peagle-engine-reader", daemon=True)
        self._sender = threading.Thread(target=self._send, name="peagle-engine-sender", daemon=True)
        self._reader.start()
        self._sender.start()

    @property
    def alive(self) -> bool:
        return not self._dead and self._proc.is_alive()

    def close(self) -> None:
        """Stop the engine process (it finishes its step first), or end it if it does not stop."""
        self._outgoing.put(None)
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._reader.join(timeout=5)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                       stream: bool = True) -> AsyncIterator[Delta]:
        """Yield a :class:`Delta` per step that produced tokens (without ``stream``, one: the whole
        output); aborts the request if the caller stops early."""
        with self._lock:  # the reader fails every stream it finds when the engine dies: none may come later
            if self._dead:
                raise EngineError("the engine process has stopped")
            if len(self._streams) >= self.max_queue + self.info.max_num_seqs:
                raise QueueFullError("the request queue is full")
            out: asyncio.Queue = asyncio.Queue()
            self._streams[request_id] = (asyncio.get_running_loop(), out)
        self._outgoing.put(("add", request_id, prompt_ids, params, stream))
        done = False
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    done = True
                    return
        finally:
            if not done:
                self._outgoing.put(("abort", request_id))

    # ------------------------------------------------------------------ the two threads
    def _send(self) -> None:
        while True:
            msg = self._outgoing.get()
            try:
                self._to_engine.send(msg)
            except OSError:  # the engine has gone; the reader fails what was running
                return
            if msg is None:
                return

    def _read(self) -> None:
        try:
            while True:
                _, outputs, snapshot = self._from_engine.recv()
                posts: dict[asyncio.AbstractEventLoop, list] = {}
                for rid, item, finished in outputs:
                    if finished is not None:  # counted before the caller hears: it may send its next request at once
                        self.metrics.observe_finished(finished)
                    post = self._deliver(rid, item)
                    if post is not None:
                        posts.setdefault(post[0], []).append(post[1:])
                for loop, items in posts.items():
                    _post(loop, items)
                self.metrics.observe_step(snapshot)
        except (EOFError, OSError):
            pass
        with self._lock:
            self._dead = True
            streams, self._streams = self._streams, {}
        for loop, out in streams.values():
            _post(loop, [(out, EngineError("the engine process has stopped"))])

    def _deliver(self, rid: str, item: Delta | Failure) -> tuple | None:
        """(loop, queue, item) to hand to the caller of ``rid``, or None (nobody to tell)."""
        final = isinstance(item, Failure) or item.finish_reason is not None
        with self._lock:
            entry = self._streams.pop(rid, None) if final else self._streams.get(rid)
        if entry is None:
            return None
        if isinstance(item, Failure):
            if item.kind == "aborted":  # the caller asked for it and is no longer listening
                return None
            item = RequestError(item.message) if item.kind == "refused" else EngineError(item.message)
        return (*entry, item)


def _post(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, object]]) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the caller's event loop has closed (the server is shutting down)
        pass


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for out, item in items:
        out.put_nowait(item)
