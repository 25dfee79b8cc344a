"""The engine's promises: speculative output equals the target's own greedy output token for token,
sampling keeps the target distribution, batching changes nothing, and bad input is refused."""
from __future__ import annotations

import dataclasses
import statistics
import math

import pytest
import torch
from conftest import native_from_hf, run_full, tiny_hf
from speculation import (CHAIN_FAULTS, MASK, OracleDrafter, Watch, assert_caught, fixed_costs, make_engine, oracle_run,
                         prompts, references)
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from peagle import kernels
from peagle.engine.llm_engine import EngineConfig, LLMEngine, RequestError
from peagle.engine.sequence import BONUS, CORRECTED, PLAIN
from peagle.engine.sampling import SamplingError, SamplingParams, logprobs_of, probs_from_logits, sample_tokens
from peagle.engine.tree import Tree, TreeBatch, accept_paths
from peagle.models.drafter import Drafter
from peagle.models.llama import LlamaModel, ModelConfig
from peagle.models.layers import set_precision
from peagle.models.loader import init_drafter


@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_lossless_at_every_k(family):
    """Both methods at every K from 1 to 10, three prompts batched, through a 2-layer head's plumbing drafting
    each sequence's own continuation (every 11th position wrong): plain decoding's tokens with most drafts
    accepted; planted faults (a verifier that rejects everything, one that keeps a rejected draft) are caught."""
    target = native_from_hf(tiny_hf(family))
    ps = prompts(3)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(target, None, "none").generate(ps, params)]
    head = OracleDrafter.of(target, references(ps, ref), 11, cfg=init_drafter(target, 2, MASK).cfg)
    for method in ("parallel", "eagle3"):
        for k in range(1, 11):
            _, watch, got = oracle_run(target, head, method, k, ps, params)()
            watch.check(got, ref)
    for fault in CHAIN_FAULTS:
        assert_caught(fault, oracle_run(target, head, "eagle3", 4, ps, params), ref)


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_lossless_oracle_head_deep_acceptance(llama, method):
    prompt = prompts(1, seed=3)[0]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = make_engine(llama, None, "none").generate([prompt], params)[0].token_ids
    for k in range(1, 11):
        for wrong_every in (3, 7, 1000):
            head = OracleDrafter.of(llama, prompt + ref, wrong_every)
            out = make_engine(llama, head, method, k).generate([prompt], params)[0]
            assert out.token_ids == ref, (k, wrong_every)
            if wrong_every == 1000:  # a perfect drafter: every round accepts all it may
                assert out.stats.acceptance_length > min(k, 4) * 0.75 + 0.5


