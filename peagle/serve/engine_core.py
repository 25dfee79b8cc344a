"""The engine core: :class:`LLMEngine`'s step loop on the main thread of a process of its own.

Why a process and not a thread beside the HTTP server: every Python thread
that runs a parallel torch op gets its own OpenMP team, and with two teams libgomp manages more
threads than there are cores, so it stops spin-waiting between parallel regions; the engine's
worker then sleeps and wakes for each of a step's ~2,000 small ops, and a second thread ran the
same decode at 0.6x. Here the only thread that runs torch is this process's main thread, and the
server's HTTP, JSON and SSE work runs in the other process, off this one's GIL (vLLM V1 splits
its engine core off the API server the same way).

Protocol (pickled over two one-way pipes). In: ``("add", rid, prompt_ids, params, stream)``,
``("abort", rid)``, ``None`` to stop. Out: ``("ready", EngineInfo)`` or ``("failed", message)``
once, then ``("step", outputs, snapshot)`` after each step that has outputs (and at least every
second while the engine runs, for the gauges), where each output is ``(rid, Delta | Failure,
Finished | None)``. A streamed request gets a Delta for each step that gave it tokens; one that is
not streamed gets one Delta with all of its output when it ends, so the server does no work for it
meanwhile. Every request gets exactly one final output: a Delta with a ``finish_reason``, or a
:class:`Failure` (refused, failed by a fault, or aborted).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import TokenLogprob
from peagle.engine.sequence import Sequence, SpecStats
from peagle.precision import dtype_name

log = logging.getLogger("peagle.serve")


@dataclass
class EngineSpec:
    """How the engine process builds its engine: ``factory(**kwargs)`` (picklable: a module-level
    function), by default :meth:`LLMEngine.from_pretrained`; ``stream_interval``: a streamed request hears
    of its tokens every this many (its first and last at once), as SGLang's ``--stream-interval``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    factory: Callable[..., LLMEngine] = LLMEngine.from_pretrained
    stream_interval: int = 1


@dataclass
class EngineInfo:
    """What the server needs to know of the engine it talks to."""
    tokenizer: Any
    device: str
    dtype: str           # the precision, e.g. "float16 weights, float32 compute, float32 KV cache"
    kernels: str         # the linear layers' kernels: avx512, avx2, scalar (peagle's CPU kernels) or torch
    cuda_graphs: bool
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    pid: int
    method: str          # the engine's speculative method (none: the target alone)
    k: int | str         # num_speculative_tokens: K, "auto" (chosen each step, at most k_max) or 0 (no drafts)
    k_max: int           # the most positions a step drafts (0 without a head)
    token_tree: str      # what the drafts form: "chain", "auto" or an explicit tree's rank paths


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
    spec: SpecStats | None = None  # the request's speculation, on its last delta
    # (text, origin) of each token whose text is settled, when asked for (``token_origins``): origin k >= 1 the
    # k-th draft of its round, accepted; 0 the target's token after a rejection; -1 the bonus; -2 no drafts
    tokens: list[tuple[str, int]] | None = None
    num_cached_tokens: int = 0     # prompt tokens read from the prefix cache (OpenAI's usage.prompt_tokens_details)


@dataclass
class Failure:
    """A request's end without output: ``refused`` (bad request), ``failed`` (an engine fault) or ``aborted``."""
    kind: str
    message: str = ""


@dataclass
class Finished:
    """A finished request's figures for the Prometheus histograms (durations on the engine's clock)."""
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None

    @classmethod
    def of(cls, seq: Sequence) -> "Finished":
        n, first = len(seq.output_ids), seq.first_token_time
        if first is None:
            return cls(seq.finish_reason or "abort", len(seq.prompt_ids), n, None, None, None)
        end = seq.finish_time or first
        return cls(seq.finish_reason or "abort", len(seq.prompt_ids), n, first - seq.arrival_time,
                   (end - first) / (n - 1) if n > 1 else None, end - seq.arrival_time)


@dataclass
class Snapshot:
    """The engine's state after a step, for the gauges and the speculation counters."""
    spec: SpecStats
    running: int
    waiting: int
    kv_cache_usage: float   # share of KV blocks held by requests (vLLM's kv_cache_usage_perc, 0..1)
    prefix_cache_queries: int = 0   # prompt tokens looked up in the kept blocks, and found there (cumulative)
    prefix_cache_hits: int = 0

    @classmethod
    def of(cls, engine: LLMEngine) -> "Snapshot":
        b = engine.blocks
        return cls(engine.stats, len(engine.running), len(engine.waiting), 1 - b.num_free / b.num_blocks,
                   b.queries, b.hits)


