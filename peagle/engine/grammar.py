"""Structured outputs: a request's JSON schema, regex, EBNF grammar or list of choices as a token mask,
through xgrammar (its masks the cheapest of three libraries on this CPU: docs/lessons.md).

Speculative verification needs the grammar's state after each drafted token: walk a :class:`Matcher`
forward over the drafts (:meth:`Matcher.accept`), :meth:`Matcher.fill` each row's mask on the way, then
:meth:`Matcher.rollback`. Stop tokens are allowed exactly where the grammar can end; ids past the
tokenizer's table (a wider LM head) and its other special tokens never are. xgrammar is imported when the
first :class:`Grammars` is made, not with peagle.
"""
from __future__ import annotations

import copy
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from peagle.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar

KINDS = ("json", "json_schema", "regex", "grammar", "choice")
# JSON may put whitespace between any two elements (pretty-printed or not, as the model likes), but at
# most this many characters at a time: unbounded, a small model can emit whitespace until max_tokens
MAX_WHITESPACE = 32


class GrammarError(ValueError):
    """A malformed structured-output request (the server answers it with a 400)."""


@dataclass(frozen=True)
class StructuredOutput:
    """What a request asks for; hashable (the compile cache's key) and picklable (it crosses to the
    engine's process). ``kind``: "json" (any JSON object, OpenAI's ``json_object``), "json_schema" (``spec``
    the schema as JSON text), "regex", "grammar" (xgrammar's EBNF, GBNF-like: ``root ::= ...``) or "choice"
    (``spec`` a JSON list of strings, the output exactly one of them)."""
    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown structured output kind {self.kind!r}: expected one of {', '.join(KINDS)}")


# xgrammar's C++ errors start with "[time] file.cc:line: " (and a failed check's own words)
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s+(Check failed: .*? is false:\s*)?")


def _message(e: Exception) -> str:
    return " ".join(_CPP_PREFIX.sub("", str(e)).split()) or type(e).__name__


