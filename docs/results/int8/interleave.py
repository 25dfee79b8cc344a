"""The held-out scripts' loop (`heldout.py`, `heldout_ab.py`): every variant on every prompt, ROUNDS rounds, the
variants in an order that rotates with the round and the prompt, every variant's tokens checked equal."""
from collections.abc import Callable


def interleaved(run: Callable[[str, int], tuple[list[int], float, float]], names: list[str], prompts: int,
                rounds: int) -> tuple[dict[str, list[list[tuple[int, float, float]]]], dict[int, list[int]]]:
    """``run(name, i)`` -> (tokens, seconds, AL) of variant ``name`` on prompt ``i``. Returns per variant and prompt
    the (token count, seconds, AL) of each round, and each prompt's tokens."""
    res = {v: [[] for _ in range(prompts)] for v in names}
    tokens: dict[int, list[int]] = {}
    for r in range(rounds):
        for i in range(prompts):
            s = (r + i) % len(names)
            for v in names[s:] + names[:s]:
                toks, seconds, al = run(v, i)
                assert tokens.setdefault(i, toks) == toks, f"prompt {i}: {v} gave other tokens"
                res[v][i].append((len(toks), seconds, al))
    return res, tokens