@pytest.mark.parametrize("fault", ["rope_base", "decode_position"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_test_models_see_position_faults(family, fault):
    """The tiny models' attention is peaked enough that a RoPE base of 1e6 instead of the model's,
    or decode rows rotated as if one position later, changes greedy output: the equality tests
    built on these models would catch a wrong position."""
    hf = tiny_hf(family)
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    def greedy(target):
        return [make_engine(target, None, "none").generate([p], params)[0].token_ids for p in prompts(3, seed=13)]

    ref = greedy(native_from_hf(hf))
    if fault == "rope_base":
        cfg = hf.config.to_dict()
        cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_theta": 1e6}
        bad = LlamaModel(ModelConfig.from_hf(cfg))
        bad.load_checkpoint({k: v.detach().clone() for k, v in hf.state_dict().items()})
    else:
        bad = native_from_hf(hf)
        table = bad.rotary.table
        bad.rotary.table = lambda pos, dtype: table(pos + 1 if pos.shape[0] == 1 else pos, dtype)
        bad.fuses = lambda: False   # (the fault is in the table's rows: the one-call pass reads them by position)
    assert greedy(bad.eval()) != ref


def oracle_acceptance(prompt_len: int, max_tokens: int, k: int, wrong_every: int) -> tuple[int, list[int], list[int]]:
    """What an :class:`OracleDrafter` must give under greedy decoding, round by round: drafts for
    the token indices i = L .. L+d-1 after a sequence of L tokens, the one at i wrong iff
    ``i % wrong_every == 0``, the accepted ones the leading right ones. (verify rounds, accepted per position,
    each output token's origin)"""
    length, out, rounds, per_pos, origins = prompt_len + 1, 1, 0, [0] * k, [PLAIN]
    while out < max_tokens:
        d = min(k, max_tokens - out - 1)
        a = next((j for j in range(d) if (length + j) % wrong_every == 0), d)
        if d:
            rounds += 1
            for j in range(a):
                per_pos[j] += 1
        origins += [*range(1, a + 1), PLAIN if not d else BONUS if a == d else CORRECTED]
        length, out = length + a + 1, out + a + 1
    return rounds, per_pos, origins


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_per_position_acceptance_follows_the_oracles_pattern(llama, method):
    prompt = prompts(1, seed=3)[0]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = make_engine(llama, None, "none").generate([prompt], params)[0].token_ids
    for k, wrong_every in ((3, 5), (5, 4), (7, 9)):
        out = make_engine(llama, OracleDrafter.of(llama, prompt + ref, wrong_every), method, k).generate([prompt], params)[0]
        rounds, per_pos, origins = oracle_acceptance(len(prompt), 40, k, wrong_every)
        assert (out.stats.num_drafts, out.stats.accepted_per_pos[:k]) == (rounds, per_pos), (k, wrong_every)
        assert out.origins == origins, (k, wrong_every)


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_every_request_of_a_batch_equals_itself_alone(llama, method):
    """Batches of 1..16 requests with different prompt lengths and lengths of output: requests join
    and leave mid-flight, decode and verify rows share attention batches with prefills; an oracle head's
    drafts are mostly accepted, and planted faults are caught."""
    ps = prompts(16, seed=9)
    params = [SamplingParams(max_tokens=6 + (5 * i) % 17, ignore_eos=True) for i in range(16)]
    alone = [make_engine(llama, None, "none").generate([p], sp)[0].token_ids for p, sp in zip(ps, params)]
    head = OracleDrafter.of(llama, references(ps, alone), 7) if method != "none" else None
    for n in (1, 2, 5, 11, 16):
        engine, watch, got = oracle_run(llama, head, method, 3, ps, params, max_num_seqs=n)()
        assert got == alone, (method, n)
        if head is not None:
            watch.check(got, alone)
        assert engine.blocks.num_free == engine.blocks.num_blocks
    if head is not None:
        for fault in CHAIN_FAULTS:
            assert_caught(fault, oracle_run(llama, head, method, 3, ps, params, max_num_seqs=5), alone)


def test_batch_equals_alone_and_survives_kv_exhaustion(llama):
    """Nine requests batched, then in a KV pool far too small for all nine at once: sequences are preempted
    (some with accepted drafts) and recomputed, every output plain decoding's; planted faults are caught."""
    ps = prompts(9, seed=5)
    params = [SamplingParams(max_tokens=12 + i, ignore_eos=True) for i in range(len(ps))]
    alone = [make_engine(llama, None, "none").generate([p], sp)[0].token_ids for p, sp in zip(ps, params)]
    head = OracleDrafter.of(llama, references(ps, alone), 7)
    tight = dict(max_num_seqs=16, block_size=4, kv_cache_tokens=96)
    for method in ("none", "parallel", "eagle3"):
        h = head if method != "none" else None
        engine, watch, got = oracle_run(llama, h, method, 3, ps, params, max_num_seqs=16)()
        assert got == alone, method
        if h:
            watch.check(got, alone)
        engine, watch, got = oracle_run(llama, h, method, 3, ps, params, **tight)()
        assert got == alone, method
        if h:
            watch.check(got, alone, crossing="preempt")
        assert engine.blocks.num_free == engine.blocks.num_blocks
    for fault in CHAIN_FAULTS:
        assert_caught(fault, oracle_run(llama, head, "parallel", 3, ps, params, **tight), alone, crossing="preempt")


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_drafter_never_reads_unwritten_kv(llama, method):
    """No row whose output is used reads a position that no row has written (rows of rejected
    drafts write nothing, and their outputs are discarded): with the pools full of stale garbage
    every output of a row that writes KV (context, bonus and mask rows, which hold every draft) is
    exactly what it is with zeroed pools (keys outside a context only ever get zero weight)."""
    class Recording(Drafter):
        def forward(self, ids, hidden, positions, caches, meta, keep=None):   # (every row's output, recorded)
            normed, pre = super().forward(ids, hidden, positions, caches, meta)
            self.seen.append(normed.clone() if meta.no_write is None else normed[~meta.no_write])
            return (normed, pre) if keep is None else (normed[keep], pre[keep])

    random_head = init_drafter(llama, 2, MASK, seed=4)
    runs = []
    for fill in (0.0, 1e4):
        head = Recording(random_head.cfg)
        head.load_state_dict(random_head.state_dict())
        head.seen = []
        engine = make_engine(llama, head.eval(), method, 5)
        for cache in engine.runner.drafter_caches + engine.runner.target_caches:
            cache.k.normal_(0, fill) if fill else cache.k.zero_()
            cache.v.normal_(0, fill) if fill else cache.v.zero_()
        engine.generate(prompts(3), SamplingParams(max_tokens=30, ignore_eos=True))
        runs.append(head.seen)
    assert len(runs[0]) == len(runs[1]) > 5
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_abort_returns_blocks(llama):
    engine = make_engine(llama, init_drafter(llama, 1, MASK), "parallel", 3)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in prompts(3)]
    engine.step()
    engine.step()
    assert engine.abort(seqs[1].request_id)
    assert seqs[1].finish_reason == "abort"
    while engine.has_unfinished():
        engine.step()
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_eos_max_tokens_and_stop_strings(llama):
    class Tok:  # a word per id, joined by spaces: the engine needs the Rust tokenizer and eos_token_id
        eos_token_id = None
        backend_tokenizer = Tokenizer(WordLevel({str(i): i for i in range(160)}, unk_token="0"))

        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    drafter = init_drafter(llama, 1, MASK)
    p = prompts(1, seed=7)[0]
    free = make_engine(llama, None, "none").generate([p], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    eos = free.token_ids[5]
    first = free.token_ids.index(eos)
    for method in ("none", "parallel"):
        engine = LLMEngine(llama, drafter, EngineConfig(method=method, num_speculative_tokens=4), Tok(), [eos])
        out = engine.generate([p], SamplingParams(max_tokens=20))[0]
        assert out.token_ids == free.token_ids[:first + 1] and out.finish_reason == "stop"
        out = engine.generate([p], SamplingParams(max_tokens=3, ignore_eos=True))[0]
        assert out.token_ids == free.token_ids[:3] and out.finish_reason == "length"
        stop = f"{free.token_ids[2]} {free.token_ids[3]}"
        cut = next(j for j in range(1, 21) if stop in Tok.decode(free.token_ids[:j]))
        full = Tok.decode(free.token_ids[:cut])
        out = engine.generate([p], SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop]))[0]
        assert out.finish_reason == "stop" and out.token_ids == free.token_ids[:cut]
        assert out.text == full[:full.find(stop)]


