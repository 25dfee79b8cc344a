import peagle.models.loader as L
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
ps = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:12]
for quant in (True, False):
    if not quant:
        L.integer_path = lambda m: False
    e = LLMEngine.from_pretrained(None, method="parallel", k=7, max_num_seqs=1)
    outs = e.generate([e.encode_prompt(p.text) for p in ps], SamplingParams(max_tokens=128, ignore_eos=True))
    print("q8 drafter" if quant else "bf16 drafter", "AL", round(e.stats.acceptance_length, 3), "per pos", [round(x, 3) for x in e.stats.per_position_acceptance][:4])
