"""What a grammar costs on this CPU, for choosing the structured-output backend: xgrammar, llguidance and
outlines-core on the default model's tokenizer. Compile time per kind of constraint, per-token mask fill,
accept and rollback (1-7 tokens, as speculative verification walks drafts and steps back), and applying a
mask to [8, vocab] float32 logits. Single-threaded; run pinned to one core:

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/grammar_costs.py --out /tmp/grammar

The libraries are imported here only; the engine uses the chosen one (``peagle.engine.grammar``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

FLAT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                          "email": {"type": "string"}},
        "required": ["name", "age", "email"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {
    "order_id": {"type": "string"},
    "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
    "customer": {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
                 "required": ["name", "city"], "additionalProperties": False},
    "items": {"type": "array", "items": {
        "type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"},
                                         "price": {"type": "number"}},
        "required": ["sku", "quantity", "price"], "additionalProperties": False}},
    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["order_id", "status", "customer", "items", "tags"], "additionalProperties": False}
CONSTRAINED = {"type": "object", "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "count": {"type": "integer", "minimum": 1, "maximum": 100},
    "score": {"type": "number", "minimum": 0}},
    "required": ["code", "count", "score"], "additionalProperties": False}
NESTED_DOC = {"order_id": "A-10293", "status": "shipped", "customer": {"name": "Maria Lopez", "city": "Seville"},
              "items": [{"sku": "KB-204", "quantity": 1, "price": 49.99},
                        {"sku": "MS-118", "quantity": 2, "price": 19.5},
                        {"sku": "USB-C-2M", "quantity": 3, "price": 7.25}],
              "tags": ["gift", "express", "priority"]}
REGEX = r"[A-Z][a-z]+ [A-Z][a-z]+, born (19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
EBNF = r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"'''
LARK = r'''start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: /[0-9]+/ | "(" expr ")"'''

# name -> (kind, spec, a document it accepts, for the per-token figures)
CASES: dict[str, tuple[str, object, str]] = {
    "any JSON object": ("json", {"type": "object"}, json.dumps(NESTED_DOC)),
    "schema: flat": ("schema", FLAT, json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"})),
    "schema: nested, arrays, enum": ("schema", NESTED, json.dumps(NESTED_DOC)),
    "schema: pattern, minimum": ("schema", CONSTRAINED, json.dumps({"code": "XKQ-2041", "count": 17, "score": 3.5})),
    "regex": ("regex", REGEX, "Grace Hopper, born 1906-12-09"),
    "EBNF/Lark grammar": ("grammar", None, "(12+7)*3-4/2"),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-char table (byte-level BPE token strings use it)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab: int):
        import xgrammar as xgr
        self.xgr = xgr
        t = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
        self.setup_s = time.perf_counter() - t

    def compile(self, kind: str, spec) -> object:
        c = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        if kind == "json":
            return c.compile_json_schema(json.dumps(spec), strict_mode=False)  # as peagle.engine.grammar
        if kind == "schema":
            return c.compile_json_schema(json.dumps(spec))  # library defaults; the bound on whitespace: whitespace.py
        if kind == "regex":
            return c.compile_regex(spec)
        return c.compile_grammar(EBNF)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, mask: torch.Tensor, row: int) -> None:
        m.fill_next_token_bitmask(mask, row)

    def accept(self, m, t: int) -> bool:
        return m.accept_token(t)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)

    def terminated(self, m) -> bool:
        return m.is_terminated()

    def apply(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, mask)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self.ll = llguidance
        t = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tok, vocab)
        self.setup_s = time.perf_counter() - t

    def compile(self, kind: str, spec) -> object:
        M = self.ll.LLMatcher
        g = {"json": lambda: M.grammar_from_json_schema(spec), "schema": lambda: M.grammar_from_json_schema(spec),
             "regex": lambda: M.grammar_from_regex(spec), "grammar": lambda: M.grammar_from_lark(LARK)}[kind]()
        m = M(self.tok, g)
        assert not m.is_error(), m.get_error()
        return m  # llguidance compiles into a matcher (lazily: masks build the lexer's states as they go)

    def matcher(self, compiled):
        return compiled.deep_copy()  # a fresh state, sharing the compiled grammar's caches

    def fill(self, m, mask: torch.Tensor, row: int) -> None:
        self.ll.torch.fill_next_token_bitmask(m, mask, row)

    def accept(self, m, t: int) -> bool:
        return m.consume_token(t)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)

    def terminated(self, m) -> bool:
        return m.is_stopped()

    def apply(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        self.ll.torch.apply_token_bitmask_inplace(logits, mask)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, vocab: int):
        import outlines_core
        self.oc = outlines_core
        t = time.perf_counter()
        dec = {c: b for b, c in _bytes_to_unicode().items()}
        special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
        table: dict[bytes, list[int]] = {}
        for s, i in tok.get_vocab().items():
            if i not in special:
                table.setdefault(bytes(dec[c] for c in s), []).append(i)
        self.vocab = outlines_core.Vocabulary(tok.eos_token_id, table)
        self.setup_s = time.perf_counter() - t

    def compile(self, kind: str, spec) -> object:
        if kind == "grammar":
            raise NotImplementedError("outlines-core takes regexes and JSON schemas only")
        regex = spec if kind == "regex" else self.oc.json_schema.build_regex_from_schema(json.dumps(spec))
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled):
        return self.oc.Guide(compiled, max_rollback=16)

    def fill(self, m, mask: torch.Tensor, row: int) -> None:
        r = mask[row]
        m.write_mask_into(r.data_ptr(), r.numel(), 4)

    def accept(self, m, t: int) -> bool:
        try:
            m.advance(t, return_tokens=False)
        except ValueError:
            return False
        return True

    def rollback(self, m, n: int) -> None:
        m.rollback_state(n)

    def terminated(self, m) -> bool:
        return m.is_finished()

    def apply(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        from outlines_core.kernels.torch import apply_token_bitmask_inplace
        apply_token_bitmask_inplace(logits, mask)


def _us(f: Callable[[], object]) -> float:
    t = time.perf_counter_ns()
    f()
    return (time.perf_counter_ns() - t) / 1e3


def torch_apply(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """The library-free way: unpack the int32 bitmask into booleans and fill -inf where a bit is 0."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((mask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :logits.shape[1]]
    logits.masked_fill_(~allowed, float("-inf"))