def run_engine_core(inbox, outbox, spec: EngineSpec) -> None:
    """The engine process's entry point: build the engine, say so, then serve ``inbox`` until told to stop
    or until the server's end of the pipe closes (the server died: nothing is left behind)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server stops us
    try:
        engine = spec.factory(**spec.kwargs)
    except Exception as e:  # a wrong config or a missing model: the server prints it and exits
        outbox.send(("failed", str(e) or type(e).__name__))
        return
    try:
        precision = f"{engine.precision}, {dtype_name(engine.kv_dtype)} KV cache"
        outbox.send(("ready", EngineInfo(engine.tokenizer, str(engine.device), precision, engine.kernels,
                                         engine.graphs is not None, engine.max_model_len,
                                         engine.target.cfg.vocab_size, engine.cfg.max_num_seqs, os.getpid(),
                                         engine.cfg.method,
                                         engine.cfg.num_speculative_tokens if engine.bounds.k_max else 0,
                                         engine.bounds.k_max, str(engine.token_tree))))
        EngineCore(engine, outbox, spec.stream_interval).serve(inbox)
    except (EOFError, OSError):  # the server has gone
        pass


class EngineCore:
    """The step loop: take requests and aborts between steps, step, send each request's delta."""

    SNAPSHOT_EVERY_S = 1.0

    def __init__(self, engine: LLMEngine, outbox, stream_interval: int = 1):
        self.engine, self.outbox, self.stream_interval = engine, outbox, stream_interval
        self._sent: dict[str, tuple[int, int, int]] = {}   # request id -> (tokens, characters, token texts) sent
        self._streamed: dict[str, bool] = {}
        self._out: list[tuple[str, Delta | Failure, Finished | None]] = []
        self._last_sent = time.monotonic()
        # structured outputs' grammars compile on a thread of their own, their requests parked meanwhile
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="peagle-grammar")
        self._compiling: dict[str, tuple[Future, tuple]] = {}

    def serve(self, inbox) -> None:
        engine = self.engine
        while True:
            if not engine.has_unfinished():
                inbox.poll(0.01 if self._compiling else None)  # idle: sleep until a message (or a compile) comes
            while inbox.poll(0):
                msg = inbox.recv()
                if msg is None:
                    return
                self._handle(msg)
            for rid in [rid for rid, (done, _) in self._compiling.items() if done.done()]:
                done, msg = self._compiling.pop(rid)
                if done.exception() is not None:
                    self._out.append((rid, Failure("refused", str(done.exception())), None))
                else:
                    self._add(msg)
            if engine.has_unfinished():
                try:
                    for seq in engine.step().updated:
                        self._post(seq)
                except Exception as e:
                    log.exception("an engine step failed; failing the requests it ran")
                    for seq in list(engine.running):
                        engine.abort(seq.request_id)  # frees its blocks
                        self._end(seq, Failure("failed", f"the engine failed while running this request: {e}"))
            if self._out or time.monotonic() - self._last_sent > self.SNAPSHOT_EVERY_S:
                out, self._out = self._out, []
                self.outbox.send(("step", out, Snapshot.of(engine)))
                self._last_sent = time.monotonic()

    def _handle(self, msg) -> None:
        engine = self.engine
        if msg[0] == "add":
            so = msg[3].structured
            if so is None or engine.tokenizer is None or engine.grammars_ready(so):
                self._add(msg)
            else:  # compiled off this loop (seconds for a large schema), then added
                self._compiling[msg[1]] = (self._compiler.submit(lambda: engine.grammars.compile(so)), msg)
        elif msg[0] == "abort":
            if self._compiling.pop(msg[1], None) is not None:
                self._out.append((msg[1], Failure("aborted"), None))
                return
            seq = next((s for s in [*engine.running, *engine.waiting] if s.request_id == msg[1]), None)
            if seq is not None:  # else it has finished already, and its final delta is on its way
                engine.abort(msg[1])
                self._end(seq, Failure("aborted"))

    def _add(self, msg) -> None:
        _, rid, prompt_ids, params, stream = msg
        try:
            self.engine.add_request(prompt_ids, params, rid)
        except Exception as e:  # refused: the request's own fault
            self._out.append((rid, Failure("refused", str(e)), None))
            return
        self._sent[rid] = (0, 0, 0)
        self._streamed[rid] = stream

    def _end(self, seq: Sequence, failure: Failure) -> None:
        self._sent.pop(seq.request_id, None)
        self._streamed.pop(seq.request_id, None)
        self._out.append((seq.request_id, failure, Finished.of(seq)))

    def _post(self, seq: Sequence) -> None:
        if seq.error is not None:   # the request's own fault, found mid-output: a 400 (an error event if streamed)
            return self._end(seq, Failure("refused", seq.error))
        if not seq.finished and not self._streamed[seq.request_id]:
            return  # told once, at its end
        sent, chars, told = self._sent[seq.request_id]
        n = len(seq.output_ids)
        if not seq.finished and 0 < sent and n - sent < self.stream_interval:
            return  # streamed every stream_interval tokens (the first at once)
        text = seq.text if seq.finished else seq.detok.stable if seq.detok is not None else ""
        logprobs = seq.logprobs[sent:n]
        tok = self.engine.tokenizer
        ids = {i for lp in logprobs for i in [lp.token_id, *(t for t, _ in lp.top)]}
        texts = {i: tok.decode([i]) for i in ids} if tok is not None else {}
        tokens = token_texts(seq, told, text) if seq.params.token_origins and seq.detok is not None else None
        delta = Delta(seq.output_ids[sent:], text[chars:], seq.finish_reason, len(seq.prompt_ids), n, logprobs, texts,
                      seq.stats if seq.finished else None, tokens, num_cached_tokens=seq.cached_prompt_tokens or 0)
        if seq.finished:
            del self._sent[seq.request_id], self._streamed[seq.request_id]
            self._out.append((seq.request_id, delta, Finished.of(seq)))
        else:
            self._sent[seq.request_id] = (n, len(text), told + len(tokens or ()))
            self._out.append((seq.request_id, delta, None))


def token_texts(seq: Sequence, start: int, text: str) -> list[tuple[str, int]]:
    """(text, origin) of the output tokens from ``start`` whose text lies within ``text`` (what has been
    sent, or the final text: then every token, each cut where the text ends), so the pieces always add up
    to the text sent. A token's text is what the detokenizer added for it (empty while a character's bytes
    are incomplete; none for a stop token)."""
    ends = seq.text_ends

    def end(j: int) -> int:   # where token j's text ends (a stop token adds none)
        return 0 if j < 0 else ends[j] if j < len(ends) else ends[-1] if ends else 0

    out = []
    for j in range(start, len(seq.origins)):
        if not seq.finished and end(j) > len(text):
            break
        out.append((text[end(j - 1):end(j)], seq.origins[j]))
    return out
