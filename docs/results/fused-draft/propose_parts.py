"""`propose`'s parts timed, as the step-by-step pass ran them before `peagle::draft` (a copy of that pass with
timers: the record of what the call replaced).

    python docs/results/fused-draft/propose_parts.py 1
"""
import sys, time, statistics, collections, torch
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams, argmax
from peagle.prompts import dataset_path, read_prompt_file
import peagle.engine.model_runner as mr
from peagle.engine.expansion import expand
from peagle.models.attention import AttnMeta, Span
from peagle.runtime import to_device
S = collections.defaultdict(list)
def propose(self, spans, ids, positions, cu, num_valid, taps, bonus, k, tables=None):
    t = [time.perf_counter()]
    mark = lambda: t.append(time.perf_counter())
    d, dev, ranks = self.drafter, self.device, self.bounds.ranks
    num_masks = k - 1
    b = expand(ids, positions, to_device(cu, dev), num_valid, bonus, num_masks, d.cfg.mask_token_id); mark()
    hidden = d.project(taps); mark()
    hidden = hidden[b.hidden_map.clamp(min=0)]
    if num_masks:
        hidden = torch.where(b.is_masked[:, None], self.mask_feature, hidden)
    mark()
    bs = self.cfg.block_size
    meta = AttnMeta([Span(s.num_rows + num_masks, s.ctx_len + num_masks, s.block_table) for s in spans], bs, no_write=b.is_rejected)
    c = d.cfg
    meta = meta.for_layers(b.positions, self.drafter_caches, hidden, c.head_dim, c.num_heads // c.num_kv_heads); mark()
    rope = d.rotary.table(b.positions, hidden.dtype); mark()
    ok = d.stacks(hidden, self.drafter_caches, meta); mark()
    first, residual = d.midlayer.inputs(d.embed(b.input_ids), hidden); mark()
    from peagle.models.drafter import native_layers
    x, _ = native_layers(residual, d._stack_weights, rope, self.drafter_caches, meta, [0] * c.num_layers, c.num_heads,
                         c.head_dim, d.midlayer.self_attn.scale, c.rms_norm_eps, [], first); mark()
    rows = b.sample_idx.flatten()
    normed = d.norm(x[rows]); mark()
    logits = d.logits(normed); mark()
    best = argmax(logits)[:, None]
    drafts = d.to_target_ids(best).view(len(spans), -1, ranks); mark()
    names = ["expand", "fc", "gather/where", "meta", "rope", "stacks", "inputs", "layers", "norm", "lmhead", "argmax/d2t"]
    for n, a, z in zip(names, t, t[1:]): S[n].append(z - a)
    S["total"].append(t[-1] - t[0])
    return drafts
mr.ModelRunner.propose = propose
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
k = int(sys.argv[1])
e = LLMEngine.from_pretrained(None, method="parallel", k=k, max_num_seqs=1)
e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
for _ in range(20): e.step()
S.clear()
for _ in range(200): e.step()
print(f"K={k}: " + "  ".join(f"{n} {statistics.median(v)*1e3:.3f}" for n, v in S.items()))
