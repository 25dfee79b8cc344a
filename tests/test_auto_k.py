"""K chosen by the engine: lossless at every K it picks, nothing drafted for a useless head, the
maximum for a perfect one, smaller K as the batch grows. Costs are fixed curves here (the engine's
own are timed at start-up), so the choices do not depend on this machine's speed."""
from __future__ import annotations

import json
import mmap

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import DRAFTER, MASK, TARGET, OracleDrafter, Watch, fixed_costs, make_engine, prompts

from peagle.engine.auto_k import AutoK, CostCurve
from peagle.engine.costs import pass_costs
from peagle.engine.llm_engine import EngineConfig
from peagle.engine.sampling import SamplingParams
from peagle.engine.tree import Tree
from peagle.models.llama import LlamaModel
from peagle.models.loader import init_drafter


@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


def auto_engine(target, head, method, **kw):
    return fixed_costs(make_engine(target, head, method, "auto", max_speculative_tokens=8, **kw))


def chosen(engine, ps, params) -> tuple[list[list[int]], list[int]]:
    """Outputs, and the K of every step's drafts."""
    ks, choose = [], engine.scheduler.auto.choose

    def spy(*a):
        tree = choose(*a)
        ks.append(len(tree))
        return tree

    engine.scheduler.auto.choose = spy
    return [o.token_ids for o in engine.generate(ps, params)], ks


def outcome(drafted: int, accepted: int) -> list[int | None]:
    """What a chain's round tells :meth:`AutoK.record`: the top candidate accepted at each accepted
    position, none at the one that was rejected (if drafted)."""
    return [0] * accepted + ([None] if accepted < drafted else [])


def set_counts(auto: AutoK, accepted: list[float], tried: list[float]) -> None:
    """Acceptance counts of a chain (rank 0) at each position."""
    auto.accepted, auto.tried = [[a] for a in accepted], list(tried)


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_auto_is_lossless_at_every_k_it_picks(llama, method):
    ps = prompts(3, seed=1)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)]
    seen = set()
    for wrong_every in (2, 4, 1000):
        head = OracleDrafter.of(llama, ps[0] + ref[0], wrong_every)
        engine = auto_engine(llama, head, method)
        watch = Watch(engine)
        got, ks = chosen(engine, ps[:1], params)
        watch.check(got, ref[:1], rate=0.2 if wrong_every == 2 else 1 / 3)   # (every other draft wrong: a fifth)
        seen |= set(ks)
    got, ks = chosen(auto_engine(llama, init_drafter(llama, 2, MASK, seed=3), method), ps, params)
    assert got == ref
    assert len(seen | set(ks)) >= 3  # several K were in play, 0 among them


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_useless_head_drafts_nothing_and_perfect_head_the_maximum(llama, method):
    p = prompts(1, seed=2)[0]
    params = SamplingParams(max_tokens=80, ignore_eos=True)
    ref = make_engine(llama, None, "none").generate([p], params)[0].token_ids
    useless = OracleDrafter.of(llama, p + ref, wrong_every=1)   # every draft is wrong
    perfect = OracleDrafter.of(llama, p + ref, wrong_every=10 ** 6)
    _, ks = chosen(auto_engine(llama, useless, method), [p], params)
    # while the prior fades, a few percent of acceptance still pays for a draft this cheap to
    # verify; settled, only the periodic probes (two positions deep) draft
    settled = ks[30:]
    assert len(settled) > 40 and set(settled) == {0, 2} and settled.count(2) <= len(settled) // 32 + 1, ks
    engine = auto_engine(llama, perfect, method)
    w = engine.scheduler.auto.warmup
    _, ks = chosen(engine, [p], params)
    assert w >= 3 and ks[:w] == [0] * w, ks  # the engine's warm-up: plain steps, timed, before any draft is weighed
    assert sum(k == 8 for k in ks[w + 2:]) >= len(ks[w + 2:]) - 1, ks


