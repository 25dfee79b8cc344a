"""The checks every request's prompt must pass, made once here for the engine (``LLMEngine.add_request``)
and the server (which refuses before queueing, with a 400), so both refuse the same prompts in the
same words."""
from __future__ import annotations

from collections.abc import Sequence


class RequestError(ValueError):
    """A request the engine cannot take (empty prompt, too long, bad parameters)."""


def check_prompt(prompt_ids: Sequence[int], vocab_size: int, max_model_len: int) -> int:
    """Raise :class:`RequestError` unless ``prompt_ids`` is a non-empty prompt of this vocabulary with
    room for at least one new token; return that room (the most tokens it may generate)."""
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if max(prompt_ids) >= vocab_size or min(prompt_ids) < 0:
        raise RequestError(f"prompt token ids must be in 0..{vocab_size - 1}")
    room = max_model_len - len(prompt_ids)
    if room < 1:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                           f"{max_model_len}")
    return room