def test_max_model_len_ends_with_length(llama):
    engine = make_engine(llama, init_drafter(llama, 1, MASK), "parallel", 7, max_model_len=30)
    out = engine.generate([list(range(3, 23))], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


# --------------------------------------------------------------------------- sampling

def verify(logits: torch.Tensor, drafts: list[int], params: SamplingParams, seed: int, position: int,
           tree: Tree | None = None) -> tuple[int, int]:
    """The engine's verification of one sequence's drafts (a chain unless ``tree``), its rows
    ``logits``: (accepted drafts, emitted token)."""
    tree = tree or Tree.chain(len(drafts))
    y = sample_tokens(logits, params, seed, [position + d for d in tree.depths])
    a, tok, _ = accept_paths(y[None], TreeBatch.of([tree], [drafts], [0], logits.device))
    return int(a), int(tok)


SAMPLERS = [SamplingParams(temperature=0.9, top_k=8, top_p=0.95), SamplingParams(temperature=1.3),
            SamplingParams(temperature=0.6, top_p=0.8), SamplingParams(temperature=1.0, top_k=3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", SAMPLERS, ids=["k8-p.95-t.9", "t1.3", "p.8-t.6", "k3"])
def test_verify_keeps_the_target_distribution(dtype, params):
    """The first emitted token follows p whatever the draft (a zero-probability, a mid-probability
    and the most likely one), with temperature, top-k and top-p, the target's logits in float32 and
    bf16: 12,000 seeds per draft, a chi-square test at p = 0.001 that would see 2% of the mass moved."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 12, generator=g) * 2).to(dtype)
    p = probs_from_logits(logits, params)
    order = p[0].argsort().tolist()
    mid = next((t for t in order if 0.05 < p[0, t] < 0.3), order[-2])
    n = 12000
    assert_has_power(p[0], n)
    for first in (order[0], mid, order[-1]):
        drafts = [first, int(p[1].argmax())]
        counts = torch.zeros(12)
        for seed in range(n):
            a, tok = verify(logits, drafts, params, seed, 5)
            counts[first if a >= 1 else tok] += 1
        assert_matches(counts, p[0], n)


def test_position_keyed_sampling_ignores_the_drafts():
    """The token at a position is decided by (seed, position) and p alone: whatever is drafted,
    the emitted tokens are plain sampling's, and another seed or position draws differently."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 40, generator=g)
    params = SamplingParams(temperature=1.0)
    plain = [int(verify(logits[j:j + 1], [], params, 7, 10 + j)[1]) for j in range(4)]
    for drafts in ([plain[0], plain[1], plain[2]], [plain[0], (plain[1] + 1) % 40, plain[2]], [(plain[0] + 1) % 40] * 3):
        a, tok = verify(logits, drafts, params, 7, 10)
        assert drafts[:int(a)] + [int(tok)] == plain[:int(a) + 1]
    draws = {tuple(int(verify(logits[j:j + 1], [], params, s, t)[1]) for j in range(4)) for s in range(20) for t in (0, 50)}
    assert len(draws) > 30


def assert_has_power(probs: torch.Tensor, n: int, moved: float = 0.02) -> None:
    """The chi-square test of ``assert_matches`` would fail on counts drawn from ``probs`` with
    ``moved`` of the mass shifted from the likeliest token to the second (at their expected values)."""
    order = probs.argsort(descending=True)
    biased = probs.double().clone()
    biased[order[0]] -= moved
    biased[order[1]] += moved
    with pytest.raises(AssertionError):
        assert_matches(biased * n, probs, n)


def assert_matches(counts: torch.Tensor, probs: torch.Tensor, n: int) -> None:
    """Chi-square goodness of fit at p = 0.001 (Wilson-Hilferty critical value); cells expected
    below 5 are pooled, and a zero-probability cell must never be hit."""
    expected = probs.double() * n
    assert counts[expected == 0].sum() == 0
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    crit = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < crit, (chi2, crit)


@pytest.mark.parametrize("head,method,k", [("bad", "parallel", 3), ("plausible", "parallel", 2),
                                           ("bad", "eagle3", 5), ("plausible", "eagle3", 3)])
def test_speculative_sampling_end_to_end_matches_target(head, method, k):
    """Three-token continuations sampled through the whole engine follow the target's exact joint
    distribution, with a deliberately bad (random) head and with one that drafts the greedy
    continuation, which sampled runs accept often but not always, for both methods."""
    hf = tiny_hf("llama", seed=4)
    with torch.no_grad():
        hf.lm_head.weight.mul_(40)  # peaky distributions, so a wrong sampler shows
    target = native_from_hf(hf)
    prompt = [5, 17, 42]
    sp = SamplingParams(temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True)
    greedy = make_engine(target, None, "none").generate([prompt], SamplingParams(max_tokens=3))[0].token_ids
    if head == "bad":
        drafter = init_drafter(target, 1, MASK, seed=9)
    else:
        drafter = OracleDrafter.of(target, prompt + greedy, 1000)
    n = 4000
    engine = make_engine(target, drafter.eval(), method, k, max_num_seqs=64)
    outs = engine.generate([prompt] * n, [SamplingParams(**{**sp.__dict__, "seed": i}) for i in range(n)])
    assert engine.stats.num_drafts >= n
    rate = engine.stats.num_accepted_tokens / engine.stats.num_draft_tokens
    assert rate < 0.2 if head == "bad" else 0.2 < rate < 0.95

    def dist(prefix):
        return probs_from_logits(run_full(target, torch.tensor(prompt + prefix))[0][-1:], sp)[0]

    joint = {}
    p1 = dist([])
    for t1 in p1.nonzero().flatten().tolist():
        p2 = dist([t1])
        for t2 in p2.nonzero().flatten().tolist():
            p3 = dist([t1, t2])
            for t3 in p3.nonzero().flatten().tolist():
                joint[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    counts = torch.zeros(len(cells))
    for o in outs:
        triple = tuple(o.token_ids)
        assert triple in index, f"sampled {triple}, which the target gives probability 0"
        counts[index[triple]] += 1
    assert_matches(counts, torch.tensor([joint[c] for c in cells]), n)


SEEDED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, max_tokens=28, ignore_eos=True, seed=7)


def test_seeded_sampling_is_plain_decodings_whatever_the_speculation(llama):
    """With a seed, sampled output is plain decoding's token for token: both methods, K in 1, 3, 7
    and auto, a head that drafts plain decoding's own output (every 9th position wrong), most of it
    accepted; another seed gives another output; planted faults are caught."""
    p = prompts(1, seed=11)[0]
    ref = make_engine(llama, None, "none").generate([p], SEEDED)[0].token_ids
    assert make_engine(llama, None, "none").generate([p], dataclasses.replace(SEEDED, seed=8))[0].token_ids != ref
    oracle = OracleDrafter.of(llama, p + ref, 9)
    for method in ("parallel", "eagle3"):
        for k in (1, 3, 7, "auto"):
            _, watch, got = oracle_run(llama, oracle, method, k, [p], SEEDED)()
            watch.check(got, [ref])
    for fault in CHAIN_FAULTS:
        assert_caught(fault, oracle_run(llama, oracle, "parallel", 3, [p], SEEDED), [ref])


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_seeded_sampling_alone_equals_in_a_batch_chunked_and_preempted(llama, method):
    """Eight requests (seeded, unseeded and greedy) together, with prompts prefilled in chunks, and
    with a KV pool so small that sequences are preempted and recomputed: each seeded request's
    output is what it is alone, and what plain decoding gives it. An oracle head drafts each seeded
    request's plain output: most drafts are accepted, beside prompt chunks and across preemptions too;
    planted faults are caught."""
    ps = prompts(8, seed=12)
    params = [dataclasses.replace(SEEDED, seed=100 + i, max_tokens=10 + 3 * i) if i % 3 else
              dataclasses.replace(SEEDED, seed=None if i % 2 else 5, temperature=0.0 if i == 6 else 1.0)
              for i in range(8)]
    seeded = [i for i, sp in enumerate(params) if sp.seed is not None]
    plain = [make_engine(llama, None, "none").generate([ps[i]], params[i])[0].token_ids for i in seeded]
    head = None if method == "none" else OracleDrafter.of(llama, references([ps[i] for i in seeded], plain), 7)
    crossings = (None, None, "chunk", "preempt")
    for kw, crossing in zip(({}, dict(max_num_seqs=8), dict(max_num_seqs=8, max_num_batched_tokens=7),
                             dict(max_num_seqs=8, block_size=4, kv_cache_tokens=96)), crossings):
        engine, watch, outs = oracle_run(llama, head, method, "auto" if kw else 3, ps, params, **kw)()
        got = [outs[i] for i in seeded]
        assert got == plain, (method, kw)
        if head is not None:
            watch.check(got, plain, crossing=crossing)
    if head is not None:
        for fault in CHAIN_FAULTS:
            run = oracle_run(llama, head, method, 3, ps, params, max_num_seqs=8, block_size=4, kv_cache_tokens=96)
            assert_caught(fault, lambda patch: (lambda e, w, o: (e, w, [o[i] for i in seeded]))(*run(patch)), plain)


# --------------------------------------------------------------------------- bad input

def test_bad_input_is_refused(llama):
    drafter = init_drafter(llama, 1, MASK)
    for k in (0, -1):
        with pytest.raises(ValueError, match="K must be"):
            EngineConfig(num_speculative_tokens=k)
    with pytest.raises(ValueError, match="unknown method"):
        EngineConfig(method="medusa")
    engine = make_engine(llama, drafter, max_model_len=64)
    with pytest.raises(RequestError, match="empty"):
        engine.add_request([])
    with pytest.raises(RequestError, match="maximum context length is 64"):
        engine.add_request(list(range(3, 67)))
    with pytest.raises(RequestError, match="token ids"):
        engine.add_request([1, 2, 10_000])
    with pytest.raises(ValueError, match="max_model_len"):
        make_engine(llama, drafter, max_model_len=10_000)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_tokens=0), dict(stop=[""])):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert not engine.has_unfinished()


def test_greedy_and_sampled_requests_share_a_batch(llama):
    """Greedy requests mixed with sampled ones give their solo output, and seeded sampled requests
    give their solo sample, in every mode, with an oracle head's drafts mostly accepted."""
    ps = prompts(6, seed=11)
    params = [SamplingParams(max_tokens=16, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=16, ignore_eos=True) for i in range(6)]
    alone = [make_engine(llama, None, "none").generate([p], sp)[0].token_ids for p, sp in zip(ps, params)]
    head = OracleDrafter.of(llama, references(ps, alone), 7)
    for method in ("none", "parallel", "eagle3"):
        _, watch, mixed = oracle_run(llama, head if method != "none" else None, method, 3, ps, params, max_num_seqs=8)()
        assert mixed == alone, method
        if method != "none":
            watch.check(mixed, alone)
    for fault in CHAIN_FAULTS:
        assert_caught(fault, oracle_run(llama, head, "eagle3", 3, ps, params, max_num_seqs=8), alone)


# --------------------------------------------------------------------------- device discipline

@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("method", ["parallel", "eagle3", "none"])
def test_step_creates_every_tensor_on_the_models_device(llama, method, padded):
    """The CUDA path's proxy on CPU: with the default device set to ``meta``, any tensor the engine,
    the expansion, sampling or attention metadata makes without naming its device is a meta tensor,
    and the step fails (a meta tensor cannot be read back). Greedy and seeded sampled requests run
    together; the output must equal the same run without the default device. ``padded``: decode
    steps in the layout CUDA graphs replay (peagle.engine.graphs), run here without capture."""
    head = init_drafter(llama, 2, MASK, seed=3) if method != "none" else None
    params = [SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)]
    ps = prompts(2, seed=5)
    expected = [o.token_ids for o in make_engine(llama, head, method).generate(ps, params)]
    engine = make_engine(llama, head, method)
    if padded:
        engine.runner.graphs = engine.runner.make_graphs(capture=False)
    torch.set_default_device("meta")
    try:
        got = [o.token_ids for o in engine.generate(ps, params)]
    finally:
        torch.set_default_device(None)
    assert got == expected


