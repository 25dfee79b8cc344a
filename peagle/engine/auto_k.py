"""K chosen by the engine (``num_speculative_tokens="auto"``).

Each step the engine drafts the K (0..K_max) that maximises expected tokens per second for the
batch: ``B * E[tokens | K] / (verify(B*(K+1) rows) + drafting(K, B))``. ``E`` comes from the
measured per-position acceptance (decayed counts, so it follows the text being generated); the
costs come from the engine's own target and drafter passes, timed over a range of row counts when
the engine starts, corrected by the step times measured since (per K, a running ratio). K = 0 is
plain decoding: the drafter is skipped, and the rows it missed are read in its next pass when
drafting resumes (the engine keeps their target taps), so its KV has no holes. That catch-up pass
is a cost of resuming: spread over a probe interval, it is added to every K > 0 while rows are
missed, so K leaves 0 only for a gain that pays it back (near break-even the choice would otherwise
flip every few steps and pay it each time). Every probe interval a step drafts two positions
deeper than pays now, so acceptance there stays measured (a deeper position seldom tried leans on
the one before it) and K can climb again; while probes find that nothing pays, the interval
doubles (up to ``probe_max`` steps), so a useless head costs next to nothing. And K leaves 0 only
for a modelled gain beyond ``margin`` (10%): near break-even the model's own error decides, and on the
quantized default model, where a round costs 3x a step, it drafted at 0.88x plain decoding. No anchor does this
online: vLLM's dynamic speculation reads a fixed table by batch size.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field


def parse_k(text: str) -> int | str:
    """A K value from the command line: an integer, or ``auto`` (the engine chooses each step)."""
    return "auto" if text.strip() == "auto" else int(text)


@dataclass
class CostCurve:
    """Seconds of a pass over ``rows`` rows, measured at a few row counts; linear in between and
    beyond the last (the extra rows cost what the last interval's did)."""

    rows: list[int]
    seconds: list[float]

    def __call__(self, r: int) -> float:
        i = min(max(bisect.bisect_left(self.rows, r), 1), len(self.rows) - 1)
        (r0, r1), (s0, s1) = self.rows[i - 1:i + 1], self.seconds[i - 1:i + 1]
        return max(s0 + (s1 - s0) * (r - r0) / (r1 - r0), 0.0)


@dataclass
class AutoK:
    k_max: int
    parallel: bool              # P-EAGLE: one drafter pass; EAGLE-3: K passes
    target: CostCurve           # a target pass (and verification) over n rows
    drafter: CostCurve          # a drafter pass over n rows (with its LM head)
    probe_every: int = 16       # steps between probes two positions deeper (doubling while none pays)
    probe_max: int = 64         # ... up to this many (the drafter's catch-up then reads at most 64 steps' rows)
    decay: float = 0.98         # per step: about the last 50 steps count
    margin: float = 0.1         # drafting must beat plain decoding by this much by the model (its error, measured)
    prior: float = 1.0          # pseudo-rounds of each position's prior (0.5 at first, then the one before)
    accepted: list[float] = field(default_factory=list)
    tried: list[float] = field(default_factory=list)
    steps: int = 0
    scale: dict[int, float] = field(default_factory=dict)   # measured / modelled step time, per K
    interval: int = 0           # steps from one probe to the next (set from probe_every)
    next_probe: int = 0

    def __post_init__(self):
        self.interval = self.next_probe = self.probe_every
        self.accepted = [0.5 * self.prior] + [0.0] * (self.k_max - 1)   # the first position's prior fades
        self.tried = [self.prior] + [0.0] * (self.k_max - 1)            # with the counts, as evidence comes

    def record(self, drafted: int, accepted: int) -> None:
        """One verified round: positions up to the first rejection were tried."""
        for i in range(min(accepted + 1, drafted)):
            self.tried[i] += 1.0
            self.accepted[i] += float(i < accepted)

    def acceptance(self) -> list[float]:
        """Per position: the chance it is accepted when every earlier one was. A position seldom
        tried (deep ones, while a small K is chosen) leans on the one before it."""
        out = [self.accepted[0] / self.tried[0] if self.tried[0] > 0 else 0.5]
        for a, t in zip(self.accepted[1:], self.tried[1:]):
            out.append((a + self.prior * out[-1]) / (t + self.prior))
        return out

    def expected_tokens(self, k: int) -> float:
        e, run = 1.0, 1.0
        for a in self.acceptance()[:k]:
            run *= a
            e += run
        return e

    def step_seconds(self, k: int, batch: int) -> float:
        """A steady-state step at K: verify B*(K+1) rows, then draft for the next one."""
        rows = batch * (k + 1)
        if k == 0:
            drafting = 0.0   # the drafter catches up on these rows when drafting resumes
        elif self.parallel:
            drafting = self.drafter(rows + batch * (k - 1))
        else:
            drafting = self.drafter(rows) + (k - 1) * self.drafter(batch)
        return self.target(rows) + drafting

    def observe(self, k: int, batch: int, seconds: float) -> None:
        """A steady decode step at K (verified K drafts, drafted K) took ``seconds``: keep the
        model's error at this K as a running ratio. It covers what timing bare passes at start-up
        leaves out (many sequences' attention, the host's per-sequence work, a busy machine)."""
        r = seconds / self.step_seconds(k, batch)
        self.scale[k] = r if k not in self.scale else 0.9 * self.scale[k] + 0.1 * r

    def corrected_seconds(self, k: int, batch: int) -> float:
        """The modelled step time, scaled by the error measured at K (or at the nearest K measured)."""
        near = min(self.scale, key=lambda j: (abs(j - k), j), default=None)
        return self.step_seconds(k, batch) * (self.scale[near] if near is not None else 1.0)

    def choose(self, batch: int, missed_rows: int = 0) -> int:
        """K for the drafts proposed now (verified next step), with ``missed_rows`` rows the drafter
        must catch up on before it drafts (steps at K = 0); decays the acceptance counts."""
        self.steps += 1
        self.accepted = [a * self.decay for a in self.accepted]
        self.tried = [t * self.decay for t in self.tried]
        catch_up = self.drafter(missed_rows) / self.probe_every if missed_rows else 0.0
        rate = [batch * self.expected_tokens(k) / (self.corrected_seconds(k, batch) + (catch_up if k else 0.0))
                for k in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=rate.__getitem__)
        if rate[best] < rate[0] * (1 + self.margin):
            best = 0   # a gain inside the cost model's error is no gain
        if self.steps >= self.next_probe:   # look two positions deeper than pays now
            self.interval = min(2 * self.interval, self.probe_max) if best == 0 else self.probe_every
            self.next_probe = self.steps + self.interval
            return min(best + 2, self.k_max)
        return best