def measure(lib, tok, vocab: int, eos: int, repeats: int) -> dict:
    out: dict[str, dict] = {}
    mask = torch.zeros((8, (vocab + 31) // 32), dtype=torch.int32)
    for case, (kind, spec, doc) in CASES.items():
        r: dict[str, object] = {}
        try:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                compiled = lib.compile(kind, spec)
                times.append(time.perf_counter() - t)
                if times[-1] > 5:
                    break
        except NotImplementedError as e:
            out[case] = {"unsupported": str(e)}
            continue
        r["compile_ms"] = 1e3 * statistics.median(times)
        m = lib.matcher(compiled)
        r["first_mask_ms"] = _us(lambda: lib.fill(m, mask, 0)) / 1e3
        ids = tok.encode(doc, add_special_tokens=False)
        r["doc_tokens"] = len(ids)
        fills, accepts, rolls = [], [], {k: [] for k in range(1, 8)}
        for rep in range(repeats):
            m = lib.matcher(compiled)
            for p, t in enumerate(ids):
                fills.append(_us(lambda: lib.fill(m, mask, 0)))
                if not (mask[0, t // 32] >> (t % 32)) & 1:
                    raise AssertionError(f"{lib.name} {case}: the mask forbids token {p} ({tok.decode([t])!r})")
                k = (rep + p) % 7 + 1  # rollback depths 1-7, spread over positions
                ahead = ids[p:p + k]
                if len(ahead) == k:
                    for a in ahead:
                        accepts.append(_us(lambda: lib.accept(m, a)))
                    rolls[k].append(_us(lambda: lib.rollback(m, k)))
                assert lib.accept(m, t), f"{lib.name} {case}: token {p} refused"
            lib.fill(m, mask, 0)
            r["eos_allowed_at_end"] = bool((mask[0, eos // 32] >> (eos % 32)) & 1)
            r["accepts_eos"] = bool(lib.accept(m, eos))
            r["terminated_after_eos"] = bool(lib.terminated(m))
        r["fill_us_median"] = statistics.median(fills)
        r["fill_us_p90"] = statistics.quantiles(fills, n=10)[-1]
        r["fill_us_max"] = max(fills)
        r["accept_us_median"] = statistics.median(accepts)
        r["rollback_us_median"] = {k: statistics.median(v) for k, v in rolls.items() if v}
        out[case] = r
    logits = torch.randn(8, vocab)
    t = []
    for _ in range(200):
        x = logits.clone()
        t.append(_us(lambda: lib.apply(x, mask)))
    out["apply_8x_us_median"] = statistics.median(t)
    return out


def apply_costs(vocab: int) -> dict[str, float]:
    """Applying a mask (random bits) to [8, vocab] float32 logits without the libraries' kernels: bits
    unpacked in torch, and peagle's byte-table lookup (:func:`peagle.engine.grammar.apply`), all 8 rows
    and 1 of them."""
    from peagle.engine.grammar import apply
    mask = torch.randint(-2**31, 2**31 - 1, (8, (vocab + 31) // 32), dtype=torch.int32)
    logits = torch.randn(8, vocab)
    out = {}
    for name, f in (("torch_unpack_masked_fill_8_rows", lambda x: torch_apply(x, mask)),
                    ("peagle_apply_8_rows", lambda x: apply(x, mask)),
                    ("peagle_apply_1_of_8_rows", lambda x: apply(x, mask, [3]))):
        t = []
        for _ in range(200):
            x = logits.clone()
            t.append(_us(lambda: f(x)))
        out[name + "_us_median"] = statistics.median(t)
    return out


def summary(results: dict) -> str:
    """A markdown table: a row per case, per library compile ms / fill us median (p90) / accept us /
    rollback us (median of the 1-7 token medians); then tokenizer setup and the 8-row apply."""
    libs = [k for k in results if isinstance(results[k], dict) and "apply_8x_us_median" in results[k]]
    lines = ["| case | " + " | ".join(f"{n}: compile ms / fill us med (p90) / accept us / rollback us" for n in libs)
             + " |", "|---|" + "---|" * len(libs)]
    for case in CASES:
        cells = []
        for n in libs:
            r = results[n][case]
            if "unsupported" in r:
                cells.append("not supported")
                continue
            rb = statistics.median(r["rollback_us_median"].values())
            cells.append(f"{r['compile_ms']:.1f} / {r['fill_us_median']:.1f} ({r['fill_us_p90']:.0f}) / "
                         f"{r['accept_us_median']:.2f} / {rb:.2f}")
        lines.append(f"| {case} ({results[libs[0]][case].get('doc_tokens', '?')} tokens) | " + " | ".join(cells) + " |")
    lines.append("| tokenizer table, once | " + " | ".join(f"{results[n]['tokenizer_setup_ms']:.0f} ms" for n in libs) + " |")
    lines.append("| apply an [8, vocab] mask | " + " | ".join(f"{results[n]['apply_8x_us_median']:.0f} us" for n in libs) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libs", default="xgrammar,llguidance,outlines-core")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="folder for grammar_costs.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from peagle.bench.machine import cpu_name
    from peagle.models.loader import load_tokenizer, resolve_target
    tok = load_tokenizer(resolve_target(None))
    vocab, eos = len(tok), tok.eos_token_id
    libs = {c.name: c for c in (XGrammar, LLGuidance, OutlinesCore)}
    results: dict[str, object] = {"cpu": cpu_name(), "vocab": vocab, "eos": eos, "threads": 1}
    for name in a.libs.split(","):
        lib = libs[name](tok, vocab)
        r = measure(lib, tok, vocab, eos, a.repeats)
        r["tokenizer_setup_ms"] = 1e3 * lib.setup_s
        results[name] = r
        print(name, json.dumps(r, indent=1), flush=True)
    results["library_free_apply"] = apply_costs(vocab)
    print(json.dumps(results["library_free_apply"]))
    table = summary(results)
    print(table)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "grammar_costs.json").write_text(json.dumps(results, indent=1) + "\n")
        (a.out / "grammar_costs.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
