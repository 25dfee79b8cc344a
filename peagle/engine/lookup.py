"""Drafts from the text itself, beside a head's: vLLM's n-gram "prompt lookup". Where the last n tokens
(n from ``prompt_lookup_max`` down to ``prompt_lookup_min``) occurred before in the prompt or the output,
the tokens that followed them then are proposed for the positions after. Where the head drafts, they take
its place at the positions they cover (its candidates stay below them in a tree, and after them); where
``auto`` skips the head's drafting, they are verified alone (a few rows, no drafter pass; the scheduler's
``_next_drafts``). Text that repeats (a summary quoting its source, code reusing its names, a list's
pattern) is where a weak head misses and this hits (BENCHMARKS.md §39). Verification decides as for any
draft, so the output is unchanged."""
from __future__ import annotations

# the most drafts the text's own proposal puts in a step without the head's (where auto skips it; K=auto with
# method ngram): verifying them costs rows, not a drafter pass (2, 3, 5, 8 over the held-out prompts: 1.046,
# 1.059, 1.059, 1.035x `none`, same run, BENCHMARKS.md §39)
LOOKUP_ONLY = 3


class PromptLookup:
    """A sequence's n-grams -> where the tokens after their latest occurrence start, indexed as the tokens
    arrive (a few dictionary operations a step, not a scan of the text)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0   # n-grams ending before this position are in ``after``

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``tokens`` (the sequence so far, which only grows): those after the
        latest earlier occurrence of its longest suffix of ``n_min..n_max`` tokens that occurred before."""
        end = len(tokens)
        for e in range(self.indexed + 1, end):   # n-grams with a token after them; the suffix itself waits
            for n in range(self.n_min, min(self.n_max, e) + 1):
                self.after[tuple(tokens[e - n:e])] = e
        self.indexed = max(self.indexed, end - 1)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            start = self.after.get(tuple(tokens[end - n:end]))
            if start is not None:
                return tokens[start:start + k]
        return []


def with_lookup(candidates: list[list[int]], proposal: list[int]) -> list[list[int]]:
    """The head's ``[position][rank]`` candidates with the proposal's token first at each position it
    covers (the head's others after it, without a repeat, as many ranks as before)."""
    out = [list(c) for c in candidates]
    for d, t in enumerate(proposal[:len(out)]):
        out[d] = [t] + [c for c in out[d] if c != t][:len(out[d]) - 1]
    return out
