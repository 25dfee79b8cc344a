import os
import statistics

from peagle.bench.steps import begin, step_times
from peagle.engine.llm_engine import LLMEngine
from peagle.prompts import dataset_path, read_prompt_file
KS = (0, 1, 7)
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
engines = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1, prompt_lookup_max=0) for k in KS}
begin(engines, engines[0].encode_prompt(text))
times = step_times(engines, 8, 10)
ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
print(os.environ.get("TAG", ""), " ".join(f"K={k} {ms[k]:.2f}ms ({ms[k]/ms[0]:.2f}x)" for k in KS), flush=True)
