"""Drafts from the text itself, beside a head's: vLLM's n-gram "prompt lookup". Where the last n tokens
(n from ``prompt_lookup_max`` down to ``prompt_lookup_min``) occurred before in the prompt or the output,
the tokens that followed them then are proposed for the positions after. Where the head drafts, they take
its place at the positions they cover (its candidates stay below them in a tree, and after them); where
``auto`` skips the head's drafting, they are verified alone (a few rows, no drafter pass; the scheduler's
``_next_drafts``). Text that repeats (a summary quoting its source, code reusing its names, a list's
pattern) is where a weak head misses and this hits (BENCHMARKS.md §39). Verification decides as for any
draft, so the output is unchanged."""
from __future__ import annotations

# the drafts the text's own proposal puts in a step without the head's (where auto skips it; K=auto with method
# ngram): as many as the suffix it matched is long, at least LOOKUP_LEAST, at most LOOKUP_MOST. Verifying them
# costs rows, not a drafter pass, and a long match is seldom cut short: over 72 ShareGPT and GSM8K-train
# prompts' greedy outputs (a replay priced by the measured row costs, BENCHMARKS.md §40) 1.57x plain decoding
# with 3 drafts always, 1.68x by the match, 1.70x with loops running on (below); 7 always 1.65x, but 0.96x on
# its worst prompt. A fixed 3 had measured 1.059x on the held-out prompts against 2 (1.046x), 5 (1.059x) and 8
# (1.035x) (§39)
LOOKUP_LEAST, LOOKUP_MOST = 3, 7
# ... while one sequence decodes alone: beside others the rows are compute, not nearly free (4 and 16 MT-Bench
# requests in flight: 2-5% less against plain decoding by the match than at 3 always, §40)
LOOKUP_BATCH = 1


class PromptLookup:
    """A sequence's n-grams -> where the tokens after their latest occurrence start, indexed as the tokens
    arrive (a few dictionary operations a step, not a scan of the text)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0   # n-grams ending before this position are in ``after``

    def propose(self, tokens: list[int], k: int, by_match: bool = False) -> list[int]:
        """Up to ``k`` tokens to follow ``tokens`` (the sequence so far, which only grows): those after the
        latest earlier occurrence of its longest suffix of ``n_min..n_max`` tokens that occurred before, and
        where they reach the text's end, the stretch between over again: the text repeats with that period
        there, so a loop's proposal runs on (``x y x y`` proposes ``x y x ...``; vLLM's stops at the end). With
        ``by_match`` (drafts verified alone) no more than the tokens before the two places agree on, counted
        back up to ``k``, and at least ``LOOKUP_LEAST``: a long match is a copy more likely to go on."""
        end = len(tokens)
        for e in range(self.indexed + 1, end):   # n-grams with a token after them; the suffix itself waits
            for n in range(self.n_min, min(self.n_max, e) + 1):
                self.after[tuple(tokens[e - n:e])] = e
        self.indexed = max(self.indexed, end - 1)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            start = self.after.get(tuple(tokens[end - n:end]))
            if start is not None:
                if by_match:
                    while n < k and start > n and tokens[start - n - 1] == tokens[end - n - 1]:
                        n += 1
                    k = min(k, max(n, LOOKUP_LEAST))
                period = end - start   # the text repeats with this period here: past its end, it goes on so
                return [tokens[start + i % period] for i in range(k)]
        return []


def with_lookup(candidates: list[list[int]], proposal: list[int]) -> list[list[int]]:
    """The head's ``[position][rank]`` candidates with the proposal's token first at each position it
    covers (the head's others after it, without a repeat, as many ranks as before)."""
    out = [list(c) for c in candidates]
    for d, t in enumerate(proposal[:len(out)]):
        out[d] = [t] + [c for c in out[d] if c != t][:len(out[d]) - 1]
    return out
