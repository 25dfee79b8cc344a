"""Structured outputs in the engine, with speculation on: the constrained plain output is schema-valid JSON;
speculative decoding (chains, a token tree, greedy and seeded) gives that output token for token with
drafts accepted; drafts the grammar forbids are pruned before they cost a row; rows masked with the wrong
state are caught. The target is the tiny Llama with SmolLM2's tokenizer."""
from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from speculation import PERSON_SCHEMA, OracleDrafter, Watch, blank_tokens, make_engine

from peagle.cli import main
from peagle.engine import processors, scheduler
from peagle.engine.grammar import GrammarError, StructuredOutput
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

SCHEMA = PERSON_SCHEMA
JSON = StructuredOutput("json_schema", json.dumps(SCHEMA))
TREE = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"
DEAD_END = StructuredOutput("regex", "ab\x14c")   # no SmolLM2 token spells the byte 0x14: after "ab", nothing can
GREEDY = SEEDED = SamplingParams()


@pytest.fixture(scope="module")
def plain(tiny_chat_dir):
    """The engine without a head, and the sampling: a random model likes JSON's optional whitespace, so its
    whitespace tokens are biased down (logit_bias beside the grammar), and its output ends."""
    global GREEDY, SEEDED
    e = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32")
    blank = {i: -100.0 for i in blank_tokens(e.tokenizer)}
    GREEDY = SamplingParams(max_tokens=96, structured=JSON, logit_bias=blank)
    SEEDED = dataclasses.replace(GREEDY, temperature=0.8, seed=4)
    return e


def engine(plain: LLMEngine, head, method: str, k: int, **kw) -> LLMEngine:
    e = make_engine(plain.target, head, method, k, **kw)
    e.tokenizer = plain.tokenizer
    return e


def prompts(plain) -> list[list[int]]:
    return [plain.encode_prompt(t) for t in ("Describe a person as JSON.", "A user record, please.")]


def test_constrained_plain_output_is_valid_json(plain):
    for params in (GREEDY, SEEDED):
        for out in plain.generate(prompts(plain), params):
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)


def test_speculation_equals_constrained_plain_decoding(plain):
    """The oracle drafts the constrained output (every 4th position wrong): chains, a tree, a batch with chunked
    prompts, greedy and seeded, all give plain decoding's tokens with drafts accepted."""
    ps = prompts(plain)
    for params in (GREEDY, SEEDED):
        ref = [o.token_ids for o in plain.generate(ps, params)]
        head = OracleDrafter.of(plain.target, {tuple(p): p + r for p, r in zip(ps, ref)}, 4)
        for method, kw in (("parallel", {}), ("eagle3", {}), ("parallel", dict(speculative_token_tree=TREE)),
                           ("parallel", dict(max_num_seqs=2, max_num_batched_tokens=11))):
            e = engine(plain, head, method, 4, **kw)
            head.bind(e)
            watch = Watch(e)
            got = [o.token_ids for o in e.generate(ps, params)]
            watch.check(got, ref, rate=0.25 if "speculative_token_tree" in kw else 1 / 3)


def test_forbidden_drafts_are_pruned_before_verification(plain, monkeypatch):
    """A head drafting the constrained output with every other position wrong (a wrong token the grammar
    mostly forbids): no verified draft is one the grammar forbids after its path (every verified tree is its
    own pruning), some were pruned, the right ones accepted (a pruning that cut every draft, or a verifier
    that rejected them, fails here), output unchanged; unpruned, the masks' walk over the drafts stops at the
    first forbidden one."""
    ps = prompts(plain)
    ref = [o.token_ids for o in plain.generate(ps, GREEDY)]
    head = OracleDrafter.of(plain.target, {tuple(p): p + r for p, r in zip(ps, ref)}, 2)
    pruned, real = [0], processors.allowed_tree

    def counting(seq):
        tree = real(seq)
        pruned[0] += len(seq.tree) - len(tree)
        return tree

    monkeypatch.setattr(scheduler, "allowed_tree", counting)
    e = head.bind(engine(plain, head, "parallel", 4, speculative_token_tree=TREE))
    run = e.runner.run

    def checked(work, tree):
        for seq, _ in work:
            assert real(seq) == seq.tree, "a verified draft is one the grammar forbids"
        return run(work, tree)

    e.runner.run = checked
    assert [o.token_ids for o in e.generate(ps, GREEDY)] == ref
    assert pruned[0] > 0 and e.stats.num_accepted_tokens > 0, (pruned[0], e.stats.num_accepted_tokens)
    monkeypatch.setattr(scheduler, "allowed_tree", lambda seq: seq.tree)   # planted: nothing pruned
    with pytest.raises(RuntimeError, match="not allowed by the request's grammar"):
        head.bind(engine(plain, head, "parallel", 4)).generate(ps, GREEDY)