class Matcher:
    """One request's grammar state. xgrammar keeps every step, so rollback reaches back to the start."""
    __slots__ = ("_m", "_never", "_mask")

    def __init__(self, m: "xgrammar.GrammarMatcher", never: frozenset[int], vocab_size: int):
        self._m, self._never, self._mask = m, never, new_mask(1, vocab_size)

    def accept(self, token: int) -> bool:
        """Advance by one token; False, and no change, where the grammar forbids it (or has terminated).
        (Drafts are tried here: the tokens xgrammar would log a warning for are answered first.)"""
        if token in self._never or self._m.is_terminated():
            return False
        return self._m.accept_token(token)

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (a stop token included)."""
        if n:
            self._m.rollback(n)

    def fill(self, mask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into row ``row`` of a mask from :meth:`Grammars.new_mask`."""
        self._m.fill_next_token_bitmask(mask, row)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and has accepted a stop token: the request ends."""
        return self._m.is_terminated()

    @property
    def dead_end(self) -> bool:
        """Nothing may come next, stop tokens included: the grammar asks for a character none of this model's
        tokens spells (a regex's control byte, say) and cannot end here. Filling a mask costs, so the engine
        asks only when a token it took in was refused."""
        if self._m.is_terminated():
            return False
        self._m.fill_next_token_bitmask(self._mask, 0)
        return not self._mask.any()


class Grammars:
    """One per engine: the tokenizer's table for xgrammar, and compiled grammars kept in an LRU cache
    (a schema compiles in milliseconds, but requests reuse a few)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int], cache_size: int = 64):
        import xgrammar as xgr
        self._xgr = xgr
        # a copy of its own: compile (writable) runs on the server's grammar thread while the engine's thread
        # decodes with the engine's tokenizer, and a fast tokenizer is not safe to share between threads (its
        # Rust side is borrowed per call: "Already borrowed")
        self._tokenizer = copy.deepcopy(tokenizer)
        self.vocab_size = vocab_size
        stop = sorted(stop_token_ids)
        # xgrammar reads the vocabulary's type (byte-level, ...) from a transformers tokenizer: peagle's own builds
        # one here, once an engine (~0.2 s; importing xgrammar imports transformers anyway), rather than calling
        # xgrammar's private detectors itself
        hf = tokenizer.transformers() if isinstance(tokenizer, Tokenizer) else tokenizer
        base = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stop)
        # xgrammar takes added special tokens (<|im_start|>, <repo_name>, ...) for text, so a JSON string
        # could hold one; an empty entry marks a token special: never allowed (as the ids past the table)
        special = ({i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
                   | set(tokenizer.all_special_ids)) - set(stop)
        table = [""] * vocab_size
        for text, i in tokenizer.get_vocab().items():
            if i < vocab_size and i not in special:
                table[i] = text
        self._never = frozenset(i for i, t in enumerate(table) if not t and i not in stop)
        self._info = xgr.TokenizerInfo(table, base.vocab_type, vocab_size=vocab_size, stop_token_ids=stop,
                                       add_prefix_space=base.add_prefix_space)
        # one thread: the engine's cores run the model; xgrammar's own cache would be unbounded
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[StructuredOutput, xgrammar.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def matcher(self, so: StructuredOutput) -> Matcher:
        """A fresh matcher for ``so`` (compiled once, then cached); GrammarError if ``so`` is malformed, or if it
        allows no token to begin with (a regex or grammar whose first characters this model's tokens cannot
        spell: its mask would leave nothing to sample)."""
        m = Matcher(self._xgr.GrammarMatcher(self.compile(so)), self._never, self.vocab_size)
        if m.dead_end:
            raise GrammarError(f"the {so.kind.replace('_', ' ')} allows no token this model's tokenizer can write "
                               "at its start")
        return m

    def compile(self, so: StructuredOutput) -> "xgrammar.CompiledGrammar":
        """``so`` compiled, from the cache or now; thread-safe, so the server compiles off its engine's loop
        (a large schema takes seconds; xgrammar lets the GIL go meanwhile)."""
        with self._lock:
            compiled = self._cache.get(so)
            if compiled is not None:
                self._cache.move_to_end(so)
                return compiled
        compiled = self._compile(so)
        with self._lock:
            self._cache[so] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def compiled(self, so: StructuredOutput) -> bool:
        with self._lock:
            return so in self._cache

    def new_mask(self, rows: int) -> torch.Tensor:
        return new_mask(rows, self.vocab_size)

    def writable(self, text: str) -> bool:
        """Whether the model's tokens can spell ``text``: its tokenizer's encoding decodes back to it. Not so
        for characters whose UTF-8 bytes some token tables lack (SmolLM2's has no token for the byte 0xF1:
        U+40000-U+4FFFF): a choice holding one is a dead end the mask would allow no token past."""
        tok = self._tokenizer
        return tok.decode(tok.encode(text, add_special_tokens=False), clean_up_tokenization_spaces=False) == text

    def _compile(self, so: StructuredOutput) -> "xgrammar.CompiledGrammar":
        c = self._compiler
        what = {"json": "JSON", "json_schema": "JSON schema", "regex": "regex", "grammar": "grammar",
                "choice": "choice list"}[so.kind]
        try:
            if so.kind == "json":
                # any object, as OpenAI's json_object; not strict, so any keys
                return c.compile_json_schema('{"type": "object"}', strict_mode=False, max_whitespace_cnt=MAX_WHITESPACE)
            if so.kind == "json_schema":
                try:
                    json.loads(so.spec)
                except ValueError as e:
                    raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
                return c.compile_json_schema(so.spec, max_whitespace_cnt=MAX_WHITESPACE)
            if so.kind == "regex":
                return c.compile_regex(so.spec)
            if so.kind == "grammar":
                return c.compile_grammar(so.spec)
            return c.compile_grammar(_choice_grammar(so.spec, self.writable))
        except GrammarError:
            raise
        except (RuntimeError, ValueError, TypeError) as e:
            raise GrammarError(f"invalid {what}: {_message(e)}") from None


def _choice_grammar(spec: str, writable) -> str:
    """EBNF for exactly one of a JSON list of strings (JSON's string escapes are EBNF's), each of them one the
    model's tokens can spell (``writable``)."""
    try:
        choices = json.loads(spec)
    except ValueError as e:
        raise GrammarError(f"the choices are not valid JSON: {e}") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("the choices must be a non-empty JSON list of non-empty strings")
    for i, c in enumerate(choices):
        if not writable(c):
            bad = next((ch for ch in c if not writable(ch)), None)
            what = f"U+{ord(bad):04X}" if bad is not None else "a sequence of characters"
            raise GrammarError(f"choice {i} holds {what}, which this model's tokenizer cannot write")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def new_mask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask [rows, ceil(vocab_size / 32)] on the host (xgrammar fills it there), every token
    allowed: bit ``t % 32`` of word ``t // 32`` is token ``t`` (xgrammar's ``allocate_token_bitmask``)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, device="cpu")


_BYTE_BIAS: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _byte_bias(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: for a mask byte, 0 where its bit is set and -inf where not (bit j is token j of the byte)."""
    t = _BYTE_BIAS.get((dtype, device))
    if t is None:
        bits = (torch.arange(256, device=device).unsqueeze(1) >> torch.arange(8, device=device)) & 1
        t = torch.zeros(256, 8, dtype=dtype, device=device).masked_fill_(bits == 0, float("-inf"))
        _BYTE_BIAS[(dtype, device)] = t
    return t


def apply(logits: torch.Tensor, mask: torch.Tensor, rows: Sequence[int] | None = None) -> None:
    """Set the forbidden entries of ``logits`` [n, vocab] to -inf in place, row i by mask row i (a mask
    from :meth:`Grammars.new_mask` with at least n rows); ``rows`` picks the constrained rows (all if None).
    A byte of mask is 8 logits' biases by table lookup: ~10x xgrammar's own CPU kernel on [8, 49152].
    Logits are finite (a +inf plus -inf would be NaN)."""
    n, vocab = logits.shape
    words = (vocab + 31) // 32
    if mask.dtype != torch.int32 or mask.shape[1] < words:
        raise ValueError(f"the mask must be int32 with at least {words} words a row, got {mask.dtype} {tuple(mask.shape)}")
    table, dev = _byte_bias(logits.dtype, logits.device), logits.device
    if rows is None:
        bias = torch.nn.functional.embedding(mask[:n, :words].contiguous().to(dev).view(torch.uint8).long(), table)
        logits.add_(bias.flatten(1)[:, :vocab])
        return
    idx = torch.as_tensor(rows, dtype=torch.long, device="cpu")
    bias = torch.nn.functional.embedding(mask[idx, :words].contiguous().to(dev).view(torch.uint8).long(), table)
    logits.index_add_(0, idx.to(dev), bias.flatten(1)[:, :vocab])
