"""Two builds of the kernels (copies of peagle_kernels.so), each in its own process, run engine steps in
alternating bursts of ~0.1 s, so both see the same minute of this host's noise; paired ratios per burst.

    python pair_ab.py A.so B.so CONFIG [BURSTS]     CONFIG: none@300, k1@300, k7@1000, ...
    STREAM_BYTES=0,0 python pair_ab.py ...           (both processes' tiles one group wide, as on most Zen 4 runs;
                                                      0,0/0,16777216: A's one group wide, B's wide for taller passes)
    WEIGHTS=bfloat16 python pair_ab.py ...           (the GGUF's weights de-quantized to bf16, not its blocks)
    PAIR_TREES=TREE_A,TREE_B python pair_ab.py A.so A.so ...   (two checkouts' Python over one build)
"""
import statistics, subprocess, sys, time, json

def child(so, config):
    import os, torch
    from pathlib import Path
    from peagle import kernels
    kernels.LIBRARY = Path(so); kernels._fingerprint = lambda: kernels.STAMP.read_text()
    assert kernels.available()
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams
    from peagle.prompts import dataset_path, read_prompt_file
    name, plen = config.split("@"); plen = int(plen)
    k = 0 if name == "none" else int(name[1:])
    how = dict(dtype=os.environ["WEIGHTS"], quantization="none") if os.environ.get("WEIGHTS") else {}
    e = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1,
                                  prompt_lookup_max=0, **how)
    if os.environ.get("STREAM_BYTES"):  # the tiles' shape fixed, not timed at start-up per process (A/B: each its own)
        sides = os.environ["STREAM_BYTES"].split("/")
        torch.ops.peagle.set_stream_bytes(*map(int, sides[int(os.environ.get("PAIR_SIDE", 0)) % len(sides)].split(",")))
    texts = [p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")]
    ids = [t for text in texts for t in e.encode_prompt(text)]
    n = 0
    def fresh():
        nonlocal n
        s = e.add_request(ids[n * 37 % 2000:][:plen], SamplingParams(max_tokens=96, ignore_eos=True), request_id=f"r{n}")
        n += 1
        while not s.output_ids: e.step()
        return s
    s = fresh()
    print("ready", flush=True)
    for line in sys.stdin:
        steps = int(line)
        ts, toks = [], 0
        for _ in range(steps):
            if s.finished: s = fresh()
            before = len(s.output_ids)
            t = time.perf_counter(); e.step(); ts.append(time.perf_counter() - t)
            toks += len(s.output_ids) - before
        print(json.dumps([statistics.median(ts), sum(ts) / max(toks, 1)]), flush=True)

if sys.argv[1] == "--child":
    child(sys.argv[2], sys.argv[3]); sys.exit()
a, b, config = sys.argv[1:4]
bursts = int(sys.argv[4]) if len(sys.argv) > 4 else 30
import os
trees = os.environ.get("PAIR_TREES", "").split(",")   # A's and B's checkouts (their Python), else this one
envs = [dict(os.environ, PAIR_SIDE=str(i), **({"PYTHONPATH": t} if t else {}))
        for i, t in enumerate(trees if len(trees) == 2 else ["", ""])]
procs = [subprocess.Popen([sys.executable, __file__, "--child", so, config], stdin=subprocess.PIPE, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for so, env in zip((a, b), envs)]
for p in procs: assert p.stdout.readline().strip() == "ready"
res = {0: [], 1: []}
for i in range(bursts):
    order = (0, 1) if i % 2 == 0 else (1, 0)
    for j in order:
        procs[j].stdin.write("20\n"); procs[j].stdin.flush()
        res[j].append(json.loads(procs[j].stdout.readline()))
for p in procs: p.stdin.close(); p.wait()
ratios = [y[0] / x[0] for x, y in zip(res[0], res[1])]
med = lambda j, c: statistics.median(r[c] for r in res[j]) * 1e3
print(f"{config}: A {med(0,0):.2f} ms/step ({med(0,1):.2f} ms/tok)  B {med(1,0):.2f} ({med(1,1):.2f})  "
      f"B/A median of paired bursts {statistics.median(ratios):.3f} (quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f})")
