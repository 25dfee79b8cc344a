"""The target's layer stack with its layers in one team (team.h) against one OpenMP region forked per operator
(``PEAGLE_NO_TEAM=1``), in one process, interleaved: ``none`` (one row) and P-EAGLE at K=7 (8 verify rows) on
MT-Bench prompt 1, 16 rounds of 10 steps each way, alternating which goes first; medians of the step and of
``native_stack`` (wall, ms). Two threads (the machine's cores) unless PEAGLE_TORCH_THREADS says otherwise.

    python docs/results/team/stack_ab.py
"""
import os
import statistics
import time

import peagle.models.llama as llama
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
stack_s: list[float] = []
plain_stack = llama.LlamaModel.native_stack


def timed(self, *args):
    t = time.perf_counter()
    out = plain_stack(self, *args)
    stack_s.append(time.perf_counter() - t)
    return out


llama.LlamaModel.native_stack = timed
print("| pass | layers | step ms | target stack ms |\n|---|---|---|---|")
for k in (0, 7):
    engine = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1)
    engine.add_request(engine.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
    for _ in range(5):
        engine.step()
    steps, stacks = {True: [], False: []}, {True: [], False: []}
    for r in range(16):
        for team in ((False, True) if r % 2 else (True, False)):
            if team:
                os.environ.pop("PEAGLE_NO_TEAM", None)
            else:
                os.environ["PEAGLE_NO_TEAM"] = "1"
            for _ in range(10):
                stack_s.clear()
                t = time.perf_counter()
                engine.step()
                steps[team].append(time.perf_counter() - t)
                stacks[team].append(sum(stack_s))
    os.environ.pop("PEAGLE_NO_TEAM", None)
    for team in (False, True):
        print(f"| {'one row' if k == 0 else 'K=7 round (8 rows)'} | {'one team' if team else 'a region an operator'} | "
              f"{statistics.median(steps[team]) * 1e3:.3f} | {statistics.median(stacks[team]) * 1e3:.3f} |")
