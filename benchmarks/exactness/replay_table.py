"""The exactness fault of 2026-11-29 replayed: plain decoding of the prompts it changed (the default model, greedy,
128 tokens), the target's RoPE table replaced by TABLE (a (cos, sin) pair saved by a process whose first VML call
raced, or none: the table as computed). Prints, for each prompt, whether its tokens are the failing run's kept ones
(docs/results/exactness/fault-2026-11-29) or plain decoding's.

    python benchmarks/exactness/replay_table.py docs/results/exactness/fault-2026-11-29/rope-table-race.pt
"""
import glob
import json
import sys
from pathlib import Path

import torch

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.layers import Rotary
from peagle.prompts import dataset_path, read_prompt_file

KEPT = "docs/results/exactness/fault-2026-11-29"


def main() -> int:
    table = torch.load(sys.argv[1]) if len(sys.argv) > 1 else None
    compute = Rotary.compute

    def replaced(self, positions, dtype):  # the table's first rows (a larger one, grown later, as computed)
        cos, sin = compute(self, positions, dtype)
        if table is not None and len(cos) == len(table[0]):
            return table[0].to(dtype), table[1].to(dtype)
        return cos, sin

    Rotary.compute = replaced
    runs = [json.loads(Path(f).read_text()) for f in glob.glob(f"{KEPT}/fail-*.json")]
    prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")
    engine = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
    out = {}
    for run in sorted(runs, key=lambda r: r["i"]):
        ids = engine.generate([engine.encode_prompt(prompts[run["i"]].text)],
                              SamplingParams(max_tokens=128, ignore_eos=True))[0].token_ids
        out[run["i"]] = "the failing run's" if ids == run["got"] else "plain decoding's" if ids == run["ref"] else "other"
    print(json.dumps({"table": sys.argv[1] if table is not None else "computed", "tokens": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