# --------------------------------------------------------------------------- KV accounting

def run_bounded(engine: LLMEngine, max_steps: int = 500) -> None:
    """Step until done; an engine that spins (preempting itself forever) fails instead of hanging."""
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return
        engine.step()
    pytest.fail(f"still unfinished after {max_steps} steps: waiting={len(engine.waiting)} running={len(engine.running)}")


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_a_sequence_reaching_max_model_len_finishes(llama, method):
    """`generate --max-model-len 64 --max-new-tokens 100`: the last verify and drafting need K + 1
    positions past max_model_len; a pool of max_num_seqs * max_model_len made it preempt itself forever."""
    engine = make_engine(llama, init_drafter(llama, 1, MASK), method, 7, max_num_seqs=1, max_model_len=64)
    seq = engine.add_request(list(range(3, 23)), SamplingParams(max_tokens=100, ignore_eos=True))
    run_bounded(engine)
    assert seq.finish_reason == "length" and len(seq.output_ids) == 44
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_long_prompts_fit_and_oversized_requests_are_refused(llama):
    drafter = init_drafter(llama, 1, MASK)
    engine = make_engine(llama, drafter, "parallel", 7, max_num_seqs=1, max_model_len=256)
    seq = engine.add_request((list(range(3, 153)) * 2)[:250],
                             SamplingParams(max_tokens=6, ignore_eos=True))
    run_bounded(engine)
    assert seq.finish_reason == "length" and len(seq.output_ids) == 6
    # a pool smaller than one full sequence: what cannot fit is refused up front, what can runs
    small = make_engine(llama, drafter, "parallel", 3, max_num_seqs=4, block_size=4, kv_cache_tokens=40)
    with pytest.raises(RequestError, match="KV cache holds"):
        small.add_request(list(range(3, 23)), SamplingParams(max_tokens=30))
    seqs = [small.add_request(p, SamplingParams(max_tokens=40 - 3 - len(p), ignore_eos=True)) for p in prompts(6)]
    run_bounded(small)
    assert all(s.finish_reason == "length" for s in seqs)
    assert small.blocks.num_free == small.blocks.num_blocks


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_full_length_sequences_share_a_tight_pool(llama, method):
    """Every sequence runs to max_model_len in a pool holding barely two: preemption and recompute,
    never a sequence evicted for good; an oracle head's drafts accepted across the preemptions."""
    ps = prompts(5, seed=9)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    ref = [make_engine(llama, None, "none", max_model_len=48).generate([p], params)[0].token_ids for p in ps]
    head = OracleDrafter.of(llama, references(ps, ref), 7)
    tight = head.bind(make_engine(llama, head, method, 5, max_num_seqs=5, max_model_len=48, block_size=4,
                                  kv_cache_tokens=2 * (48 + 6) + 4))
    watch = Watch(tight)
    seqs = [tight.add_request(p, params) for p in ps]
    run_bounded(tight)
    watch.check([s.output_ids for s in seqs], ref, crossing="preempt")
    assert tight.blocks.num_free == tight.blocks.num_blocks


