"""Drafts from the text itself, beside a head's: vLLM's n-gram "prompt lookup". Where the last n tokens
(n from ``prompt_lookup_max`` down to ``prompt_lookup_min``) occurred before in the prompt or the output,
the tokens that followed them then are proposed for the positions after. Where the head drafts, they take
its place at the positions they cover (its candidates stay below them in a tree, and after them); where
``auto`` skips the head's drafting, they are verified alone (a few rows, no drafter pass; the scheduler's
``_next_drafts``). Text that repeats (a summary quoting its source, code reusing its names, a list's
pattern) is where a weak head misses and this hits. Verification decides as for any
draft, so the output is unchanged."""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from peagle.files import written

# the drafts the text's own proposal puts in a step without the head's (where auto skips it; K=auto with method
# ngram): as many as the suffix it matched is long, at least LOOKUP_LEAST, at most LOOKUP_MOST. Verifying them
# costs rows, not a drafter pass, and a long match is seldom cut short: over 72 ShareGPT and GSM8K-train
# prompts' greedy outputs (a replay priced by the measured row costs) 1.57x plain decoding
# with 3 drafts always, 1.68x by the match, 1.70x with loops running on (below); 7 always 1.65x, but 0.96x on
# its worst prompt. A fixed 3 had measured 1.059x on the held-out prompts against 2 (1.046x), 5 (1.059x) and 8
# (1.035x)
LOOKUP_LEAST, LOOKUP_MOST = 3, 7
# ... while one sequence decodes alone: beside others the rows are compute, not nearly free (4 and 16 MT-Bench
# requests in flight: 2-5% less against plain decoding by the match than at 3 always)
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


# drafts from the target's earlier responses (ResponseLookup) verified alone: at most this many, each position's
# token the one that most often followed the longest context seen, drafting stopped where the chance that all so
# far are right (the product of each one's share of what followed) falls below RESPONSE_LEAST_CHANCE. Replayed on
# the greedy outputs of the 12 held-out prompts and MT-Bench's 80 first turns, priced by a Zen 4's row costs:
# prompt lookup alone 1.169x / 1.438x plain decoding, with the shipped table where it finds nothing 1.313x /
# 1.626x; 1, 3 or 4 drafts and a least chance of 0.15 or 0.5 up to 3% less, contexts seen twice kept (a table 42%
# larger) level: docs/results/responses/replay.txt
RESPONSE_MOST = 2
RESPONSE_LEAST_CHANCE = 0.3
RESPONSES_FILE = "responses-lookup.npz"   # beside a head: the table of the responses it was trained on


