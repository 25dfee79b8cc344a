"""Incremental detokenization equals full decoding, and stop strings are cut where full-text
matching cuts them while the streamable text never passes the cut."""
from __future__ import annotations

import random

import pytest

from peagle.engine.detokenizer import Detokenizer
from peagle.models.loader import load_tokenizer, resolve_target


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_target(None))


def test_incremental_text_equals_full_decoding(tok):
    rng = random.Random(0)
    text = "Héllo wörld, 日本語のテキスト 🎉🎉 <|im_end|> code: def f(x):\n\treturn x ** 2 "
    cases = [tok(text)["input_ids"], [rng.randrange(tok.vocab_size) for _ in range(400)],
             tok("🎉")["input_ids"] * 5]
    for ids in cases:
        d = Detokenizer(tok, [])
        for i, t in enumerate(ids):
            assert d.push(t) is None
            assert tok.decode(ids[:i + 1], skip_special_tokens=True).startswith(d.text)
        assert d.text == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("stop", [[" of Fra"], ["ital", "is P"], ["Paris"], ["nowhere", "e c"], ["ce"]])
def test_stop_strings_cut_and_the_stream_never_passes_the_cut(tok, stop):
    text = "The capital of France is Paris. The capital of Spain is Madrid."
    ids = tok(text)["input_ids"]
    cut = min((text.find(s) for s in stop if s in text), default=None)
    d = Detokenizer(tok, stop)
    for t in ids:
        result = d.push(t)
        if result is not None:  # the sequence finishes with this text
            assert result == text[:cut]
            return
        assert (text[:cut] if cut is not None else text).startswith(d.stable)
    assert cut is None and d.text == text
