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


def report(res, tokens, items: list[dict], names: list[str], how: str, rounds: int) -> None:
    """The table the held-out scripts print: per prompt each variant's rate against `none`'s (medians) with its AL
    in brackets, then the overall rate (all tokens over all time) against `none`'s."""
    import statistics

    print(f"{how}; {rounds} rounds; ratio to `none` (medians per prompt), AL in brackets\n")
    print("| # | kind | tokens | " + " | ".join(names[1:]) + " |\n|---|---|---|" + "---|" * (len(names) - 1))
    tot = {v: [0, 0.0] for v in names}
    for i, it in enumerate(items):
        rate = {v: statistics.median(n / s for n, s, _ in res[v][i]) for v in names}
        for v in names:
            tot[v][0] += sum(n for n, _, _ in res[v][i])
            tot[v][1] += sum(s for _, s, _ in res[v][i])
        cells = [f"{rate[v] / rate['none']:.2f}x ({statistics.median(a for _, _, a in res[v][i]):.2f})"
                 for v in names[1:]]
        print(f"| {i + 1} | {it['kind']} | {len(tokens[i])} | " + " | ".join(cells) + " |")
    none = tot["none"][0] / tot["none"][1]
    print("\noverall: " + ", ".join(f"{v} {tot[v][0] / tot[v][1] / none:.3f}x" for v in names[1:]))
