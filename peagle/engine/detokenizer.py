"""Incremental detokenization and stop strings.

Each emitted token is decoded once, by the ``tokenizers`` library's :class:`DecodeStream` (which
holds back bytes until they form whole characters), so a step costs the same however long the
output is. Stop strings are searched only where the new text could complete one, and
:attr:`Detokenizer.stable` holds back a tail that could still become a stop string: what a stream
sends is always a prefix of the final, stop-cut text.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream


class Detokenizer:
    """The text of one sequence's output so far. Used by the engine thread only."""

    def __init__(self, tokenizer, stop: list[str]):
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self.stop = stop
        self._window = max(map(len, stop), default=1) - 1  # chars of old text a new stop match can start in
        self.text = ""

    def push(self, token_id: int) -> str | None:
        """Append a token's text; if that completes a stop string, the text cut before it."""
        piece = self._stream.step(self._backend, token_id)
        if not piece:
            return None
        start = max(0, len(self.text) - self._window)
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return self.text[:min(hits)] if hits else None

    @property
    def stable(self) -> str:
        """The text without its longest tail that is the beginning of a stop string."""
        for n in range(min(self._window, len(self.text)), 0, -1):
            if any(s.startswith(self.text[-n:]) for s in self.stop):
                return self.text[:-n]
        return self.text

