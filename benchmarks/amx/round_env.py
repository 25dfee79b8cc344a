import statistics, sys, time, os
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
KS = (0, 1, 7)
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
engines = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1, prompt_lookup_max=0) for k in KS}
for k, e in engines.items():
    e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
times = {k: [] for k in engines}
for _ in range(8):
    for k, e in engines.items():
        for _ in range(10):
            t = time.perf_counter(); e.step(); times[k].append(time.perf_counter() - t)
ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
print(os.environ.get("TAG", ""), " ".join(f"K={k} {ms[k]:.2f}ms ({ms[k]/ms[0]:.2f}x)" for k in KS), flush=True)
