import json, sys
from peagle.train.data import load_records, is_eval
from peagle.train.synth import read_responses
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
recs = [r for r in read_responses("data/synth/gemma-3-270m") if is_eval(r["id"], 0.02)][:4]
eng = LLMEngine.from_pretrained("gemma3", method="parallel", k=7, max_num_seqs=4)
for r in recs:
    eng.add_request(r["prompt_token_ids"], SamplingParams(temperature=0, max_tokens=128), r["id"])
done = []
while len(done) < len(recs):
    done += eng.step().finished
for s in done:
    r = next(x for x in recs if x["id"] == s.request_id)
    print(s.request_id, "same as synth:", s.output_ids == r["response_token_ids"][:len(s.output_ids)])
print("stats", eng.stats.acceptance_length if hasattr(eng, "stats") else None)