# --------------------------------------------------------------------------- faults and logprobs

def test_extreme_temperatures_and_top_p_are_safe_and_non_finite_logits_raise(llama):
    drafter = init_drafter(llama, 1, MASK, seed=1)
    p = prompts(1, seed=4)[0]
    greedy = make_engine(llama, drafter, "parallel", 3).generate([p], SamplingParams(max_tokens=12, ignore_eos=True))
    for t in (1e-40, 1e-6):  # 1e-40: logits / t overflowed and multinomial raised
        out = make_engine(llama, drafter, "parallel", 3).generate([p], SamplingParams(temperature=t, max_tokens=12,
                                                                                      ignore_eos=True))
        assert out[0].token_ids == greedy[0].token_ids
    logits = torch.randn(3, 12)  # top_p=5e-324 (0.0 in float32) dropped every token: found by the API fuzzer
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=5e-324))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 12).float())
    logits[:, ::2] = float("-inf")  # a temperature past float32's range: uniform over the allowed tokens only
    for t in (5e307, 1e300):
        probs = probs_from_logits(logits, SamplingParams(temperature=t, top_k=198993))
        assert torch.equal(probs, torch.tensor([0.0, 1 / 6] * 6).expand(3, 12)), t
    engine = make_engine(llama, drafter, "parallel", 3)
    decode = llama.decode

    def nan_row(*args):   # one entry of the target's logits (its argmax then the engine's own)
        logits, taps, _ = decode(*args)
        logits[-1, 4] = float("nan")
        return logits, taps, None

    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        engine.add_request(p, params)
        llama.decode = nan_row
        try:
            with pytest.raises(SamplingError, match="non-finite"):
                engine.step()
        finally:
            llama.decode = decode
        engine.abort(engine.running[0].request_id)


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_logprobs_are_the_targets_under_speculation(llama, method):
    """With speculation on (a head whose drafts are mostly accepted), each emitted token's logprob
    and top alternatives are the target's own at that position: its log-softmax over a full pass."""
    p = prompts(1, seed=6)[0]
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=3)
    ref = make_engine(llama, None, "none").generate([p], params)[0].token_ids
    engine = make_engine(llama, OracleDrafter.of(llama, p + ref, wrong_every=5), method, 4)
    seq = engine.add_request(p, params)
    while engine.has_unfinished():
        engine.step()
    assert seq.output_ids == ref and seq.stats.num_accepted_tokens > 5
    assert len(seq.logprobs) == len(ref)
    full, _ = run_full(llama, torch.tensor(p + ref))
    want = full[len(p) - 1:-1].float().log_softmax(-1)
    for i, (lp, t) in enumerate(zip(seq.logprobs, ref)):
        assert lp.token_id == t and math.isclose(lp.logprob, want[i, t].item(), abs_tol=1e-4)
        assert [x for x, _ in lp.top] == want[i].topk(3).indices.tolist()
    assert logprobs_of(torch.tensor([[0.0, 0.0]]), [1], 0)[0].logprob == pytest.approx(math.log(0.5))


# --------------------------------------------------------------------------- chunked prefill

