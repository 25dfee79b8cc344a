"""Prometheus metrics, named after vLLM's (``peagle:`` instead of ``vllm:``), so the same dashboards
and ``bench serve`` arithmetic apply: acceptance rate = accepted / draft tokens, AL = 1 + accepted / drafts."""
from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from peagle.engine.sequence import SpecStats
from peagle.serve.engine_core import Finished, Snapshot


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("peagle:request_success", "Finished requests", ["finished_reason"], registry=r)
        self.prompt_tokens = Counter("peagle:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("peagle:generation_tokens", "Tokens generated", registry=r)
        self.running = Gauge("peagle:num_requests_running", "Requests running", registry=r)
        self.waiting = Gauge("peagle:num_requests_waiting", "Requests waiting", registry=r)
        self.kv_usage = Gauge("peagle:kv_cache_usage_perc", "Share of KV cache blocks in use (0..1)", registry=r)
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
        self.drafted_per_pos = Counter("peagle:spec_decode_num_draft_tokens_per_pos",
                                       "Draft tokens (tree nodes) verified at each position (depth)", ["position"],
                                       registry=r)
        self.prefix_queries = Counter("peagle:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("peagle:prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r)
        self._last = Snapshot(SpecStats(), 0, 0, 0.0)  # the counters already moved (a copy: not the engine's own)

    def observe_step(self, snap: Snapshot) -> None:
        """Move the engine's cumulative counters (speculation, the prefix cache) and its gauges into Prometheus."""
        s, last = snap.spec, self._last.spec
        self.prefix_queries.inc(snap.prefix_cache_queries - self._last.prefix_cache_queries)
        self.prefix_hits.inc(snap.prefix_cache_hits - self._last.prefix_cache_hits)
        self.num_drafts.inc(s.num_drafts - last.num_drafts)
        self.num_draft_tokens.inc(s.num_draft_tokens - last.num_draft_tokens)
        self.num_accepted.inc(s.num_accepted_tokens - last.num_accepted_tokens)
        for counter, now, seen in ((self.accepted_per_pos, s.accepted_per_pos, last.accepted_per_pos),
                                   (self.drafted_per_pos, s.drafted_per_pos, last.drafted_per_pos)):
            for i, n in enumerate(now):
                before = seen[i] if i < len(seen) else 0
                if n > before or i >= len(seen):
                    counter.labels(position=str(i)).inc(n - before)
        moved = SpecStats()
        moved.merge(s)   # a copy (the engine's own counters grow in place): 2 us against deepcopy's 15
        self._last = dataclasses.replace(snap, spec=moved)
        self.running.set(snap.running)
        self.waiting.set(snap.waiting)
        self.kv_usage.set(snap.kv_cache_usage)

    def observe_finished(self, f: Finished) -> None:
        self.requests.labels(finished_reason=f.finish_reason).inc()
        self.prompt_tokens.inc(f.num_prompt_tokens)
        self.generation_tokens.inc(f.num_output_tokens)
        for hist, value in ((self.ttft, f.ttft_s), (self.tpot, f.tpot_s), (self.e2e, f.e2e_s)):
            if value is not None:
                hist.observe(value)
