"""How many of the text's drafts to verify alone, replayed without timing noise: the greedy outputs of plain
decoding of the shipped GGUF on 72 training-side prompts (60 ShareGPT first turns and 12 GSM8K-train questions, seeded sample; not
benchmark sets) and on the 12 held-out prompts, stepped through as `ngram` would step (propose from the n-gram
index, accept the longest agreeing prefix, emit one more), each step priced by the rows it verifies on the
target's cost curve measured at start-up on the Zen 5 (1 row 1.00, 2 1.14, 4 1.19, 8 1.62 a plain step,
between them linear) plus 0.05 of a step's host work where it verifies drafts. Ratio: output tokens over that
cost, i.e. the speed against plain decoding, per prompt, then the mean.

    python benchmarks/lookup/replay.py [OUTPUTS_DIR]   # outputs generated there once (default /tmp/peagle-replay)
"""
import json
import random
import sys
from pathlib import Path

from peagle.engine.lookup import PromptLookup

COST = {1: 1.0, 2: 1.14, 3: 1.17, 4: 1.19, 5: 1.30, 6: 1.40, 7: 1.51, 8: 1.62}
HOST = 0.05
DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"  # the training prompt files (yours: see README.md)
HELDOUT = Path(__file__).resolve().parents[1] / "int8" / "heldout.jsonl"


def outputs(path: Path, prompts: list[str], max_tokens: int) -> list[dict]:
    if not path.exists():
        from peagle.engine.llm_engine import LLMEngine
        from peagle.engine.sampling import SamplingParams
        e = LLMEngine.from_pretrained(None, method="none", k=1, max_num_seqs=8)
        ids = [e.encode_prompt(p) for p in prompts]
        outs = e.generate(ids, SamplingParams(max_tokens=max_tokens))
        path.write_text("".join(json.dumps({"prompt": p, "out": o.token_ids}) + "\n" for p, o in zip(ids, outs)))
    return [json.loads(line) for line in path.read_text().splitlines()]


def cut_at_end(lookup: PromptLookup, tokens: list[int], proposal: list[int]) -> list[int]:
    """The proposal as vLLM's (and §39's) would be: stopped where it reaches the text's end."""
    for n in range(lookup.n_max, lookup.n_min - 1, -1):
        start = lookup.after.get(tuple(tokens[-n:]))
        if start is not None:
            return proposal[:len(tokens) - start]
    return proposal


def replay(rec: dict, by_match: bool, most: int, periodic: bool, table: tuple | None = None, cost: dict = COST,
           host: float = HOST) -> float:
    """Output tokens per plain step's cost; ``table``: (a ResponseLookup, its most drafts, its least chance), drafting
    where the lookup finds nothing (benchmarks/responses/replay.py); ``cost``, ``host``: another CPU's prices."""
    tokens, out = list(rec["prompt"]) + rec["out"][:1], rec["out"]
    lookup, spent, i = PromptLookup(2, 4), 1.0, 1
    while i < len(out):
        left = len(out) - i - 1
        proposal = lookup.propose(tokens, min(most, left), by_match)
        if not periodic:
            proposal = cut_at_end(lookup, tokens, proposal)
        if not proposal and table is not None and left > 0:
            proposal = table[0].propose(tokens, min(table[1], left), table[2])
        a = 0
        while a < len(proposal) and proposal[a] == out[i + a]:
            a += 1
        tokens += out[i:i + a + 1]
        i += a + 1
        spent += cost[1 + len(proposal)] + (host if proposal else 0.0)
    return len(out) / spent


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/peagle-replay")
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    sharegpt = [json.loads(line) for line in open(DATA / "sharegpt_prompts.jsonl")]   # (not splitlines: U+2028)
    gsm8k = [json.loads(line) for line in open(DATA / "gsm8k_train.jsonl")]
    train = [r["turns"][0] for r in rng.sample(sharegpt, 200) if len(r["turns"][0]) < 3000][:60] + \
        [r["question"] for r in rng.sample(gsm8k, 12)]
    sets = {"training-side (72)": outputs(root / "train.jsonl", train, 256),
            "held-out (12)": outputs(root / "heldout.jsonl",
                                     [json.loads(x)["prompt"] for x in HELDOUT.read_text().splitlines()], 128)}
    policies = {"2 always": (False, 2, False), "3 always (§39)": (False, 3, False), "5 always": (False, 5, False),
                "7 always": (False, 7, False), "by the match, 3..5": (True, 5, False),
                "by the match, 3..7": (True, 7, False), "3 always, loops run on": (False, 3, True),
                "by the match, 3..7, loops run on (shipped)": (True, 7, True)}
    for name, recs in sets.items():
        print(f"{name}:")
        for p, how in policies.items():
            r = [replay(rec, *how) for rec in recs]
            print(f"  {p:44s} mean {sum(r) / len(r):.3f}, worst {min(r):.3f}")


if __name__ == "__main__":
    main()