@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_chunked_prefill_is_lossless(llama, method):
    """Prompts longer than a chunk (max_num_batched_tokens 7 and 16, prompts of 20-70 tokens), alone
    and in batches where chunks share steps with decode and verify rows: the same tokens as plain
    greedy decoding of the whole prompt at once, with an oracle head's drafts accepted beside the chunks;
    planted faults are caught."""
    g = torch.Generator().manual_seed(11)
    ps = [torch.randint(3, 150, (n,), generator=g).tolist() for n in (20, 45, 70, 33)]
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(llama, None, "none", enable_chunked_prefill=False).generate(ps, params)]
    head = None if method == "none" else OracleDrafter.of(llama, references(ps, ref), 7,
                                                          cfg=init_drafter(llama, 2, MASK).cfg)
    for budget in (7, 16):
        for n in (1, 4):
            engine, watch, got = oracle_run(llama, head, method, 4, ps, params, max_num_batched_tokens=budget,
                                            max_num_seqs=n)()
            assert got == ref, (budget, n)
            if head is not None:
                watch.check(got, ref, crossing="chunk" if n > 1 else None)
            assert engine.blocks.num_free == engine.blocks.num_blocks
    if head is not None:
        for fault in CHAIN_FAULTS:
            assert_caught(fault, oracle_run(llama, head, method, 4, ps, params, max_num_batched_tokens=7,
                                            max_num_seqs=4), ref, crossing="chunk")


