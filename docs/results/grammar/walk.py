"""peagle.engine.grammar as the engine would use it: Grammars() once, then a chain verify step with K=7
drafts on the nested schema's document: fill 8 rows, accept 7, roll back 7; and apply to [8, 49152]."""
import json, time, statistics, torch
from peagle.engine.grammar import Grammars, StructuredOutput, apply
from peagle.models.loader import resolve_target, load_tokenizer
from peagle.bench.grammar_costs import NESTED, NESTED_DOC
torch.set_num_threads(1)
tok = load_tokenizer(resolve_target(None))
t = time.perf_counter(); g = Grammars(tok, 49152, {tok.eos_token_id}); print(f"Grammars(): {1e3*(time.perf_counter()-t):.0f} ms")
so = StructuredOutput("json_schema", json.dumps(NESTED))
t = time.perf_counter(); g.matcher(so); print(f"first matcher (compile): {1e3*(time.perf_counter()-t):.1f} ms")
t = time.perf_counter(); g.matcher(so); print(f"cached matcher: {1e6*(time.perf_counter()-t):.1f} us")
ids = tok.encode(json.dumps(NESTED_DOC), add_special_tokens=False)
mask = g.new_mask(8); logits = torch.randn(8, 49152); steps = []
for _ in range(3):
    m = g.matcher(so)
    for p in range(len(ids) - 7):
        a = time.perf_counter_ns()
        for j in range(7):
            m.fill(mask, j); m.accept(ids[p + j])
        m.fill(mask, 7); m.rollback(7)
        steps.append((time.perf_counter_ns() - a) / 1e3)
        m.accept(ids[p])
x = [logits.clone() for _ in range(200)]; ap = []
for y in x:
    a = time.perf_counter_ns(); apply(y, mask); ap.append((time.perf_counter_ns() - a) / 1e3)
print(f"K=7 chain walk (8 fills, 7 accepts, rollback 7): median {statistics.median(steps):.0f} us, p90 {statistics.quantiles(steps, n=10)[-1]:.0f} us")
print(f"apply [8, 49152]: median {statistics.median(ap):.0f} us")
