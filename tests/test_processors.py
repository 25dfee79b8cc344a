"""The sampling fields that change the target's logits (logit_bias, min_tokens, repetition, frequency and
presence penalties): plain decoding applies them as a token-by-token reference does, and speculation (chains,
trees, batches, seeded) gives plain decoding's tokens with drafts accepted; a verifier that processed every
row with its root's history would be caught. ``speculative=False`` opts one request out of drafting."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import native_from_hf, run_full, tiny_hf
from speculation import OracleDrafter, Watch, make_engine, oracle_run, prompts, references

from peagle.engine import processors
from peagle.engine.sampling import SamplingParams

EOS = 2
PLAIN = SamplingParams(max_tokens=24)
FIELDS = {  # each changes the tiny model's greedy output on the test prompts
    "bias": dict(logit_bias={7: 0.25, 40: -100.0, 91: 0.2}),
    "repetition": dict(repetition_penalty=1.8),
    "frequency": dict(frequency_penalty=1.5),
    "presence": dict(presence_penalty=2.0),
    "min_tokens": dict(min_tokens=20, logit_bias={EOS: 8.0}),   # EOS likely, held off until 20 tokens
    "all": dict(logit_bias={7: 0.2}, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4,
                min_tokens=6),
}


@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


def reference(target, prompt: list[int], p: SamplingParams) -> list[int]:
    """Greedy decoding with ``p``'s fields, one token at a time over a full prefill, each field applied to
    each vocabulary entry in turn (vLLM's order: bias, min_tokens, repetition, frequency, presence)."""
    ids = list(prompt)
    for t in range(p.max_tokens):
        row = run_full(target, torch.tensor(ids))[0][-1].float().clone()
        out = ids[len(prompt):]
        for tok in range(row.shape[0]):
            x = row[tok] + (p.logit_bias or {}).get(tok, 0.0)
            if t < p.min_tokens and tok == EOS:
                x = torch.tensor(float("-inf"))
            if tok in ids and p.repetition_penalty != 1:
                x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
            x = x - p.frequency_penalty * out.count(tok)
            x = x - p.presence_penalty * (tok in out)
            row[tok] = x
        ids.append(int(row.argmax()))
        if ids[-1] == EOS and not p.ignore_eos:
            break
    return ids[len(prompt):]


@pytest.mark.parametrize("name", list(FIELDS))
def test_plain_decoding_applies_each_field_as_the_reference(llama, name):
    ps = prompts(2, seed=21)
    p = dataclasses.replace(PLAIN, **FIELDS[name])
    got = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, p)]
    assert got == [reference(llama, x, p) for x in ps]
    assert got != [o.token_ids for o in make_engine(llama, None, "none").generate(ps, PLAIN)], "the field did nothing"


@pytest.mark.parametrize("name", list(FIELDS))
def test_speculation_equals_plain_decoding_with_the_fields(llama, name):
    """Chains (both methods), a token tree and a batch prefilled in chunks, greedy and seeded: plain decoding's
    tokens, drafts accepted. The oracle drafts the processed output, so rows processed with the wrong history
    (every row with its root's) would disagree with it and fail the equality."""
    ps = prompts(3, seed=22)
    tree = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"
    for p in (dataclasses.replace(PLAIN, **FIELDS[name]),
              dataclasses.replace(PLAIN, **FIELDS[name], temperature=0.8, seed=3)):
        plain = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, p)]
        head = OracleDrafter.of(llama, references(ps, plain), 5)
        for method, kw in (("parallel", {}), ("eagle3", {}), ("parallel", dict(speculative_token_tree=tree)),
                           ("parallel", dict(max_num_seqs=3, max_num_batched_tokens=9))):
            _, watch, got = oracle_run(llama, head, method, 4, ps, p, **kw)()
            watch.check(got, plain, rate=0.25 if kw.get("speculative_token_tree") else 1 / 3)  # (5 nodes, depth 3)


def test_rows_processed_with_the_roots_history_are_caught(llama, monkeypatch):
    ps = prompts(3, seed=22)
    p = dataclasses.replace(PLAIN, **FIELDS["all"])
    plain = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, p)]
    head = OracleDrafter.of(llama, references(ps, plain), 5)
    monkeypatch.setattr(processors, "row_histories", lambda seq: [[] for _ in seq.tree.lineage])
    _, watch, got = oracle_run(llama, head, "parallel", 4, ps, p)()
    with pytest.raises(AssertionError, match="plain decoding"):
        watch.check(got, plain)


def test_one_request_opts_out_of_speculation(llama):
    """``speculative=False`` beside speculating requests: it drafts nothing, they keep accepting drafts, and
    every output is plain decoding's."""
    ps = prompts(3, seed=23)
    params = [PLAIN, dataclasses.replace(PLAIN, speculative=False), PLAIN]
    plain = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, PLAIN)]
    engine = make_engine(llama, OracleDrafter.of(llama, references(ps, plain), 6), "parallel", 4, max_num_seqs=3)
    engine.drafter.bind(engine)
    watch = Watch(engine)
    outs = engine.generate(ps, params)
    watch.check([o.token_ids for o in outs], plain)
    assert outs[1].stats.num_draft_tokens == 0
    assert outs[0].stats.num_accepted_tokens > 0 and outs[2].stats.num_accepted_tokens > 0


@pytest.mark.parametrize("bad, message", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(min_tokens=30), "min_tokens"),
    (dict(logit_bias={5: 101.0}), "logit_bias"), (dict(logit_bias={-1: 1.0}), "logit_bias")])
def test_bad_fields_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PLAIN, **bad)
