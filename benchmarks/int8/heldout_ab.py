"""The harness the held-out A/B scripts share (`auto/variants.py`, `auto/warmup_ab.py`, `lookup/ab.py`,
`lookup/methods_ab.py`, `lookup/alone_ab.py`): the 12 prompts of `heldout.jsonl` (QA, summarization, instructions,
code; in no training or benchmark set), chat template, greedy, up to 128 tokens, each request in a fresh engine
(as a new `peagle generate` process: its `auto` state new; the weights loaded once, in `BASE`), the variants
interleaved in rotating order, every variant's tokens checked equal, medians per prompt of output tokens over the
request's wall time; each variant against `none`. A script imports it with `sys.path` pointing here."""
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

from interleave import interleaved  # (beside this file, on the importing script's sys.path)

ITEMS = [json.loads(line) for line in (Path(__file__).parent / "heldout.jsonl").read_text().splitlines()]
BASE = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
IDS = [BASE.encode_prompt(it["prompt"]) for it in ITEMS]


def engine(method: str = "parallel", k: int | str = "auto", **config) -> LLMEngine:
    """A fresh one-sequence engine on BASE's target and head."""
    return LLMEngine(BASE.target, BASE.drafter, EngineConfig(method=method, num_speculative_tokens=k, max_num_seqs=1,
                                                            **config), BASE.tokenizer)


def compare(variants: dict[str, Callable[[], LLMEngine]], rounds: int) -> None:
    """Run every variant (a function making its engine, with whatever it patches first) on every prompt, ROUNDS
    rounds, against `none`, and print each one's mean of per-prompt ratios, worst, best and mean AL."""
    variants = {"none": lambda: engine("none", 1), **variants}
    names = list(variants)

    def run(v: str, i: int) -> tuple[list[int], float, float]:
        out = variants[v]().generate([IDS[i]], SamplingParams(max_tokens=128))[0]
        return out.token_ids, out.elapsed_s, out.stats.acceptance_length

    res, _ = interleaved(run, names, len(ITEMS), rounds)
    med = {v: [statistics.median(n / s for n, s, _ in c) for c in res[v]] for v in names}
    print(f"{BASE.precision}; {rounds} rounds; kinds: " + " ".join(it["kind"][:4] for it in ITEMS))
    for v in names[1:]:
        ratios = [a / b for a, b in zip(med[v], med["none"])]
        al = statistics.mean(statistics.median(a for _, _, a in c) for c in res[v])
        print(f"{v:12s} mean of ratios {statistics.mean(ratios):.3f}, worst {min(ratios):.3f}, best {max(ratios):.3f}, "
              f"mean AL {al:.2f}: " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
