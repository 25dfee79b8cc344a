"""Prometheus metrics, named after vLLM's (``peagle:`` instead of ``vllm:``), so the same dashboards
and ``bench serve`` arithmetic apply: acceptance rate = accepted / draft tokens, AL = 1 + accepted / drafts."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from peagle.engine.sequence import Sequence


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("peagle:request_success", "Finished requests", ["finished_reason"], registry=r)
        self.prompt_tokens = Counter("peagle:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("peagle:generation_tokens", "Tokens generated", registry=r)
        self.running = Gauge("peagle:num_requests_running", "Requests running", registry=r)
        self.waiting = Gauge("peagle:num_requests_waiting", "Requests waiting", registry=r)
        self.ttft = Histogram("peagle:time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.tpot = Histogram("peagle:time_per_output_token_seconds", "Time per output token after the first",
                              registry=r, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.e2e = Histogram("peagle:e2e_request_latency_seconds", "Request latency", registry=r,
                             buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.num_drafts = Counter("peagle:spec_decode_num_drafts", "Verify rounds with drafts", registry=r)
        self.num_draft_tokens = Counter("peagle:spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.num_accepted = Counter("peagle:spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pos = Counter("peagle:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position", ["position"], registry=r)
        self._seen = (0, 0, 0, [])

    def observe_step(self, engine) -> None:
        """Move the engine's cumulative speculation counters into Prometheus."""
        s = engine.stats
        d0, t0, a0, p0 = self._seen
        self.num_drafts.inc(s.num_drafts - d0)
        self.num_draft_tokens.inc(s.num_draft_tokens - t0)
        self.num_accepted.inc(s.num_accepted_tokens - a0)
        for i, n in enumerate(s.accepted_per_pos):
            before = p0[i] if i < len(p0) else 0
            if n > before or i >= len(p0):
                self.accepted_per_pos.labels(position=str(i)).inc(n - before)
        self._seen = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos))
        self.running.set(len(engine.running))
        self.waiting.set(len(engine.waiting))

    def observe_finished(self, seq: Sequence) -> None:
        self.requests.labels(finished_reason=seq.finish_reason or "abort").inc()
        self.prompt_tokens.inc(len(seq.prompt_ids))
        n = len(seq.output_ids)
        self.generation_tokens.inc(n)
        if seq.first_token_time is not None:
            self.ttft.observe(seq.first_token_time - seq.arrival_time)
            end = seq.finish_time or seq.first_token_time
            if n > 1:
                self.tpot.observe((end - seq.first_token_time) / (n - 1))
            self.e2e.observe(end - seq.arrival_time)
