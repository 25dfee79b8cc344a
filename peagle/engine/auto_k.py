"""K, or the whole draft tree, chosen by the engine (``num_speculative_tokens="auto"``,
``speculative_token_tree="auto"``).

Each step the engine drafts the tree (with one candidate per position: the chain of K = 0..K_max) that
maximises expected tokens per second for the batch: ``B * E[tokens | tree] / (verify(B*(nodes+1) rows) +
drafting(depth, B))``. ``E`` comes from the measured acceptance of each (position, rank) (decayed counts,
so it follows the text being generated): a node's chance is the product along its path, and the best tree
of n nodes is the n best nodes (:func:`best_first`), so one ordering prices every size from 0 (no
drafting) to the budget. The costs come from the engine's own target and drafter passes, timed over a
range of row counts when the engine starts, corrected by the step times measured since (per rows
verified, the head's drafts or those verified alone, a running ratio): as the batch grows, or another
tenant takes the cores' arithmetic, rows get dearer and the tree shrinks. An empty tree is plain
decoding: the drafter is skipped, and the rows it missed are read in its next pass when drafting resumes
(the engine keeps their target taps), so its KV has no holes. That catch-up pass is a cost of resuming
(priced on the drafter's curve, about twice what its rows cost since they stop at their KV: priced at
their cost, drafting resumed too often at 16 sequences): spread over a probe interval,
it is added to every non-empty tree while rows are missed, so drafting resumes only for a gain that pays
it back (near break-even the choice would otherwise flip every few steps and pay it each time); a long
one (a prompt prefilled without drafts) is priced at the target's measured prefill rate, not the
decode-sized passes' curve, which leaves out a prompt's attention over itself. Every probe interval a
step drafts two positions deeper than pays now, so acceptance there stays measured (a deeper position
seldom tried leans on the one before it) and the tree can grow again; while probes find that nothing
pays, the interval doubles (up to ``probe_max`` steps), so a useless head costs next to nothing; a probe
whose long catch-up (past the rows timed) the batch's remaining steps could not win back at the margin is
skipped, and so is one where even a head whose every draft were accepted would not pay at the batch (rows that
cost what they hold, as 16 sequences' on a CPU). And drafting starts only for a modelled gain beyond
``margin`` (10%): near break-even the model's own error decides, and on the quantized default model, where a
round costs 3x a step, it drafted at 0.88x plain decoding. The engine's first ``warmup`` steps are plain, so the plain step's real time
(the bare passes timed at start-up leave out the host's work) is known before the first draft is weighed
against it: six, as a request's first few steps run 20-35% slower than the rest (on the Zen 5, 3.5-3.8 ms
against 2.6-2.9), and a plain step timed only then made a round of K=2 look cheaper than a plain step
when it cost 1.3x. No anchor does this online: vLLM's dynamic speculation reads a fixed table by batch
size.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import accumulate

from peagle.engine.tree import Tree, best_first


def parse_k(text: str) -> int | str:
    """A K value from the command line: an integer, or ``auto`` (the engine chooses each step)."""
    return "auto" if text.strip() == "auto" else int(text)


@dataclass
class CostCurve:
    """Seconds of a pass over ``rows`` rows, measured at a few row counts; linear in between and
    beyond the last (the extra rows cost what the last interval's did)."""

    rows: list[int]
    seconds: list[float]

    def __post_init__(self):
        # a pass over more rows never costs less: a start-up timing that says so (one row's pass timed first,
        # cold, above two rows') is noise, and it made plain decoding look dear
        self.seconds = list(accumulate(self.seconds[::-1], min))[::-1]

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
    ranks: int = 1              # candidates per position a tree may use (1: a chain)
    budget: int | None = None   # nodes a tree may have (None: k_max, a chain's most)
    probe_every: int = 16       # steps between probes two positions deeper (doubling while none pays)
    probe_max: int = 64         # ... up to this many (the drafter's catch-up then reads at most 64 steps' rows)
    decay: float = 0.98         # per step: about the last 50 steps count
    margin: float = 0.1         # drafting must beat plain decoding by this much by the model (its error, measured)
    prior: float = 1.0          # pseudo-rounds of each position's prior (see __post_init__, then the one before)
    warmup: int = 0             # first steps at K = 0: a plain step is timed (observe) before any draft is weighed
    accepted: list[list[float]] = field(default_factory=list)   # [position][rank]
    tried: list[float] = field(default_factory=list)            # [position]
    # what a step without the head's drafts yields beyond its token: the text's own drafts verified alone
    # (prompt lookup), decayed as the counts are: tokens accepted, and sequence-steps they are over
    lookup_tokens: float = 0.0
    lookup_steps: float = 0.0
    # ... and of those, the steps whose drafts are verified only while they pay (lookup_pays), by where the drafts
    # came from: "short" (a short match in the text), "responses" (the target's earlier responses): [tokens, steps]
    gated: dict[str, list[float]] = field(default_factory=lambda: {"short": [0.0, 0.0], "responses": [0.0, 0.0]})
    steps: int = 0
    scale: dict[int, float] = field(default_factory=dict)   # measured / modelled step time, per rows verified
    interval: int = 0           # steps from one probe to the next (set from probe_every)
    next_probe: int = 0
    _seconds: dict[tuple[int, int, int], float] = field(default_factory=dict, repr=False)
    _near: dict[int, int] = field(default_factory=dict, repr=False)   # rows -> the nearest row count in scale

    def __post_init__(self):
        self.interval = self.next_probe = self.probe_every
        self.budget = self.budget or self.k_max
        # the first position's prior (0.5 for the top candidate, a quarter of that for each next rank) fades
        self.accepted = [[0.5 * 0.25 ** r * self.prior for r in range(self.ranks)]] + [
            [0.0] * self.ranks for _ in range(self.k_max - 1)]
        self.tried = [self.prior] + [0.0] * (self.k_max - 1)

    def record(self, ranks: list[int | None]) -> None:
        """One verified round: at each position its path reached (each accepted one, then the first
        rejected if drafted), the rank of the candidate that was the target's token, or None."""
        for i, r in enumerate(ranks):
            self.tried[i] += 1.0
            if r is not None and r < self.ranks:
                self.accepted[i][r] += 1.0

    def record_lookup(self, accepted: int, gate: str | None = None) -> None:
        """One sequence's round after a step at K = 0: the text's drafts it verified alone (0: none); ``gate``:
        where drafts verified only while they pay came from (``short``, ``responses``)."""
        self.lookup_tokens += accepted
        self.lookup_steps += 1.0
        if gate is not None:
            counts = self.gated[gate]
            counts[0] += accepted
            counts[1] += 1.0

    def lookup_pays(self, drafts: int, batch: int, gate: str = "short") -> bool:
        """Whether ``drafts`` of ``gate``'s kind (a short match in the text, the earlier responses), verified alone
        by each of ``batch`` sequences, pay their rows: the tokens such steps have yielded (after one pseudo-step at
        one token: they are tried, and tried again as the counts decay) against the rows' price over a plain step
        on the target's cost curve, as the steps timed since correct it (where 4 rows cost 1.4x one, a Zen 4's,
        such drafts must yield 0.4 tokens a step)."""
        tokens, steps = self.gated[gate]
        price = self.corrected_seconds(drafts, 0, batch) / self.corrected_seconds(0, 0, batch) - 1.0
        return (tokens + 1.0) / (steps + 1.0) >= price

    def acceptance(self) -> list[list[float]]:
        """Per position and rank: the chance the candidate is accepted when its parent was. A position
        seldom tried (deep ones, while a small tree is chosen) leans on the one before it."""
        first = [a / self.tried[0] if self.tried[0] > 0 else 0.5 * 0.25 ** r for r, a in enumerate(self.accepted[0])]
        out = [first]
        for acc, t in zip(self.accepted[1:], self.tried[1:]):
            out.append([(a + self.prior * q) / (t + self.prior) for a, q in zip(acc, out[-1])])
        return out

    def plan(self) -> tuple[list[tuple[int, ...]], list[float]]:
        """The nodes best first (:func:`best_first`) and ``E[tokens]`` of the tree of the first n, n = 0..budget."""
        nodes, probs = best_first(self.acceptance(), self.budget, self.k_max)
        return nodes, [1.0 + s for s in accumulate(probs, initial=0.0)]

    def step_seconds(self, nodes: int, depth: int, batch: int) -> float:
        """A steady-state step: verify B*(nodes+1) rows, then draft ``depth`` positions for the next one."""
        return self.pass_seconds(batch * (nodes + 1), depth, batch)

    def pass_seconds(self, rows: int, depth: int, batch: int) -> float:
        """A step whose target pass verifies ``rows`` rows of ``batch`` sequences, then drafts ``depth`` positions
        for each; at depth 0 none (plain decoding, or drafts verified alone: the drafter catches up on these rows
        when it resumes). Kept per shape: the curves are fixed, and every step prices each tree size."""
        key = (rows, depth, batch)
        if key not in self._seconds:
            drafting, fed = 0.0, batch * (depth + 1)
            if depth and self.parallel:
                drafting = self.drafter(fed + batch * (depth - 1))
            elif depth:
                drafting = self.drafter(fed) + (depth - 1) * self.drafter(batch)
            self._seconds[key] = self.target(rows) + drafting
        return self._seconds[key]

    def observe(self, rows: int, tree: Tree, batch: int, seconds: float) -> None:
        """A steady decode step whose target pass verified ``rows`` rows (each sequence's token and its drafts:
        the head's, or drafts verified alone) and that drafted ``tree`` took ``seconds``: keep the model's error
        at that many rows. It covers what timing bare passes at start-up leaves out (many sequences'
        attention, the host's per-sequence work, a busy machine) and what changes after it: on a VM whose cores
        another tenant shares, extra rows (integer products) grew dearer than a one-row pass (a wait on memory)
        for minutes, and the steps verifying the text's or the responses' drafts, most steps
        where the head is weak, are what shows it. A step is never faster than its work, so noise only adds: the
        error follows a new low at once and a higher time as a running ratio (a slow start or a burst of other
        tenants fades rather than stays)."""
        r = seconds / self.pass_seconds(rows, tree.depth, batch)
        old = self.scale.get(rows)
        if old is None:
            self._near.clear()   # a row count measured for the first time: the nearest ones change
        self.scale[rows] = r if old is None or r < old else 0.9 * old + 0.1 * r

    def corrected_seconds(self, nodes: int, depth: int, batch: int) -> float:
        """The modelled step time, scaled by the error measured at its rows (or the nearest row count measured:
        one sequence's rows do not price a batch's), and a step with drafts by at least the error of the batch's
        plain step: what the start-up curve leaves out there (many sequences' attention and host work, a busy
        host) the drafted rows have too, while a row count seen a few times keeps the low of a quiet moment
        against the plain step's running ratio (16 sequences on a Zen 4: the error 1.37 at 25 rows against 1.80
        at 16 priced a response draft at 0.37 tokens, which it yielded, and the step lost)."""
        rows = batch * (nodes + 1)
        return self.step_seconds(nodes, depth, batch) * max(self._error(rows), self._error(batch) if nodes else 0.0)

    def _error(self, rows: int) -> float:
        near = self._near.get(rows)
        if near is None:   # (every step prices every tree size: looked up once per row count)
            near = self._near[rows] = min(self.scale, key=lambda j: (abs(j - rows), j), default=0)
        return self.scale.get(near, 1.0)

    def catch_up_seconds(self, rows: int, prefill_row_s: float | None = None) -> float:
        """The drafter's pass over ``rows`` missed rows. Past the row counts timed at start-up the curve (a few
        decode-sized passes, their weights' reads) misses what a long catch-up costs, a prompt's attention over
        its own keys (a 1,936-token prompt: 120 ms, where the curve said a few): there it is priced as the
        target's measured prefill per row (``prefill_row_s``) times the drafter's share of a pass at the most
        rows timed."""
        seconds, top = self.drafter(rows), self.drafter.rows[-1]
        if prefill_row_s is not None and self.long_catch_up(rows):
            seconds = max(seconds, rows * prefill_row_s * self.drafter(top) / self.target(top))
        return seconds

    def long_catch_up(self, rows: int) -> bool:
        """More missed rows than the drafter's start-up curve was timed on (a prompt prefilled without drafts)."""
        return rows > self.drafter.rows[-1]

    def tick(self) -> Tree:
        """A step: the text's and the responses' yields decay. Without a head (ngram at K auto) the whole of a step's
        choice: nothing to draft, the text's drafts weighed after it (:meth:`lookup_pays`)."""
        self.steps += 1
        self.lookup_tokens, self.lookup_steps = self.lookup_tokens * self.decay, self.lookup_steps * self.decay
        for counts in self.gated.values():
            counts[0], counts[1] = counts[0] * self.decay, counts[1] * self.decay
        return Tree(())

    def could_pay(self, batch: int, plain_rate: float) -> bool:
        """Whether a chain whose every draft is accepted beats ``plain_rate`` (tokens a second at K = 0) by the
        margin at some depth, at ``batch`` sequences: the most any head's drafting could do."""
        return any(batch * (1 + d) / self.corrected_seconds(d, d, batch) >= plain_rate * (1 + self.margin)
                   for d in range(1, self.k_max + 1))

    def choose(self, batch: int, missed_rows: int = 0, prefill_row_s: float | None = None,
               steps_left: int | None = None) -> Tree:
        """The tree drafted now (verified next step; a chain when ``ranks`` is 1, empty for no drafting),
        with ``missed_rows`` rows the drafter must catch up on before it drafts (steps without drafts, a
        prompt prefilled without them; ``prefill_row_s``: the target's measured prefill seconds per row, for
        :meth:`catch_up_seconds`) and ``steps_left`` steps at most before the batch's requests end (None:
        unknown); decays the acceptance counts."""
        self.tick()
        self.accepted = [[a * self.decay for a in acc] for acc in self.accepted]
        self.tried = [t * self.decay for t in self.tried]
        if self.steps <= self.warmup:
            return Tree(())
        nodes, expected = self.plan()
        if self.lookup_steps:   # no drafting of the head's is plain decoding plus what the text drafts alone
            expected[0] += self.lookup_tokens / self.lookup_steps
        depths = list(accumulate((len(p) for p in nodes), max, initial=0))
        catch_up = self.catch_up_seconds(missed_rows, prefill_row_s) if missed_rows else 0.0
        rate = [batch * expected[n] / (self.corrected_seconds(n, depths[n], batch) +
                                       (catch_up / self.probe_every if n else 0.0)) for n in range(len(expected))]
        best = max(range(len(rate)), key=rate.__getitem__)
        if rate[best] < rate[0] * (1 + self.margin):
            best = 0   # a gain inside the cost model's error is no gain
        chosen = nodes[:best]
        if self.steps >= self.next_probe:   # look two positions deeper than pays now
            self.interval = min(2 * self.interval, self.probe_max) if best == 0 else self.probe_every
            self.next_probe = self.steps + self.interval
            # unless the drafter must first read a long catch-up (past the rows timed: a prompt prefilled without
            # drafts) that the batch's remaining steps could not win back at the margin: no probe pays then (a
            # 1,936-token prompt's is 120 ms, about 17 of its plain steps). Short ones are always read: a
            # sequence with missed rows runs its steps outside CUDA graphs until the drafter has read them.
            # And no probe where a head whose every draft were accepted would not pay at this batch (rows compute,
            # as 16 sequences' on a CPU): its acceptance could not change the choice, and each probe's deeper rows
            # and catch-up cost P-EAGLE ~3% against `none` there.
            if self.could_pay(batch, rate[0]) and (
                    not self.long_catch_up(missed_rows) or steps_left is None
                    or catch_up <= self.margin * steps_left * self.corrected_seconds(0, 0, batch)):
                deepest = max(chosen, key=len, default=())
                chosen = chosen + [deepest + (0,) * i for i in (1, 2) if len(deepest) + i <= self.k_max]
        return Tree(tuple(chosen))