def test_k_shrinks_as_the_batch_grows_and_follows_acceptance():
    auto = AutoK(8, True, TARGET, DRAFTER, prior=1e-6)
    for _ in range(200):
        auto.record(outcome(8, 5))    # the first 5 positions accepted, the sixth rejected
    assert [q[0] for q in auto.acceptance()[:6]] == pytest.approx([1, 1, 1, 1, 1, 0], abs=1e-3)
    assert len(auto.choose(1)) == 5   # the sixth draft would never pay
    set_counts(auto, [70.0] * 8, [100.0] * 8)   # 70% at every position
    assert len(auto.choose(1)) == 7 and len(auto.choose(16)) < 4   # the 8th: +1.8% tokens for +5.7% time
    ks = []
    for _ in range(400):     # the text changed: nothing is accepted any more (one round a step)
        auto.record(outcome(ks[-1] if ks else 8, 0))
        ks.append(len(auto.choose(1)))
    assert ks[0] == 7 and ks[-1] == 0 and ks[300:].count(0) >= 90   # 100 rounds of old evidence fade


def test_auto_config_and_k_max(llama):
    head = init_drafter(llama, 1, MASK, trained_k=6)
    engine = make_engine(llama, head, "parallel", "auto")
    assert engine.bounds.k_max == 6 and engine.scheduler.auto.target(1) > 0 and engine.scheduler.auto.drafter(1) > 0
    engine.generate([prompts(1)[0]], SamplingParams(max_tokens=30, ignore_eos=True))
    assert engine.scheduler.auto.scale and all(s > 0 for s in engine.scheduler.auto.scale.values())  # steady steps were timed
    with pytest.raises(ValueError, match="exceeds"):
        make_engine(llama, head, "parallel", "auto", max_speculative_tokens=7)
    with pytest.raises(ValueError, match="'auto'"):
        EngineConfig(num_speculative_tokens="seven")


def test_probes_back_off_while_nothing_pays_and_return_when_drafting_does():
    auto = AutoK(8, True, TARGET, DRAFTER, prior=1e-6)
    ks = []
    for _ in range(700):     # nothing is ever accepted
        ks.append(len(auto.choose(16)))
        auto.record(outcome(ks[-1], 0))
    probes = [i + 1 for i, k in enumerate(ks) if k]
    assert set(ks) == {0, 2} and probes[:5] == [16, 48, 112, 176, 240], probes   # 16, 32, 64, 64, 64 apart
    set_counts(auto, [90.0] * 8, [100.0] * 8)   # the text turned predictable
    assert len(auto.choose(1)) > 0
    start = auto.steps
    for _ in range(40):
        k = len(auto.choose(1))
        auto.record(outcome(k, k))
    assert auto.next_probe - auto.steps <= auto.probe_every and auto.steps - start == 40   # back to every 16


def test_no_probe_where_even_a_head_always_right_would_not_pay():
    """Rows that cost what they hold (compute-bound: 16 sequences on a CPU): a chain of d drafts all accepted
    yields d + 1 tokens for d + 1 times the rows, under the margin, so no probe is drafted however long nothing
    pays; one sequence, whose extra rows are nearly free, still probes on the same curve."""
    linear = CostCurve([1, 16, 256], [0.2, 1.0, 16.0])
    auto = AutoK(8, True, linear, CostCurve([1, 256], [0.0, 0.0]), prior=1e-6)
    assert not auto.could_pay(16, 16 / linear(16)) and auto.could_pay(1, 1 / linear(1))
    assert not any(auto.choose(16) for _ in range(300))
    assert any(auto.choose(1) for _ in range(100))


def test_resuming_pays_for_the_drafters_catch_up():
    """A draft that just pays for itself (K=1 marginally faster than K=0 at 16 sequences) is not
    worth resuming for when the drafter must first read 64 missed steps of 16 sequences; a clear
    gain still is. (No margin here: the catch-up's price alone is under test.)"""
    auto = AutoK(4, True, TARGET, DRAFTER, prior=1e-6, margin=0.0)
    rate = lambda k: 16 * auto.plan()[1][k] / auto.step_seconds(k, k, 16)   # noqa: E731
    set_counts(auto, [65.0, 0, 0, 0], [100.0, 0, 0, 0])
    assert rate(0) < rate(1) < 1.05 * rate(0)
    assert len(auto.choose(16)) == 1 and len(auto.choose(16, missed_rows=16 * 64)) == 0
    set_counts(auto, [95.0] * 4, [100.0] * 4)
    assert len(auto.choose(16, missed_rows=16 * 64)) > 0