def test_a_long_prompt_does_not_stall_running_streams(llama):
    """While a 200-token prompt is prefilled in chunks of 16 tokens, a running request gets a token
    every step (unchunked, the whole prompt would share one step with it)."""
    engine = make_engine(llama, init_drafter(llama, 1, MASK, seed=2), "parallel", 3, max_num_batched_tokens=16)
    short = engine.add_request(prompts(1)[0], SamplingParams(max_tokens=60, ignore_eos=True))
    engine.step()
    long = engine.add_request(torch.randint(3, 150, (200,), generator=torch.Generator().manual_seed(1)).tolist(),
                              SamplingParams(max_tokens=4, ignore_eos=True))
    steps = 0
    while not long.output_ids:
        before = len(short.output_ids)
        engine.step()
        steps += 1
        assert len(short.output_ids) > before or short.finished
        assert 0 < long.num_cached <= 16 * steps
    assert steps >= 200 // 16


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_chunked_prefill_writes_the_kv_of_a_whole_prefill(llama, method):
    """The drafter reads token p+1 at position p: where a chunk stops short, that is the prompt's
    next token (not a sampled one). Target and drafter KV of every prompt position after a prefill
    in chunks of 7 equal those of one whole prefill (float32, up to batch-shape rounding)."""
    prompt = torch.randint(3, 150, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    head = init_drafter(llama, 2, MASK, seed=6)
    kv = []
    for budget in (7, 2048):
        engine = make_engine(llama, head, method, 4, max_num_batched_tokens=budget)
        seq = engine.add_request(prompt, SamplingParams(max_tokens=50, ignore_eos=True))
        while not seq.output_ids:
            engine.step()
        slots = torch.tensor([seq.block_table[p // 16] * 16 + p % 16 for p in range(len(prompt))])
        kv.append([torch.cat([c.k[slots], c.v[slots]]) for c in engine.runner.target_caches + engine.runner.drafter_caches])
    for a, b in zip(*kv):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- fair prefill

def random_prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, 150, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_short_prompt_prefills_beside_a_long_one(llama):
    """The token rule (vLLM's; no step target): a long prompt alone takes the whole budget; a short one
    that arrives is prefilled in the next step beside a chunk of the long one capped at the threshold,
    and the cap holds while the short one runs; alone again, the long prompt takes the whole budget."""
    engine = make_engine(llama, None, "none", max_num_batched_tokens=64, long_prefill_token_threshold=16,
                         long_prefill_step_ms=None)
    long = engine.add_request(random_prompt(200), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert long.num_cached == 64
    short = engine.add_request(prompts(1)[0], SamplingParams(max_tokens=6, ignore_eos=True))
    engine.step()
    assert long.num_cached == 80 and len(short.output_ids) == 1
    while not short.finished:
        before = long.num_cached
        engine.step()
        assert long.num_cached == before + 16
    assert long.num_cached == 160
    engine.step()
    assert long.num_cached == 200 and len(long.output_ids) == 1


def test_long_chunks_are_sized_by_time(llama, monkeypatch):
    """With a step target, a long prompt's chunk is what fits it by the cost per prefill token of the last
    step that prefilled it: beside a decoding request at most the token threshold, alone ALONE_STEPS
    targets (the whole budget before any step is measured). On a clock where a token costs more the
    deeper its context (as attention does), the shared chunks shrink as the context grows and those
    steps stay near the target; the tokens are the token rule's."""
    from peagle.engine.scheduler import ALONE_STEPS, MIN_LONG_CHUNK

    target_ms, limit, budget = 10.0, 64, 128

    def run(step_ms, prompt, short_at, slope):
        engine = make_engine(llama, None, "none", max_num_batched_tokens=budget, long_prefill_token_threshold=limit,
                             long_prefill_step_ms=step_ms)
        observe, steps = engine.scheduler.observe, []

        def clock(work, tree, seconds):  # observed after the step: num_cached is each chunk's end
            s = sum(n * (1e-4 + slope * seq.num_cached) for seq, n in work)
            steps.append(dict(chunk=sum(n for seq, n in work if seq is long), left=len(prompt) - long.num_cached,
                              shared=len(work) > 1, prefill=sum(n for _, n in work if n > 1), s=s))
            observe(work, tree, s)
        monkeypatch.setattr(engine.scheduler, "observe", clock)
        long, seqs = engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True)), []
        while engine.has_unfinished():
            if len(steps) == short_at:
                seqs.append(engine.add_request(prompts(1)[0], SamplingParams(max_tokens=8, ignore_eos=True)))
            engine.step()
        return [s for s in steps if s["chunk"] > 1], [long.output_ids] + [q.output_ids for q in seqs]

    for prompt, short_at, slope in ((random_prompt(240, seed=7), 1, 1e-6), (random_prompt(250, seed=8), None, 4e-6)):
        steps, tokens = run(target_ms, prompt, short_at, slope)
        assert steps[0]["chunk"] == budget                 # unmeasured: the whole budget alone
        for prev, now in zip(steps, steps[1:]):
            fit = max(MIN_LONG_CHUNK, int(target_ms / 1e3 / (prev["s"] / prev["prefill"])))
            cap = min(limit, fit) if now["shared"] else fit * ALONE_STEPS
            assert now["chunk"] == min(now["chunk"] + now["left"], budget, cap), (prev, now)
        shared = [s for s in steps if s["shared"]]
        if short_at is not None:
            assert len(shared) >= 2 and shared[-1]["chunk"] < shared[0]["chunk"] < limit  # deeper, smaller
            assert all(s["s"] < 1.5 * target_ms / 1e3 for s in shared), shared
        if short_at is None:   # alone, a measured step capped below the budget
            assert any(budget > s["chunk"] and s["left"] > 0 for s in steps[1:]), steps
        assert tokens == run(None, prompt, short_at, slope)[1]


def test_a_long_prompt_always_progresses(llama):
    """New short prompts every step, more than the budget holds: the long prompt still gets its
    chunk in every step until it is prefilled, and every short prompt is answered."""
    engine = make_engine(llama, None, "none", max_num_batched_tokens=32, long_prefill_token_threshold=8,
                         max_num_seqs=64)
    long = engine.add_request(random_prompt(200), SamplingParams(max_tokens=2, ignore_eos=True))
    shorts = []
    while not long.output_ids:
        shorts += [engine.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True)) for p in prompts(3, seed=len(shorts))]
        before = long.num_cached
        engine.step()
        assert long.num_cached == min(before + 8, 200)
    while engine.has_unfinished():
        engine.step()
    assert all(len(s.output_ids) == 3 for s in shorts)


def test_one_long_prompt_at_a_time_and_short_ones_pass(llama):
    engine = make_engine(llama, None, "none", max_num_batched_tokens=64, long_prefill_token_threshold=16)
    a, b = (engine.add_request(random_prompt(120, seed), SamplingParams(max_tokens=2, ignore_eos=True)) for seed in (1, 2))
    c = engine.add_request(prompts(1)[0], SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()
    assert (a.num_cached, b.num_cached, len(c.output_ids)) == (16, 0, 1)  # b waits; c passes it
    while not a.output_ids:
        assert b.num_cached == 0
        engine.step()
    engine.step()
    assert b.num_cached > 0
    two = make_engine(llama, None, "none", max_num_batched_tokens=64, long_prefill_token_threshold=16,
                      max_long_partial_prefills=2)
    a, b = (two.add_request(random_prompt(120, seed), SamplingParams(max_tokens=2, ignore_eos=True)) for seed in (1, 2))
    two.step()
    assert (a.num_cached, b.num_cached) == (16, 16)


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_fair_prefill_is_lossless(llama, method):
    """Long and short prompts arriving while others prefill and decode, the long ones in capped
    chunks beside them: every request's tokens (greedy, and seeded sampling) are its tokens alone, an
    oracle head's drafts accepted beside the chunks (K = 3 and auto); planted faults are caught."""
    ps = [random_prompt(n, seed) for n, seed in ((150, 1), (9, 2), (120, 3), (14, 4), (6, 5))]

    def arrivals(head, k, sp):
        def run(patch=lambda e: e):
            engine = patch(fixed_costs(make_engine(llama, head, method, k, max_num_batched_tokens=24,
                                                   long_prefill_token_threshold=8)))
            if head is not None:
                head.bind(engine)
            watch, seqs = Watch(engine), []
            for p in ps:  # one arrival a step
                seqs.append(engine.add_request(p, sp))
                engine.step()
            while engine.has_unfinished():
                engine.step()
            return engine, watch, [s.output_ids for s in seqs]
        return run

    for sp in (SamplingParams(max_tokens=12, ignore_eos=True), dataclasses.replace(SEEDED, max_tokens=12)):
        alone = [make_engine(llama, None, "none").generate([p], sp)[0].token_ids for p in ps]
        head = None if method == "none" else OracleDrafter.of(llama, references(ps, alone), 7)
        for k in (3, "auto"):
            _, watch, got = arrivals(head, k, sp)()
            assert got == alone, (method, k, sp.seed)
            if head is not None:
                watch.check(got, alone, crossing="chunk")
        if head is not None and sp.seed is not None:
            for fault in CHAIN_FAULTS:
                assert_caught(fault, arrivals(head, 3, sp), alone, crossing="chunk")


@pytest.mark.parametrize("method", ["none", "parallel"])
def test_capped_chunks_write_the_kv_of_a_whole_prefill(llama, method):
    """A long prompt prefilled in chunks of 8 beside a short request that decodes: its target (and
    drafter) KV at every prompt position equals one whole prefill's (float32, up to batch-shape rounding)."""
    prompt = random_prompt(70, seed=3)
    head = None if method == "none" else init_drafter(llama, 2, MASK, seed=6)
    kv = []
    for shared in (True, False):
        engine = make_engine(llama, head, method, 4, max_num_batched_tokens=2048 if not shared else 32,
                             long_prefill_token_threshold=8 if shared else None)
        if shared:
            engine.add_request(prompts(1)[0], SamplingParams(max_tokens=40, ignore_eos=True))
            engine.step()
        seq = engine.add_request(prompt, SamplingParams(max_tokens=50, ignore_eos=True))
        steps = 0
        while not seq.output_ids:
            engine.step()
            steps += 1
        assert steps == (-(-70 // 8) if shared else 1)
        slots = torch.tensor([seq.block_table[p // 16] * 16 + p % 16 for p in range(len(prompt))])
        kv.append([torch.cat([c.k[slots], c.v[slots]]) for c in engine.runner.target_caches + engine.runner.drafter_caches])
    for a, b in zip(*kv):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fair_prefill_settings_are_checked():
    for kw, msg in ((dict(long_prefill_token_threshold=5000), "long_prefill_token_threshold"),
                    (dict(long_prefill_step_ms=0), "long_prefill_step_ms"),
                    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
                    (dict(max_num_partial_prefills=0), "max_num_partial_prefills"),
                    (dict(max_num_partial_prefills=2, max_long_partial_prefills=3), "must not exceed")):
        with pytest.raises(ValueError, match=msg):
            EngineConfig(**kw)
    assert EngineConfig(max_num_batched_tokens=2048).long_prefill == 256
    assert EngineConfig(long_prefill_token_threshold=0).long_prefill == 256  # vLLM's 0: the default


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_bf16_packed_weights_change_nothing(method, monkeypatch):
    """bf16 on a CPU that packs weights for oneDNN (:func:`peagle.models.layers.packs`: torch's path, where
    peagle's kernels are off, so they are turned off here): the engine packs target and head, and every token
    equals a run on the same weights left unpacked. Skipped, with the reason, on a CPU without native bf16."""
    import peagle.models.layers as layers
    import peagle.models.llama as llama_module

    monkeypatch.setattr(kernels, "available", lambda: False)
    target = native_from_hf(tiny_hf("llama-bias-tied")).to(torch.bfloat16)
    if not layers.packs(target.model.layers[0].mlp.gate_up_proj.weight):
        pytest.skip("this CPU has no native bf16 (or this torch no oneDNN): the engine packs no weight")
    head = init_drafter(target, 2, MASK, seed=7).to(torch.bfloat16) if method != "none" else None
    ps = prompts(3, seed=8)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    with monkeypatch.context() as unpacked:
        unpacked.setattr(layers, "packs", lambda w: False)
        unpacked.setattr(llama_module, "packs", lambda w: False)
        plain = [o.token_ids for o in make_engine(target, head, method, 3).generate(ps, params)]
    assert not target.model.layers[0].mlp.gate_up_proj.weight.is_mkldnn
    engine = make_engine(target, head, method, 3)
    assert [o.token_ids for o in engine.generate(ps, params)] == plain
    assert target.model.layers[0].mlp.gate_up_proj.weight.is_mkldnn and target.head_weight().is_mkldnn
    if head is not None:
        assert any(p.is_mkldnn for p in head.state_dict().values()), "the head was not packed"


# --------------------------------------------------------------------------- every dtype (batch invariance)

@pytest.mark.skipif(not kernels.native(torch.device("cpu")), reason="the CPU kernels make every dtype batch-invariant")
@pytest.mark.parametrize("weights", [torch.bfloat16, torch.float16, torch.float32])
def test_speculation_is_exact_in_every_weight_dtype(weights):
    """16-bit weights with float32 arithmetic on the CPU kernels: P-EAGLE and EAGLE-3 at K=3 and `auto`,
    greedy and seeded, alone and eight together with prompts prefilled in chunks of 7, all equal plain
    decoding token for token, because a row's result no longer depends on the rows beside it (an oracle
    head's drafts mostly accepted)."""
    target = native_from_hf(tiny_hf("llama"))
    set_precision(target, weights, torch.float32)
    ps = prompts(8, seed=21)
    greedy = dataclasses.replace(SEEDED, temperature=0.0, seed=None)
    params = [greedy if i % 2 else dataclasses.replace(SEEDED, seed=40 + i) for i in range(8)]
    plain = [make_engine(target, None, "none").generate([p], sp)[0].token_ids for p, sp in zip(ps, params)]
    drafter = OracleDrafter.of(target, references(ps, plain), 7)
    set_precision(drafter, weights, torch.float32)
    for method in ("parallel", "eagle3"):
        for k, kw in ((3, {}), ("auto", dict(max_num_seqs=8, max_num_batched_tokens=7))):
            engine = fixed_costs(drafter.bind(make_engine(target, drafter, method, k, **kw)))
            watch = Watch(engine)
            outs = [engine.generate([p], sp)[0].token_ids for p, sp in zip(ps, params)] if not kw else \
                [o.token_ids for o in engine.generate(ps, params)]
            watch.check(outs, plain, crossing="chunk" if kw else None)


@pytest.mark.skipif(not kernels.native(torch.device("cpu")), reason="the CPU kernels make every dtype batch-invariant")
@pytest.mark.parametrize("weights", [torch.bfloat16, torch.float16, torch.float32])
def test_a_rows_logits_are_the_same_bits_in_any_pass(weights):
    """The sharp form of the test above: after a 30-token prompt, the next 8 positions' logits and taps,
    computed one row per pass (decoding), as one 8-row pass (verification) and as 8 rows beside another
    sequence's 5 rows (a batch), are equal bit for bit."""
    from peagle.models.attention import AttnMeta, Span

    target = native_from_hf(tiny_hf("llama"))
    set_precision(target, weights, torch.float32)
    ids = torch.tensor((prompts(1, seed=3)[0] * 40)[:38])
    other = torch.tensor((prompts(1, seed=4)[0] * 40)[:20])

    def fresh():
        caches = target.make_caches(128)
        with torch.inference_mode():
            target(ids[:30], torch.arange(30), caches, AttnMeta([Span(30, 30, list(range(64)), 0)], 1))
            target(other[:15], torch.arange(15), caches, AttnMeta([Span(15, 15, list(range(64, 128)), 0)], 1))
        return caches

    def run(spans, tokens, positions, caches):
        with torch.inference_mode():
            return target(torch.cat(tokens), torch.cat(positions), caches, AttnMeta(spans, 1))

    caches = fresh()
    one = [run([Span(1, p + 1, list(range(64)), p)], [ids[p:p + 1]], [torch.tensor([p])], caches) for p in range(30, 38)]
    one = tuple(torch.cat([o[i] for o in one]) for i in (0, 1))
    eight = run([Span(8, 38, list(range(64)), 30)], [ids[30:38]], [torch.arange(30, 38)], fresh())
    beside = run([Span(5, 20, list(range(64, 128)), 15), Span(8, 38, list(range(64)), 30)],
                 [other[15:20], ids[30:38]], [torch.arange(15, 20), torch.arange(30, 38)], fresh())
    for got in (eight, tuple(t[5:] for t in beside)):
        assert torch.equal(got[0], one[0]) and torch.equal(got[1], one[1]), weights
