"""Engine steps in a loop for `perf record` (K=0: `none`): python docs/results/attn-tail/steps_loop.py K PROMPT_TOKENS SECONDS"""
import sys, time
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
texts = [p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")]
k = int(sys.argv[1]); plen = int(sys.argv[2])
e = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1, prompt_lookup_max=0)
ids = [t for text in texts for t in e.encode_prompt(text)]
s = e.add_request(ids[:plen], SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
while not s.output_ids: e.step()
print("ready", flush=True)
t = time.time()
while time.time() - t < float(sys.argv[3]): e.step()