def test_a_long_prompts_catch_up_is_priced_at_the_measured_prefill_rate():
    """Past the row counts timed at start-up the drafter's curve (decode-sized passes) prices a 2,000-row
    catch-up at what its weights cost; with the target's measured prefill seconds per row it is the drafter's
    share of that: resuming for a marginal gain is then declined."""
    auto = AutoK(4, True, TARGET, DRAFTER, prior=1e-6, margin=0.0)
    per_row = TARGET(256) / 256 * 4   # a prefill row four times a batched decode row's price (attention)
    assert auto.catch_up_seconds(2000) == DRAFTER(2000)
    assert auto.catch_up_seconds(2000, per_row) == pytest.approx(2000 * per_row * DRAFTER(256) / TARGET(256))
    assert auto.catch_up_seconds(64, per_row) == DRAFTER(64)   # within the measured rows: the curve
    set_counts(auto, [50.0, 0, 0, 0], [100.0, 0, 0, 0])
    assert len(auto.choose(1, missed_rows=2000)) > 0 and len(auto.choose(1, missed_rows=2000, prefill_row_s=per_row)) == 0


def test_a_probe_that_could_not_win_back_its_catch_up_is_skipped():
    """When nothing pays, a probe drafts two positions anyway, and first the drafter reads every row it
    missed; a catch-up over a tenth (the margin) of the time the batch's requests have left is not spent."""
    auto = AutoK(4, True, TARGET, DRAFTER, prior=1e-6, probe_every=1)
    set_counts(auto, [1.0, 0, 0, 0], [100.0, 0, 0, 0])   # nothing pays: only probes draft
    step, catch = auto.corrected_seconds(0, 0, 1), auto.catch_up_seconds(500)
    left = int(catch / (auto.margin * step))
    for steps_left, probes in ((None, True), (2 * left, True), (left // 2, False)):  # unknown, time enough, too late
        auto.next_probe = auto.steps + 1   # the next step is a probe's
        assert len(auto.choose(1, missed_rows=500, steps_left=steps_left)) == (2 if probes else 0), steps_left


def test_measured_step_times_correct_the_cost_model():
    """The start-up curves say one draft pays at 30% acceptance; steps at K=1 measured at 1.5x the
    modelled time (what bare passes leave out) say it does not, and K drops to 0."""
    auto = AutoK(4, True, TARGET, DRAFTER, prior=1e-6)
    set_counts(auto, [30.0, 0, 0, 0], [100.0, 0, 0, 0])
    assert len(auto.choose(4)) >= 1
    for _ in range(20):
        auto.observe(8, Tree.chain(1), 4, 1.5 * auto.step_seconds(1, 1, 4))
        auto.observe(4, Tree.chain(0), 4, auto.step_seconds(0, 0, 4))
    assert auto.scale[8] == pytest.approx(1.5) and len(auto.choose(4)) == 0


def test_steps_verifying_drafts_alone_price_the_rows_for_the_head_and_the_gate():
    """Steps that verify the text's or the responses' drafts alone (no drafter pass), most steps where the head is
    weak, are timed too: at 1.5x the curve (the extra rows dearer than at start-up: another tenant's work on the
    core), the head's K=1 at 30% no longer pays, nor do the responses' drafts that yield 0.3 tokens a step."""
    auto = AutoK(4, True, TARGET, DRAFTER, prior=1e-6)
    set_counts(auto, [30.0, 0, 0, 0], [100.0, 0, 0, 0])
    auto.gated["responses"] = [6.0, 20.0]
    assert len(auto.choose(1)) >= 1 and auto.lookup_pays(1, 1, "responses")
    for _ in range(20):
        auto.observe(2, Tree(()), 1, 1.5 * auto.step_seconds(1, 0, 1))
        auto.observe(1, Tree(()), 1, auto.step_seconds(0, 0, 1))
    assert auto.scale == {2: pytest.approx(1.5), 1: pytest.approx(1.0)}
    # one sequence's rows do not price a batch's: sixteen sequences' rows are nearest the 2-row steps' alike
    assert auto.corrected_seconds(1, 0, 16) / auto.corrected_seconds(0, 0, 16) == pytest.approx(TARGET(32) / TARGET(16))
    set_counts(auto, [30.0, 0, 0, 0], [100.0, 0, 0, 0])
    auto.gated["responses"] = [6.0, 20.0]
    assert len(auto.choose(1)) == 0 and not auto.lookup_pays(1, 1, "responses")


def test_a_drafted_step_costs_at_least_the_batchs_plain_step_error():
    """Sixteen sequences (a Zen 4): plain steps ran 1.8x the start-up curve, a 25-row step once
    1.37x. Priced by that low, a response draft for each looked cheap enough for its 0.41 tokens a step, and drafting
    grew while serving lost; priced with the plain step's error it is not, and a fast step is still seen as one."""
    auto = AutoK(4, True, TARGET, DRAFTER)
    auto.observe(16, Tree(()), 16, 1.8 * auto.step_seconds(0, 0, 16))
    auto.observe(25, Tree(()), 16, 1.37 * auto.pass_seconds(25, 0, 16))
    auto.gated["responses"] = [10.2, 26.6]
    assert auto.corrected_seconds(1, 0, 16) == pytest.approx(1.8 * auto.step_seconds(1, 0, 16))
    assert not auto.lookup_pays(1, 16, "responses")
    auto.observe(32, Tree(()), 16, 2.5 * auto.pass_seconds(32, 0, 16))   # dearer rows keep their own error
    assert auto.corrected_seconds(1, 0, 16) == pytest.approx(2.5 * auto.step_seconds(1, 0, 16))
    assert auto.corrected_seconds(0, 0, 16) == pytest.approx(1.8 * auto.step_seconds(0, 0, 16))


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_steps_at_k0_skip_the_drafter_and_leave_no_hole_in_its_kv(llama, method):
    """Steps at K = 0 run no drafter pass; when drafting resumes, the rows it missed are read first:
    the drafter's KV of every position then equals that of a run that drafted every step."""
    p = prompts(1, seed=6)[0]
    head = init_drafter(llama, 2, MASK, seed=4)
    kv, outs = [], []
    for plan in ([3] * 20, [3, 0, 0, 0, 2, 0, 0, 3, 0, 3, 3, 0, 0, 0, 0, 0, 3, 3, 3, 3]):
        engine = auto_engine(llama, head, method)
        ks = iter(plan)
        engine.scheduler.auto.choose = lambda *a: Tree.chain(next(ks))
        calls, propose = [], engine.runner.propose
        engine.runner.propose = lambda *a: calls.append(1) or propose(*a)
        seq = engine.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True))
        for _ in range(len(plan)):
            engine.step()
        assert len(calls) == sum(k > 0 for k in plan)
        n = seq.num_cached - 1   # positions whose drafter KV a kept row wrote
        slots = torch.tensor([seq.block_table[q // 16] * 16 + q % 16 for q in range(n)])
        kv.append([torch.cat([c.k[slots], c.v[slots]]) for c in engine.runner.drafter_caches])
        outs.append(seq.output_ids)
    m = min(len(outs[0]), len(outs[1]))
    assert outs[0][:m] == outs[1][:m]
    n = min(kv[0][0].shape[0], kv[1][0].shape[0]) // 2
    for a, b in zip(*kv):
        torch.testing.assert_close(a[:n], b[:n], atol=1e-5, rtol=1e-5)


def test_a_gain_inside_the_cost_models_error_is_not_drafted():
    """Drafting must beat plain decoding by ``margin`` in the model: a modelled gain of 5% is within the
    error measured on the quantized default model (where near break-even it drafted at 0.88x plain),
    one of 15% is drafted."""
    rows_free = CostCurve([1, 16], [1.0, 1.0])
    drafter_free = CostCurve([1, 16], [0.0, 0.0])
    auto = AutoK(1, True, rows_free, drafter_free, prior=1e-6, probe_every=10 ** 6)
    set_counts(auto, [5.0], [100.0])     # K=1: 1.05 tokens a step for the same time
    assert len(auto.choose(1)) == 0
    set_counts(auto, [15.0], [100.0])    # 1.15 tokens a step
    assert len(auto.choose(1)) == 1



def page_frame(addr: int) -> int | None:
    """The physical frame behind a virtual address of this process (/proc/self/pagemap), None where no page is
    mapped; 0 where the kernel hides frames from this user."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // mmap.PAGESIZE * 8)
        entry = int.from_bytes(f.read(8), "little")
    return entry & ((1 << 55) - 1) if entry >> 63 else None


def test_measuring_costs_writes_the_context_it_reads(llama):
    """The start-up passes read a 128-position context nothing wrote. On the CPU a read of an untouched page maps
    the zero page, which the first request's write there must then copy (a TLB shootdown a page: +7 ms on a
    96-token prefill); written first, those pages are the pool's own from the start."""
    probe = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    untouched = torch.frombuffer(probe, dtype=torch.uint8)
    assert int(untouched[0]) == 0   # a read: the zero page is mapped there
    zero = page_frame(untouched.data_ptr())
    if not zero:
        pytest.skip("/proc/self/pagemap hides page frames from this user")
    p = prompts(1, seed=2)[0]
    engine = auto_engine(llama, OracleDrafter.of(llama, p, wrong_every=1), "parallel")
    for c in engine.runner.target_caches + engine.runner.drafter_caches:
        for pool in (c.k, c.v):
            context = pool[:128]
            pages = range(context.data_ptr(), context.data_ptr() + context.numel() * context.element_size(), mmap.PAGESIZE)
            assert all(page_frame(a) not in (None, zero) for a in pages)


def test_costs_are_timed_round_robin_each_drafter_pass_after_a_target_pass(llama, monkeypatch):
    """The start-up passes as a step runs them: every drafter pass right after the target's pass of its size (its
    weights cold then, as in decoding, not warm from its own previous pass), the sizes in turn each round."""
    import peagle.engine.model_runner as mr

    engine = auto_engine(llama, OracleDrafter.of(llama, prompts(1, seed=2)[0], wrong_every=1), "parallel")
    calls, decode, propose = [], LlamaModel.decode, mr.ModelRunner.propose
    monkeypatch.setattr(LlamaModel, "decode", lambda self, *a: (calls.append(("target", len(a[-1]))), decode(self, *a))[1])

    def drafting(self, spans, *args):   # P-EAGLE's pass as a step drafts: verified rows, then K - 1 mask slots
        calls.append(("drafter", sum(s.num_rows for s in spans) + args[-1] - 1))
        return propose(self, spans, *args)
    monkeypatch.setattr(mr.ModelRunner, "propose", drafting)
    target, drafter = engine.runner.measure_costs(rounds=2)
    assert calls == [(who, n) for _ in range(3) for n in target.rows for who in ("target", "drafter")]
    assert drafter.rows == target.rows and all(s > 0 for s in target.seconds + drafter.seconds)


def test_costs_are_measured_once_a_machine_and_remembered(llama, monkeypatch, tmp_path):
    """The start-up passes (~60: 1.9 s of a 1B target's start) run once for a machine, thread count, library,
    models and bounds: a later engine takes the curves from the file. A torn file, a value of the wrong shape, or
    another thread count measures again. Planted faults: a remembered value taken whatever its shape (the torn or
    short one), a key without the thread count."""
    import peagle.engine.model_runner as mr
    from conftest import torch_threads

    engine = auto_engine(llama, OracleDrafter.of(llama, prompts(1, seed=2)[0], wrong_every=1), "parallel")
    runner, memo, measured = engine.runner, tmp_path / "costs.json", []
    measure = mr.ModelRunner.measure_costs
    monkeypatch.setattr(mr.ModelRunner, "measure_costs", lambda self: (measured.append(1), measure(self, rounds=1))[1])
    first = pass_costs(runner, memo)
    again = pass_costs(runner, memo)
    assert len(measured) == 1 and [c.seconds for c in again] == [c.seconds for c in first]
    key = next(iter(json.loads(memo.read_text())))
    for broken in ("{not json", json.dumps({key: [[0.1], [0.1]]}), json.dumps({key: "fast"})):
        memo.write_text(broken)
        pass_costs(runner, memo)
    assert len(measured) == 4
    with torch_threads(torch.get_num_threads() + 1):
        pass_costs(runner, memo)
    assert len(measured) == 5 and len(json.loads(memo.read_text())) == 2


def test_a_curve_never_falls_with_more_rows():
    """One row's pass timed above two rows' (timed first, cold) is noise: plain decoding priced from it
    made a round of K=2 look cheaper than a plain step."""
    curve = CostCurve([1, 2, 4, 8], [3.2e-3, 2.9e-3, 3.1e-3, 3.6e-3])
    assert curve(1) == pytest.approx(2.9e-3) and curve(2) == pytest.approx(2.9e-3)
    assert curve(8) == pytest.approx(3.6e-3) and curve(6) == pytest.approx(3.35e-3)


def test_timing_error_follows_lows_at_once_and_highs_slowly():
    """A request's first steps run slow: the plain step's error, timed then, must fall to the steady
    time as soon as a step shows it, or every round looks cheap against it."""
    auto = AutoK(8, True, TARGET, DRAFTER)
    plain, t = Tree(()), TARGET(1)
    for seconds in (1.35 * t, 1.3 * t, 1.0 * t):
        auto.observe(1, plain, 1, seconds)
    assert auto.scale[1] == pytest.approx(1.0)
    auto.observe(1, plain, 1, 2.0 * t)   # one step slowed by another tenant
    assert auto.scale[1] == pytest.approx(1.1)


def test_a_step_without_the_heads_drafts_counts_what_the_text_drafted_alone():
    """Where the text's own drafts (prompt lookup) add tokens to the steps without the head's, drafting with
    the head must beat that, not plain decoding: a head at 40% a position drafts, until steps at K=0 are
    measured to yield 0.8 tokens more each."""
    auto = AutoK(8, True, TARGET, DRAFTER, prior=1e-6)
    set_counts(auto, [40.0] * 8, [100.0] * 8)
    assert len(auto.choose(1)) > 0
    for _ in range(50):
        auto.record_lookup(1)
        auto.record_lookup(0)
        auto.record_lookup(1)
        auto.record_lookup(1)
        auto.record_lookup(1)
    set_counts(auto, [40.0] * 8, [100.0] * 8)
    assert len(auto.choose(1)) == 0


@pytest.mark.parametrize("gate,other", [("short", "responses"), ("responses", "short")])
def test_gated_drafts_are_verified_only_while_they_pay_their_rows(gate, other):
    """The text's drafts from a short match, and the earlier responses' drafts, verified alone, cost rows a plain
    step does not read: where 4 rows cost 1.4x one (a Zen 4's curve), 3 of them must yield 0.4 tokens a step.
    Tried first (a pseudo-step at one token), refused once they yield less, tried again as that evidence fades;
    dearer at a larger batch; each kind weighed by its own hits."""
    auto = AutoK(8, True, CostCurve([1, 4, 16], [1.0, 1.4, 4.0]), DRAFTER)
    assert auto.lookup_pays(3, 1, gate)
    for _ in range(20):
        auto.record_lookup(0, gate)
    assert not auto.lookup_pays(3, 1, gate) and auto.lookup_steps == auto.gated[gate][1] == 20
    assert auto.lookup_pays(3, 1, other)     # the other kind's own evidence: none yet
    for _ in range(20):
        auto.record_lookup(1, gate)
    assert auto.lookup_pays(3, 1, gate)      # half of them accepted: 0.5 tokens a step
    assert not auto.lookup_pays(3, 4, gate)  # 16 rows cost 2.9x four: not at 0.5
    auto.record_lookup(3)                    # a long match's hits are not a gated kind's
    assert auto.gated[gate][0] == 20 and auto.lookup_tokens == 23 and auto.gated[other] == [0.0, 0.0]
    for _ in range(20):
        auto.record_lookup(0, gate)
    assert not auto.lookup_pays(3, 1, gate)
    for _ in range(300):                     # steps without such drafts: the evidence fades to the prior
        auto.choose(1)
    assert auto.lookup_pays(3, 1, gate)