class ResponseLookup:
    """What followed each context of 1..``orders`` tokens in a corpus of the target's own responses (the ones
    ``peagle synth`` writes to train heads): the most frequent next token and its share. It drafts where the text
    itself does not repeat, the phrases a model writes in every answer (REST's datastore; vLLM's suffix
    decoding keeps the same from the requests it served). A context is its tokens' ids packed into one
    integer (exact, no hash), each order's sorted for a binary search; contexts seen once, or whose most frequent
    follower has a share below ``least_share``, are left out."""

    def __init__(self, keys: list[np.ndarray], tokens: list[np.ndarray], shares: list[np.ndarray], bits: int,
                 meta: dict | None = None):
        self.keys, self.tokens, self.shares, self.bits = keys, tokens, shares, bits
        self.orders = len(keys)
        self.meta = meta or {}

    @staticmethod
    def orders_for(vocab_size: int) -> tuple[int, int]:
        """(bits a token takes, the longest context that packs into 64 bits; at most 4)."""
        bits = max(1, (vocab_size - 1).bit_length())
        return bits, min(4, 64 // bits)

    @classmethod
    def build(cls, responses: list[list[int]], vocab_size: int, min_count: int = 3,
              least_share: float = 0.1) -> "ResponseLookup":
        bits, orders = cls.orders_for(vocab_size)
        flat = np.concatenate([np.asarray(r + [-1], dtype=np.int64) for r in responses] or [np.zeros(0, np.int64)])
        keys, tokens, shares = [], [], []
        for n in range(1, orders + 1):
            m = max(len(flat) - n, 0)
            key, ok = np.zeros(m, dtype=np.uint64), np.ones(m, dtype=bool)
            for j in range(n):   # the context's tokens, the first one highest
                w = flat[j:j + m]
                ok &= w >= 0
                key = (key << np.uint64(bits)) | np.maximum(w, 0).astype(np.uint64)
            nxt = flat[n:n + m]
            ok &= nxt >= 0
            key, nxt = key[ok], nxt[ok]
            order = np.lexsort((nxt, key))
            key, nxt = key[order], nxt[order]
            pair = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (nxt[1:] != nxt[:-1])]) if len(key) else \
                np.zeros(0, np.int64)
            count = np.diff(np.r_[pair, len(key)])
            pkey, ptok = key[pair], nxt[pair]
            first = np.flatnonzero(np.r_[True, pkey[1:] != pkey[:-1]]) if len(pkey) else np.zeros(0, np.int64)
            total = np.add.reduceat(count, first) if len(first) else count
            best = np.maximum.reduceat(count, first) if len(first) else count
            ctx = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(pkey)]))
            top = np.flatnonzero(count == best[ctx])       # pairs with the most followers (ties: the lowest token)
            top = top[np.r_[True, ctx[top][1:] != ctx[top][:-1]]] if len(top) else top
            keep = (total >= min_count) & (best >= least_share * total)
            keys.append(pkey[first][keep])
            tokens.append(ptok[top][keep].astype(np.uint16 if bits <= 16 else np.int32))
            shares.append((best[keep] * 255 // total[keep]).astype(np.uint8))
        meta = {"vocab_size": vocab_size, "responses": len(responses), "tokens": int(sum(map(len, responses))),
                "min_count": min_count, "least_share": least_share}
        return cls(keys, tokens, shares, bits, meta)

    def save(self, path: str | os.PathLike) -> None:
        """An ``.npz`` file, written whole or not at all (a temporary file renamed)."""
        arrays = {f"{name}{n + 1}": a[n] for name, a in (("keys", self.keys), ("tokens", self.tokens),
                                                         ("shares", self.shares)) for n in range(self.orders)}
        path = Path(path)
        with written(path) as tmp, open(tmp, "wb") as fh:  # (a file object: numpy adds no ".npz" to its name)
            np.savez_compressed(fh, bits=np.asarray(self.bits), meta=np.asarray(json.dumps(self.meta)), **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_size: int) -> "ResponseLookup":
        """The table in ``path``, checked against the target's vocabulary: a table with ids the target does not
        have (another tokenizer's: its drafts would be nonsense, lossless all the same but slower) is refused with
        the reason."""
        try:
            with np.load(path, allow_pickle=False) as f:
                bits, meta = int(f["bits"]), json.loads(str(f["meta"]))
                orders = sum(1 for k in f.files if k.startswith("keys"))
                keys = [f[f"keys{n}"] for n in range(1, orders + 1)]
                tokens = [f[f"tokens{n}"] for n in range(1, orders + 1)]
                shares = [f[f"shares{n}"] for n in range(1, orders + 1)]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a response lookup table ({e})") from None
        if not isinstance(meta.get("vocab_size"), int) or meta["vocab_size"] > vocab_size:
            raise ValueError(f"{path}: a table of a {meta.get('vocab_size')}-token vocabulary, the target has "
                             f"{vocab_size}")
        if not orders or any(len({len(keys[n]), len(tokens[n]), len(shares[n])}) != 1 for n in range(orders)):
            raise ValueError(f"{path}: a response lookup table with missing or mismatched arrays")
        return cls(keys, tokens, shares, bits, meta)

    def follower(self, context: list[int]) -> tuple[int, float] | None:
        """The most frequent token after the longest suffix of ``context`` (up to ``orders`` tokens) in the
        table, with its share of what followed; None where no suffix is."""
        suffixes, key, bits = [], 0, self.bits   # each suffix's key, the shortest first
        for n, t in enumerate(reversed(context[-self.orders:])):
            if t >> bits:   # no context holds an id wider than the table's (one of the target's it never saw)
                break
            key |= t << (bits * n)
            suffixes.append(key)
        for n in range(len(suffixes), 0, -1):
            keys, key = self.keys[n - 1], suffixes[n - 1]
            i = int(keys.searchsorted(np.uint64(key)))
            if i < len(keys) and int(keys[i]) == key:
                return int(self.tokens[n - 1][i]), int(self.shares[n - 1][i]) / 255
        return None

    def propose(self, tokens: list[int], k: int, least_chance: float = RESPONSE_LEAST_CHANCE) -> list[int]:
        """Up to ``k`` tokens to follow ``tokens``, each the most frequent follower of the context so far (the
        drafts before it included), while the product of their shares stays at least ``least_chance``."""
        context, out, chance = list(tokens[-self.orders:]), [], 1.0
        while len(out) < k:
            hit = self.follower(context + out)
            if hit is None or chance * hit[1] < least_chance:
                break
            chance *= hit[1]
            out.append(hit[0])
        return out