def test_rows_masked_with_the_roots_state_are_caught(plain, monkeypatch):
    """Every row masked by the grammar's state before the drafts (and nothing pruned): a token the grammar
    forbids after its path is emitted, and the engine refuses to take it in."""
    ps = prompts(plain)
    ref = [o.token_ids for o in plain.generate(ps, GREEDY)]
    head = OracleDrafter.of(plain.target, {tuple(p): p + r for p, r in zip(ps, ref)}, 4)
    monkeypatch.setattr(processors, "row_histories", lambda seq: [[] for _ in seq.tree.lineage])
    monkeypatch.setattr(processors, "allowed_tree", lambda seq: seq.tree)
    monkeypatch.setattr(scheduler, "allowed_tree", lambda seq: seq.tree)
    e = engine(plain, head, "parallel", 4)
    head.bind(e)
    with pytest.raises(RuntimeError, match="not allowed by the request's grammar"):   # the emitted token's check
        e.generate(ps, GREEDY)


def test_a_grammars_dead_end_mid_output_ends_that_request_alone(plain):
    """A regex that asks, after "ab", for a byte no token spells (admission sees only its start): that request
    ends with finish_reason "error" and its reason after the text it could write, while the request beside it,
    in the same steps, gives its output alone; plain and speculative (drafts accepted), greedy and seeded."""
    ps = prompts(plain)
    for params in (GREEDY, SEEDED):
        alone = plain.generate([ps[1]], params)[0].token_ids
        head = OracleDrafter.of(plain.target, {tuple(ps[1]): ps[1] + alone}, 4)
        spec = engine(plain, head, "parallel", 4)
        head.bind(spec)
        watch = Watch(spec)
        for e in (plain, spec):
            dead, beside = e.generate(ps, [dataclasses.replace(params, structured=DEAD_END), params])
            assert (dead.finish_reason, dead.text) == ("error", "ab"), dead
            assert "regex allows no token this model's tokenizer can write" in dead.error
            assert beside.token_ids == alone and beside.finish_reason == "stop" and beside.error is None
        assert spec.stats.num_accepted_tokens >= len(alone) / 3, "the request beside accepted no drafts"


def test_min_tokens_past_the_grammars_end_stop_it_there(plain):
    """``min_tokens`` beyond every output the grammar allows: once the grammar is complete only a stop token may
    come, so the request stops there, short (rather than sampling from a row with nothing allowed), and the
    request beside it is untouched; greedy and seeded."""
    ps = prompts(plain)
    for params in (GREEDY, SEEDED):
        alone = plain.generate([ps[1]], params)[0].token_ids
        short = dataclasses.replace(params, structured=StructuredOutput("regex", "ab"), min_tokens=5)
        out, beside = plain.generate(ps, [short, params])
        assert (out.text, out.finish_reason) == ("ab", "stop") and beside.token_ids == alone


def test_generate_prints_what_it_could_write_and_the_dead_end_and_fails(tiny_chat_dir, capsys):
    assert main(["generate", "--target", str(tiny_chat_dir), "--method", "none", "--dtype", "float32",
                 "--regex", DEAD_END.spec, "--max-new-tokens", "8", "Say ab."]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("ab\n") and "peagle: the regex allows no token this model's tokenizer can write" in err


def test_a_malformed_schema_is_refused_at_once(plain):
    with pytest.raises(GrammarError, match="JSON schema"):
        plain.add_request([1, 2, 3], SamplingParams(structured=StructuredOutput("json_schema", '{"type": "objec"}')))
    assert not plain.has_unfinished()


def test_a_temperature_past_float32s_range_keeps_to_the_grammar(plain):
    """temperature=5e307 (the API fuzzer's): float32 divides by inf, and a forbidden token's -inf became NaN, so
    the row fell back to uniform over every token and the request failed on a token the regex forbids. Now it is
    uniform over the allowed tokens: the output matches the regex."""
    params = SamplingParams(max_tokens=8, temperature=5e307, top_k=198993, seed=1,
                            structured=StructuredOutput("regex", "Snapshot"))
    out = plain.generate(prompts(plain)[:1], params)[0]
    assert (out.text, out.finish_reason) == ("Snapshot", "stop"), (out.text, out.error)
