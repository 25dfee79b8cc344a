"""Decode speed of llama.cpp's engine in-process (llama-cpp-python; F32 / F16 / BF16 / Q4_1 files made
from the shipped one), HF transformers (float32, bfloat16) and peagle's engine (`none` on the GGUF as
shipped, the default, and with float32, float16 and bfloat16 weights; `generate`'s defaults: P-EAGLE,
K chosen by the engine; P-EAGLE with bfloat16 weights), on the same MT-Bench prompts (chat template, token ids from peagle's tokenizer), greedy, 128 new
tokens, EOS ignored. Decode rate = (tokens - 1) / (time after the first token); rounds interleave the
systems.

    python benchmarks/cpu-roofline/engines.py [ROUNDS] [PROMPTS] [SYSTEMS]   # SYSTEMS: peagle,llama,hf,q8
"""
import statistics
import sys
import time

from peagle.bench.peers import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
num_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 6
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:num_prompts]


def peagle_system(method, dtype, quantization=None, target=None):
    engine = LLMEngine.from_pretrained(target, method=method, k="auto", dtype=dtype, max_num_seqs=1,
                                       quantization=quantization)
    ids = [engine.encode_prompt(p.text) for p in prompts]

    def run(i):
        out = engine.generate([ids[i]], SamplingParams(max_tokens=N, ignore_eos=True))[0]
        return (N - 1) / (out.elapsed_s - out.ttft_s)
    return ids, run


def hf_system(dtype, ids):
    import torch
    from transformers import AutoModelForCausalLM

    from peagle.models.loader import resolve_target

    model = AutoModelForCausalLM.from_pretrained(str(resolve_target(None)), dtype=getattr(torch, dtype)).eval()

    def run(i):
        x = torch.tensor([ids[i]])
        with torch.inference_mode():
            out = model(x, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t = time.perf_counter()
            for _ in range(N - 1):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (N - 1) / (time.perf_counter() - t)
    return run


def llama_system(kind, ids):
    from llama_cpp import Llama

    llm = Llama(model_path=str(llamacpp.gguf_file(kind)), n_threads=2, n_threads_batch=2, n_ctx=2048,
                n_batch=llamacpp.safe_batch(kind) or 512, verbose=False)

    def run(i):
        llm.reset()
        llm.eval(ids[i])
        tok = llm.sample(top_k=1, temp=0.0)
        t = time.perf_counter()
        for _ in range(N - 1):
            llm.eval([tok])
            tok = llm.sample(top_k=1, temp=0.0)
        return (N - 1) / (time.perf_counter() - t)
    return run


which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["peagle", "llama", "hf"]
ids, none_q = peagle_system("none", "auto")
systems = {}
if "peagle" in which:
    systems["peagle none, the GGUF as shipped (Q4_1, Q8_0 head; the default)"] = none_q
    systems["peagle generate defaults (P-EAGLE, auto K, the GGUF as shipped)"] = peagle_system("parallel", "auto")[1]
    systems["peagle none, bfloat16 weights"] = peagle_system("none", "bfloat16", "none")[1]
    systems["peagle none, float16 weights"] = peagle_system("none", "float16", "none")[1]
    systems["peagle none, float32"] = peagle_system("none", "float32", "none")[1]
    systems["peagle P-EAGLE, bfloat16 weights"] = peagle_system("parallel", "bfloat16", "none")[1]
if "llama" in which:
    for kind in ("F32", "F16", "BF16", "Q4_1"):
        systems[f"llama.cpp {kind}"] = llama_system(kind, ids)
if "q8" in which:  # the Q8_0 file llama.cpp's quantizer makes from the shipped one, run by both
    systems["peagle none, Q8_0 GGUF"] = peagle_system("none", "auto", target=str(llamacpp.gguf_file("Q8_0")))[1]
    systems["llama.cpp Q8_0"] = llama_system("Q8_0", ids)
if "hf" in which:
    for dtype in ("float32", "bfloat16"):
        systems[f"HF transformers {dtype}"] = hf_system(dtype, ids)
for run in systems.values():  # warm-up
    run(0)
rates = {name: [] for name in systems}
for _ in range(rounds):
    for name, run in systems.items():
        for i in range(len(prompts)):
            rates[name].append(run(i))
print(f"| system | decode tok/s (median of {rounds} x {len(prompts)}) |\n|---|---|")
for name, xs in rates.items():
    print(f"| {name} | {statistics.median(xs):.1f} |")
