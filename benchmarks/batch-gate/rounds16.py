"""The batch scripts' loop (`batch16_ab.py`, `variants16.py`, `ngram_ab.py`, `probe_ab.py`): 16 MT-Bench requests
at once (128 tokens, EOS ignored) through each variant's engine, kept across rounds (as a server's: `auto`'s state
carries over), rounds interleaved; per variant the median rate against the first's, each round's rate, and its
draft and accepted tokens."""
import statistics
import time

from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file


def rounds16(engines: dict, rounds: int) -> None:
    first = next(iter(engines.values()))
    ids = [first.encode_prompt(p.text) for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:16]]
    sp = SamplingParams(max_tokens=128, ignore_eos=True)
    rates, drafts = {n: [] for n in engines}, {n: [] for n in engines}
    for _ in range(rounds):
        for n, e in engines.items():
            drafted, accepted = e.stats.num_draft_tokens, e.stats.num_accepted_tokens
            t = time.perf_counter()
            e.generate(ids, sp)
            rates[n].append(2048 / (time.perf_counter() - t))
            drafts[n].append((e.stats.num_draft_tokens - drafted, e.stats.num_accepted_tokens - accepted))
    base = statistics.median(rates[next(iter(engines))])
    print(f"16 MT-Bench requests at once, {rounds} rounds")
    for n in engines:
        m = statistics.median(rates[n])
        print(f"{n}: median {m:.1f} tok/s, {m / base:.3f}x the first; runs {[round(x) for x in rates[n]]}; "
              f"draft tokens / accepted per round {drafts[n]}")
