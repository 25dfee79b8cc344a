"""`peagle generate --target gemma3` with its default head (P-EAGLE, K auto) against `--method none` on 12
held-out prompts (6 MT-Bench first turns, 6 of the 100 GSM8K train questions left out of the head's
training), plain text, 128 tokens, greedy; the two methods alternate per prompt (which goes first too).
Each run is its own process (model load not timed: generate's own tok/s). Writes speed.jsonl here and
prints medians and the ratio of total tokens over total seconds.

    taskset -c 1 nice -n 19 env PEAGLE_TORCH_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/gemma-head/speed.py
"""
from peagle.prompts import MT_BENCH
import json, random, statistics, subprocess, sys
from pathlib import Path

HERE = Path(__file__).parent
mt = [json.loads(l)["turns"][0] for l in open(MT_BENCH)]
gsm = [json.loads(l)["question"] for l in open("data/prompts/gsm8k_train.jsonl")][-100:]
rng = random.Random(0)
prompts = [("mt-bench", p) for p in rng.sample(mt, 6)] + [("gsm8k-heldout", p) for p in rng.sample(gsm, 6)]
extra = sys.argv[1:]
rows = []
OUT = HERE.resolve().parents[1] / "docs" / "results" / "gemma-head"  # the raw outputs beside the figures
with open(OUT / "speed.jsonl", "w") as out:
    for i, (src, p) in enumerate(prompts):
        order = ["none", "parallel"] if i % 2 == 0 else ["parallel", "none"]
        got = {}
        for m in order:
            r = subprocess.run([sys.executable, "-m", "peagle.cli", "generate", "--target", "gemma3", "--method", m,
                                "--no-chat", "--max-new-tokens", "128", "--json", *extra, p],
                               capture_output=True, text=True, check=True)
            got[m] = json.loads(r.stdout.strip().splitlines()[-1])
        same = got["none"]["token_ids"] == got["parallel"]["token_ids"]
        row = {"source": src, "prompt": p[:80], "same_tokens": same,
               **{f"{m}_tok_s": got[m]["output_tokens_per_s"] for m in got},
               **{f"{m}_elapsed_s": got[m]["elapsed_s"] for m in got},
               **{f"{m}_tokens": got[m]["num_output_tokens"] for m in got},
               "al": got["parallel"]["acceptance_length"]}
        rows.append(row)
        out.write(json.dumps(row) + "\n"); out.flush()
        print(f"{src:14s} none {row['none_tok_s']:6.1f}  parallel {row['parallel_tok_s']:6.1f} tok/s  AL {row['al']:.2f}  same {same}",
              flush=True)
tot = lambda m: sum(r[f"{m}_tokens"] for r in rows) / sum(r[f"{m}_elapsed_s"] for r in rows)
med = lambda m: statistics.median(r[f"{m}_tok_s"] for r in rows)
summary = {"none_tok_s_total": round(tot("none"), 2), "parallel_tok_s_total": round(tot("parallel"), 2),
           "ratio_total": round(tot("parallel") / tot("none"), 3), "none_tok_s_median": med("none"),
           "parallel_tok_s_median": med("parallel"),
           "ratio_of_medians": round(med("parallel") / med("none"), 3),
           "al_mean": round(statistics.mean(r["al"] for r in rows), 3),
           "all_same_tokens": all(r["same_tokens"] for r in rows)}
print(json.dumps(summary))
(OUT / "speed_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
