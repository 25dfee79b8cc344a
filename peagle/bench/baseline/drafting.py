"""Section 4, drafting: the engine's own drafting call for K = 1..max_k, one P-EAGLE pass against K
EAGLE-3 passes, in ms and as a fraction of a one-token step."""
from __future__ import annotations

import copy
import dataclasses

import torch

from peagle.bench.baseline.common import fmt, median, timed_rounds
from peagle.bench.peers import time_once
from peagle.bench.peers.engine import EnginePeer


def bench_drafting(args, ours: EnginePeer, heads: dict, ctx: list[int], target_1tok_ms: float, bar) -> dict:
    """The engine's own drafting call (``ModelRunner.propose``) in a decode step's shape: a sequence
    at a context of C tokens has had K drafts verified; its expansion, the head's pass (P-EAGLE) or
    passes (EAGLE-3), the LM head and argmax are timed, re-run on the arguments the engine passed."""
    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.engine.sampling import SamplingParams

    def propose_call(method: str, k: int):
        # a pass costs the same whatever K the head was trained for: lift the engine's guard so the
        # table runs past it (a copy of the head sharing its weights, with no trained K)
        head = copy.copy(heads[method])
        head.cfg = dataclasses.replace(head.cfg, trained_k=None)
        engine = LLMEngine(ours.engine.target, head, EngineConfig(method=method, num_speculative_tokens=k,
                                                                  max_num_seqs=1))
        calls, propose = [], engine.runner.propose
        engine.runner.propose = lambda *a: calls.append(a) or propose(*a)
        engine.add_request(ctx, SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        engine.step()      # prefill, first drafts
        engine.step()      # verify K drafts, draft again: the call timed
        return lambda: time_once(lambda: propose(*calls[-1]), engine.device)

    ks = list(range(1, args.max_k + 1))
    with torch.inference_mode():
        calls = {(m, k): propose_call(m, k) for m in heads for k in ks}
        t, load = timed_rounds(args, bar, ks, {m: (ours, lambda k, m=m: calls[(m, k)]()) for m in heads})
    rows = []
    for k in ks:
        pm, em = 1e3 * median(t["parallel"][k]), 1e3 * median(t["eagle3"][k])
        rows.append({"k": k, "parallel_ms": pm, "parallel_frac_of_target": pm / target_1tok_ms,
                     "eagle3_ms": em, "eagle3_frac_of_target": em / target_1tok_ms, "eagle3_over_parallel": em / pm})
    return {"context": len(ctx), "other_cores": load, "target_1tok_ms": target_1tok_ms, "rows": rows,
            "heads": {m: {"num_layers": h.cfg.num_layers, "draft_vocab_size": h.cfg.draft_vocab_size}
                      for m, h in heads.items()}}


def markdown_drafting(res: dict) -> list[str]:
    a, out = res["args"], []
    dr = res["drafting"]
    hd = ", ".join(f"{m}: {h['num_layers']} layer(s), draft vocabulary {h['draft_vocab_size']}"
                   for m, h in dr["heads"].items())
    out.append(f"### 4. Drafting K tokens through `ModelRunner.propose` after a verify step (shipped heads, {hd}; "
               f"context {dr['context']}; median of {a['micro_reps']}; fraction of a {dr['target_1tok_ms']:.2f} ms "
               f"one-token step; other jobs kept {fmt(dr['other_cores'], 2)} cores busy, median)\n")
    out.append("| K | P-EAGLE 1 pass ms | / target | EAGLE-3 K passes ms | / target | EAGLE-3 / P-EAGLE |")
    out.append("|---|---|---|---|---|---|")
    for r in dr["rows"]:
        out.append(f"| {r['k']} | {fmt(r['parallel_ms'], 2)} | {fmt(r['parallel_frac_of_target'], 2)} | "
                   f"{fmt(r['eagle3_ms'], 2)} | {fmt(r['eagle3_frac_of_target'], 2)} | "
                   f"{fmt(r['eagle3_over_parallel'], 2)} |")
    out.append("")
    return out
