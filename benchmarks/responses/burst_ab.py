"""Speculation variants on the 12 held-out prompts, each variant in its own process, in alternating bursts of 20
engine steps (~0.1 s), so every variant sees the same minutes of this host's noise (§49's `pair_ab.py`, for
variants of the engine rather than builds of the kernels). Each process answers the prompts in turn, as
`peagle generate` would (a fresh engine per request, greedy, 128 tokens at most; the start-up cost curves timed
once per process and reused), for PASSES passes over the 12; its tokens and step times are summed per burst.
Prints each variant's rate against `none` over all its steps (every variant decodes the same tokens), and each
prompt's. Variants: `defaults`, `no-table` (the defaults without the response table), `ngram`, `nohead` (the defaults
with `auto` never drafting with the head: what its probes and drafts cost, §51), and `old-<variant>`: that variant
run by the checkout at $BASE (another commit's engine, e.g. a `git worktree`, its kernels' build linked in).
$PROMPTS=mtbench20: 20 of MT-Bench's first turns (every fourth) instead of the held-out prompts.

    python benchmarks/responses/burst_ab.py [PASSES] [VARIANT ...]   # default: defaults no-table ngram
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(variant: str, passes: int) -> None:
    from peagle.engine.config import EngineConfig
    from peagle.engine.llm_engine import LLMEngine, load_response_lookup
    from peagle.engine.model_runner import ModelRunner
    from peagle.engine.sampling import SamplingParams
    from peagle.models.loader import load_drafter_for, resolve_target

    if os.environ.get("PROMPTS") == "mtbench20":
        questions = HERE.parents[1] / "peagle" / "bench" / "data" / "mt_bench" / "question.jsonl"
        items = [{"prompt": q["turns"][0]} for q in map(json.loads, open(questions))][::4][:20]
    else:
        items = [json.loads(line) for line in (HERE.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
    base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
    path = resolve_target(None, weights=False)
    head = load_drafter_for(base.target, path, None, base.tokenizer)
    table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
    ids = [base.encode_prompt(it["prompt"]) for it in items]
    measure, costs = ModelRunner.measure_costs, {}
    ModelRunner.measure_costs = lambda self, *a: costs["c"] if costs else costs.setdefault("c", measure(self, *a))
    method = {"none": "none", "ngram": "ngram"}.get(variant, "parallel")
    if variant == "nohead":   # auto weighs the head every step as the defaults do, and never drafts with it
        from peagle.engine.auto_k import AutoK
        from peagle.engine.tree import Tree
        choose = AutoK.choose
        AutoK.choose = lambda self, *a: (choose(self, *a), Tree(()))[1]

    def requests():
        for _ in range(passes):
            for i, p in enumerate(ids):
                current[0] = i
                cfg = EngineConfig(method=method, num_speculative_tokens=1 if method == "none" else "auto",
                                   max_num_seqs=1)
                e = LLMEngine(base.target, head if method == "parallel" else None, cfg, base.tokenizer,
                              responses=None if variant == "no-table" else table)
                e.add_request(p, SamplingParams(max_tokens=128))
                yield e

    current, per_prompt = [0], [[0, 0.0] for _ in ids]
    todo = requests()
    engine = next(todo)
    print("ready", flush=True)
    for line in sys.stdin:
        seconds, tokens = 0.0, 0
        for _ in range(int(line)):
            if engine is None:
                break
            t = time.perf_counter()
            result = engine.step()
            dt, done = time.perf_counter() - t, sum(len(s.output_ids) for s in result.finished)
            seconds, tokens = seconds + dt, tokens + done
            per_prompt[current[0]][0] += done
            per_prompt[current[0]][1] += dt
            if not engine.has_unfinished():
                engine = next(todo, None)
        print(json.dumps([tokens, seconds, engine is None]), flush=True)
    print(json.dumps(per_prompt), flush=True)


if len(sys.argv) > 1 and sys.argv[1] == "--child":
    child(sys.argv[2], int(sys.argv[3]))
    sys.exit()
passes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
variants = ["none", *(sys.argv[2:] or ["defaults", "no-table", "ngram"])]
procs = [subprocess.Popen([sys.executable, __file__, "--child", v.removeprefix("old-"), str(passes)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={**os.environ, "PYTHONPATH": os.environ["BASE"]} if v.startswith("old-") else None)
         for v in variants]
for p in procs:
    assert p.stdout.readline().strip() == "ready"
bursts = {v: [] for v in variants}
done, i = set(), 0
while len(done) < len(variants):
    order = variants[i % len(variants):] + variants[:i % len(variants)]
    for v in order:
        if v in done:
            continue
        p = procs[variants.index(v)]
        p.stdin.write("20\n")
        p.stdin.flush()
        tokens, seconds, finished = json.loads(p.stdout.readline())
        bursts[v].append((tokens, seconds))
        if finished:
            done.add(v)
    i += 1
per_prompt = {}
for v, p in zip(variants, procs):
    p.stdin.close()
    per_prompt[v] = [t / s for t, s in json.loads(p.stdout.readline())]
    p.wait()
rate = {v: sum(t for t, _ in b) / sum(s for _, s in b) for v, b in bursts.items()}
print(f"{passes} passes over the {len(per_prompt['none'])} {os.environ.get('PROMPTS', 'held-out')} prompts; tokens/s "
      "of each variant over all its steps, against `none`, and each prompt's (all its passes):")
for v in variants[1:]:
    each = [r / n for r, n in zip(per_prompt[v], per_prompt["none"])]
    print(f"  {v}: {rate[v]:.1f} tok/s against {rate['none']:.1f}: {rate[v] / rate['none']:.3f}x; worst prompt "
          f"{min(each):.3f}x; " + " ".join(f"{x:.2f}" for x in each))
