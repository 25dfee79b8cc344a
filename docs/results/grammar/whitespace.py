"""xgrammar: what bounding JSON whitespace costs (nested schema, 139 tokens); peagle.engine.grammar uses 32.
Run: taskset -c 0 env OMP_NUM_THREADS=1 PYTHONPATH=. python docs/results/grammar/whitespace.py"""
import json, time, statistics, torch, xgrammar as xgr
from peagle.models.loader import resolve_target, load_tokenizer
from peagle.bench.grammar_costs import NESTED, NESTED_DOC
tok = load_tokenizer(resolve_target(None))
info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152)
ids = tok.encode(json.dumps(NESTED_DOC), add_special_tokens=False)
mask = xgr.allocate_token_bitmask(1, 49152)
for name, kw in [("unbounded", {}), ("cnt 32", {"max_whitespace_cnt": 32}), ("cnt 16", {"max_whitespace_cnt": 16}), ("cnt 8", {"max_whitespace_cnt": 8}), ("cnt 4", {"max_whitespace_cnt": 4}), ("no any_whitespace", {"any_whitespace": False})]:
    c = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t = time.perf_counter(); g = c.compile_json_schema(json.dumps(NESTED), **kw); ct = time.perf_counter() - t
    fills = []
    for _ in range(3):
        m = xgr.GrammarMatcher(g)
        for x in ids:
            a = time.perf_counter_ns(); m.fill_next_token_bitmask(mask, 0); fills.append((time.perf_counter_ns() - a) / 1e3)
            ok = m.accept_token(x)
    print(f"{name}: compile {ct*1e3:.1f} ms, fill median {statistics.median(fills):.1f} us p90 {statistics.quantiles(fills, n=10)[-1]:.0f} accepted {ok}")
