"""peagle's native CPU kernels (peagle/kernels): every instruction set this CPU runs gives the bits of
the scalar reference of its lane order, a row's result does not depend on how many rows share the
pass (batch invariance), results are float32-accurate against float64, and without the kernels
(``PEAGLE_NATIVE=0``, or not built) the models run on torch's matmul with the same results up to
rounding. ``make setup`` builds the kernels: here they must be there unless turned off."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peagle import kernels

LANES = {"avx512": 16, "avx2": 8, "scalar": 8}
WTYPES = (torch.float32, torch.float16, torch.bfloat16)
NATIVE_OFF = os.environ.get("PEAGLE_NATIVE") == "0"


native = pytest.mark.skipif(NATIVE_OFF, reason="PEAGLE_NATIVE=0: the torch path is under test")


def each_isa():
    """Every instruction set the kernels have, one test case each: run where this CPU (under
    ``PEAGLE_ISA``) has it, skipped with the reason where not, so the report says which paths ran."""
    best = "none" if NATIVE_OFF or not kernels.available() else kernels.isa()
    order = list(LANES)
    return pytest.mark.parametrize("isa", [
        pytest.param(isa, marks=pytest.mark.skipif(best == "none" or order.index(isa) < order.index(best),
                                                   reason="the native kernels are off" if best == "none" else
                                                   f"this CPU (or PEAGLE_ISA) has no {isa}"))
        for isa in LANES])


@native
def test_the_kernels_are_built():
    assert kernels.available(), "the native kernels are not built: `make setup` builds them"
    assert kernels.isa() in LANES


def test_a_killed_builds_lock_does_not_stop_the_next_build(tmp_path, monkeypatch):
    """torch's build waits forever on a ``lock`` file a killed build left; peagle's own lock (released by the OS
    with its process) tells a leftover from a build running now."""
    import torch.utils.cpp_extension as ext

    built = []

    def load(name, build_directory, **kw):  # torch's FileBaton: wait while `lock` exists (here: fail at once)
        assert not (Path(build_directory) / "lock").exists(), "would wait forever on a dead build's lock"
        built.append(name)

    monkeypatch.setattr(ext, "load", load)
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(kernels, "STAMP", tmp_path / "stamp")
    (tmp_path / "lock").write_text("")  # a build killed mid-way
    kernels.build()
    assert built == ["peagle_kernels"] and (tmp_path / "stamp").read_text() == kernels._fingerprint()


def case(m: int, k: int, n: int, wtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(wtype)
    b = torch.randn(n, generator=g)
    return x, w, b


@each_isa()
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("k,n", [(64, 40), (576, 96), (77, 13), (1536, 24)])  # 77: a tail in every lane width
def test_each_isa_gives_the_bits_of_its_reference(wtype, k, n, isa):
    """The scalar ISA runs the SIMD tiles over plain C++ lanes; the reference is loops of its own."""
    x, w, b = case(70, k, n, wtype)  # 70 rows: full tiles, leftover rows, and a second row chunk
    for bias in (None, b):
        got = torch.ops.peagle.linear(x, w, bias, isa)
        assert torch.equal(got, torch.ops.peagle.linear_ref(x, w, bias, LANES[isa])), (isa, wtype, k, n)


@each_isa()
@pytest.mark.parametrize("wtype", WTYPES)
def test_columns_split_between_two_threads_give_the_references_bits(wtype, isa):
    """The suite runs one torch thread; with two, each takes a range of columns (at least 64: odd widths past
    128 here)."""
    from conftest import torch_threads

    with torch_threads(2):
        for n in (200, 333):
            x, w, b = case(9, 576, n, wtype, seed=3)
            for m in (1, 2, 4, 8, 9):
                got = torch.ops.peagle.linear(x[:m], w, b, isa)
                assert torch.equal(got, torch.ops.peagle.linear_ref(x[:m], w, b, LANES[isa])), (isa, wtype, n, m)


@each_isa()
@pytest.mark.parametrize("wtype", WTYPES)
def test_a_rows_result_does_not_depend_on_the_pass(wtype, isa):
    """Each row alone, and in passes of every height from 1 to 70 rows, gives the same bits."""
    x, w, b = case(70, 576, 72, wtype, seed=1)
    alone = torch.cat([torch.ops.peagle.linear(x[i:i + 1], w, b, isa) for i in range(len(x))])
    for m in range(1, len(x) + 1):
        assert torch.equal(torch.ops.peagle.linear(x[:m], w, b, isa), alone[:m]), (isa, wtype, m)
    assert torch.equal(torch.ops.peagle.linear(x[3:11], w, b, isa), alone[3:11])  # any rows, any offset


@each_isa()
@pytest.mark.parametrize("wtype", WTYPES)
def test_results_are_float32_accurate(wtype, isa):
    x, w, b = case(9, 1536, 64, wtype, seed=2)
    exact = x.double() @ w.double().t() + b.double()
    got = torch.ops.peagle.linear(x.view(3, 3, -1), w, b, isa).view(9, -1)  # leading dims kept
    assert (got.double() - exact).abs().max() < 1e-5 * exact.abs().max()


@native
def test_the_reference_is_not_blind_to_lane_order():
    """The bitwise checks above could not fail if every lane order gave the same bits: they do not."""
    x, w, b = case(16, 1536, 64, torch.float32, seed=3)
    assert not torch.equal(torch.ops.peagle.linear_ref(x, w, b, 8), torch.ops.peagle.linear_ref(x, w, b, 16))


@native
def test_bad_input_is_refused_clearly():
    x, w, _ = case(2, 64, 8, torch.float16)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.peagle.linear(x.half(), w)
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.peagle.linear(x[:, :32], w)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.peagle.linear(x, w.t().contiguous().t())
    with pytest.raises(RuntimeError, match="unknown instruction set"):
        torch.ops.peagle.linear(x, w, None, "sse9")


FALLBACK = """
import os, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import native_from_hf, run_full, tiny_hf
from peagle import kernels
from peagle.models import layers
print(kernels.available(), kernels.isa())
x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
w = torch.randn(24, 64, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    lin = layers.linear(x, w)
logits, taps = run_full(native_from_hf(tiny_hf("qwen2")), torch.arange(3, 40))  # every layer op, either path
torch.save((lin, logits, taps), sys.argv[1])
"""


def test_fallback_takes_over_and_agrees_with_the_kernels(tmp_path):
    """With the kernels turned off, ``False`` and torch's ops; a linear and a whole tiny model (every
    layer op: norms, RoPE, KV write, attention, SwiGLU, biases) give the same results up to rounding."""
    outs = {}
    for flag in ("0", "1"):
        env = {**os.environ, "PEAGLE_NATIVE": flag}
        out = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path / flag), str(Path(__file__).parent)],
                             env=env, capture_output=True, text=True, check=True)
        outs[flag] = (out.stdout.split(), torch.load(tmp_path / flag))
    assert outs["0"][0] == ["False", "none"]
    assert outs["1"][0][0] == "True"
    for a, b in zip(outs["0"][1], outs["1"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_missing_build_says_so_and_falls_back(tmp_path, monkeypatch, capsys):
    was = kernels.available()
    monkeypatch.setattr(kernels, "LIBRARY", tmp_path / "nothing.so")
    monkeypatch.delenv("PEAGLE_NATIVE", raising=False)
    kernels.available.cache_clear()
    try:
        assert kernels.available() is False
        assert "native kernels not built (run `make setup`)" in capsys.readouterr().err
    finally:
        monkeypatch.undo()
        kernels.available.cache_clear()
    assert kernels.available() == was


def paged_case(d: int = 64, H: int = 9, Hkv: int = 3, bs: int = 16, seed: int = 0):
    """Three sequences (contexts 5, 70 and 200 keys) in shuffled blocks of a pool; rows at the last
    positions of each (decode and verify rows)."""
    g = torch.Generator().manual_seed(seed)
    ctx = [5, 70, 200]
    nblocks = sum(-(-c // bs) for c in ctx)
    order = torch.randperm(nblocks, generator=g).tolist()
    tables, i = [], 0
    for c in ctx:
        n = -(-c // bs)
        tables.append(order[i:i + n] + [0] * (13 - n))
        i += n
    slots = nblocks * bs
    k, v = torch.randn(slots + 1, Hkv, d, generator=g) * 2, torch.randn(slots + 1, Hkv, d, generator=g)
    seq = [0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    pos = [3, 4, 69] + list(range(192, 200))
    q = torch.randn(len(seq), H, d, generator=g)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return q, k, v, as_long(tables), as_long(seq), as_long(pos), bs


def attention_f64(q, k, v, table, seq, pos, bs, window=0, sinks=None):
    """Plain softmax attention in float64, one row at a time."""
    H, d, Hkv = q.shape[1], q.shape[2], k.shape[1]
    out = torch.empty(q.shape[0], H * d, dtype=torch.float64)
    for r in range(q.shape[0]):
        p = int(pos[r])
        keys = torch.arange(max(0, p - window + 1) if window else 0, p + 1)
        slot = table[seq[r], keys // bs] * bs + keys % bs
        for h in range(H):
            kv = h // (H // Hkv)
            s = (k[slot, kv].double() @ q[r, h].double()) * d ** -0.5
            if sinks is not None:
                s = torch.cat([s, sinks[h].double().view(1)])
            pr = s.softmax(0)[:len(slot)]
            out[r, h * d:(h + 1) * d] = pr @ v[slot, kv].double()
    return out


@each_isa()
@pytest.mark.parametrize("d", [64, 24, 80])  # 24: a tail in every lane width; 80: four chunks and one more
@pytest.mark.parametrize("window", [0, 50])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_matches_its_reference_and_float64(d, window, with_sinks, isa):
    """The reference walks each row's keys alone (attend_row: no tiles, no shared key loads, its own
    window and block arithmetic), so a fault in the tiles' key walk fails here on every ISA, scalar too."""
    q, k, v, table, seq, pos, bs = paged_case(d)
    sinks = torch.randn(q.shape[1]) if with_sinks else None
    rows = torch.arange(q.shape[0])
    exact = attention_f64(q, k, v, table, seq, pos, bs, window, sinks)
    got = torch.ops.peagle.attention(q, k, v, table, seq, pos, rows, bs, window, d ** -0.5, sinks, isa)
    ref = torch.ops.peagle.attention_ref(q, k, v, table, seq, pos, rows, bs, window, d ** -0.5, sinks, LANES[isa])
    assert torch.equal(got, ref), isa
    assert (got.double() - exact).abs().max() < 1e-5, isa


@each_isa()
@pytest.mark.parametrize("window", [0, 50])
def test_an_attention_rows_result_does_not_depend_on_the_pass(window, isa):
    """Each row alone, in tiles of any size with its sequence's other rows, and in the whole pass gives
    the same bits (rows of one sequence share key loads in tiles of up to 32 // g rows)."""
    q, k, v, table, seq, pos, bs = paged_case()
    run = lambda rows, **kw: torch.ops.peagle.attention(  # noqa: E731
        kw.get("q", q), k, v, kw.get("table", table), kw.get("seq", seq), kw.get("pos", pos),
        torch.tensor(rows), bs, window, 0.125, None, isa)
    full = run(list(range(len(q))))
    for r in range(len(q)):
        assert torch.equal(run([r])[r], full[r]), (isa, r)
    for first in range(3, 11):  # sequence 2's rows from `first` on: tiles starting anywhere
        assert torch.equal(run(list(range(first, 11)))[first:], full[first:]), (isa, first)
    # the same sequence's row handed in as the only row of its own pass (another q tensor, another table)
    alone = run([0], q=q[5:6].clone(), table=table[2:3].clone(), seq=torch.tensor([0]), pos=pos[5:6].clone())
    assert torch.equal(alone[0], full[5])


@each_isa()
def test_a_lone_sequences_rows_cut_for_two_threads_keep_their_bits(isa):
    """With fewer work items than two a thread, a sequence's rows are cut into tiles of equal heights (8 rows:
    4 + 4; 5: 3 + 2; three or fewer stay whole). The suite runs one thread, where nothing is cut: here two,
    and every row gives the reference's bits, as it does alone."""
    from conftest import torch_threads

    q, k, v, table, seq, pos, bs = paged_case()
    with torch_threads(2):
        for rows in (range(3, 11), range(3, 8), range(3, 6), range(3, 5)):
            rows = torch.tensor(list(rows))
            got = torch.ops.peagle.attention(q, k, v, table, seq, pos, rows, bs, 0, 0.125, None, isa)
            ref = torch.ops.peagle.attention_ref(q, k, v, table, seq, pos, rows, bs, 0, 0.125, None, LANES[isa])
            assert torch.equal(got[rows], ref[rows]), (isa, rows.tolist())


@each_isa()
@pytest.mark.parametrize("d", [64, 24])
@pytest.mark.parametrize("window", [0, 50])
def test_half_pools_give_the_bits_of_float32_pools_holding_the_same_values(d, window, isa):
    """The 16-bit KV cache: keys and values read from float16 pools through their exact conversion, so the
    result is the float32 kernel's over pools that torch converted (no code of the kernels' in the conversion),
    every row, alone or in its tiles; the reference reads half pools too."""
    q, k, v, table, seq, pos, bs = paged_case(d)
    k16, v16 = k.half(), v.half()
    assert not torch.equal(k16.float(), k)  # the rounding is there to be seen
    rows = torch.arange(q.shape[0])
    got = torch.ops.peagle.attention(q, k16, v16, table, seq, pos, rows, bs, window, d ** -0.5, None, isa)
    want = torch.ops.peagle.attention(q, k16.float(), v16.float(), table, seq, pos, rows, bs, window, d ** -0.5, None,
                                      isa)
    assert torch.equal(got, want), isa
    ref = torch.ops.peagle.attention_ref(q, k16, v16, table, seq, pos, rows, bs, window, d ** -0.5, None, LANES[isa])
    assert torch.equal(got, ref), isa
    one = torch.ops.peagle.attention(q, k16, v16, table, seq, pos, torch.tensor([7]), bs, window, d ** -0.5, None, isa)
    assert torch.equal(one[7], got[7])
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        torch.ops.peagle.attention(q, k16, v, table, seq, pos, rows, bs, window, d ** -0.5, None, isa)


@native
def test_rope_write_rounds_into_half_pools_as_torch_does():
    g = torch.Generator().manual_seed(5)
    T, H, Hkv, d = 4, 6, 2, 16
    qkv = torch.randn(T, H + 2 * Hkv, d, generator=g) * 30
    cos, sin = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
    k32, v32 = torch.zeros(10, Hkv, d), torch.zeros(10, Hkv, d)
    k16, v16 = k32.half(), v32.half()
    slots = torch.tensor([3, 9, 0, 5])
    torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k32, v32, slots)
    torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k16, v16, slots)
    assert torch.equal(k16, k32.half()) and torch.equal(v16, v32.half())
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k16, v32, slots)


@native
def test_rope_write_leaves_the_last_rows_keys_in_a_slot_several_rows_name():
    """The engine sends every row that keeps nothing to one scratch slot: the pools end as index_copy_ in row
    order leaves them (the last row's keys), the rows split over the threads (written concurrently, that slot
    was a data race under ThreadSanitizer). Planted fault: the first row's keys kept."""
    from conftest import torch_threads

    g = torch.Generator().manual_seed(6)
    T, H, Hkv, d = 64, 4, 2, 16
    qkv = torch.randn(T, H + 2 * Hkv, d, generator=g)
    cos, sin = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
    slots = torch.randint(0, 6, (T,), generator=g)
    slots[T // 2:] = torch.where(slots[T // 2:] < 3, 7, slots[T // 2:])  # slot 7 named in both threads' rows
    each_k, each_v = torch.zeros(T, Hkv, d), torch.zeros(T, Hkv, d)  # every row's keys in a slot of its own
    torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, each_k, each_v, torch.arange(T))
    k, v = torch.zeros(8, Hkv, d), torch.zeros(8, Hkv, d)
    with torch_threads(2):
        torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k, v, slots)
    for s in range(8):
        rows = (slots == s).nonzero().flatten()
        want = (each_k[rows[-1]], each_v[rows[-1]]) if len(rows) else (torch.zeros(Hkv, d), torch.zeros(Hkv, d))
        assert torch.equal(k[s], want[0]) and torch.equal(v[s], want[1]), s


@each_isa()
def test_norms_and_half_writes_give_the_scalar_bits_on_every_isa(isa):
    """rms_norm's rows (alone and after the residual add) and rope_write's float16 writes run a SIMD twin
    beside each scalar reference (norm_row, half_row): the same bits on every path, tails past every vector
    width and half's edges (subnormals, overflow, ties) included."""
    g = torch.Generator().manual_seed(6)
    x, r = torch.randn(5, 579, generator=g), torch.randn(5, 579, generator=g)  # 579: a tail of 3 past 8 lanes
    w = torch.randn(579, generator=g)
    T, H, Hkv, d = 3, 2, 1, 44                                                   # 44 floats: a tail of 4
    qkv = torch.randn(T, H + 2 * Hkv, d, generator=g) * 30
    qkv[0, H + Hkv, :6] = torch.tensor([1e-6, 7e4, -7e5, 2049.0, 2051.0, 6e-8])  # half's subnormals, overflow, ties
    cos, sin = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)

    def run():
        k, v = torch.zeros(4, Hkv, d, dtype=torch.float16), torch.zeros(4, Hkv, d, dtype=torch.float16)
        torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k, v, torch.tensor([2, 0, 3]))
        return [torch.ops.peagle.rms_norm(x, w, 1e-5), *torch.ops.peagle.add_rms_norm(x, r, w, 1e-5), k, v]

    with kernels.use_isa("scalar"):
        want = run()
    with kernels.use_isa(isa):
        got = run()
    for a, b in zip(got, want):
        assert torch.equal(a, b), isa
    # and float64's values (independent of the C++ on both sides): the norms within a few float32 roundings
    def norm64(h):
        return h / (h.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w.double()
    h64 = x.double() + r.double()
    for out, exact in ((got[0], norm64(x.double())), (got[1], norm64(h64)), (got[2], h64)):
        assert ((out.double() - exact).abs() <= 4e-7 * exact.abs() + 1e-7).all(), isa
    k32, v32 = torch.zeros(4, Hkv, d), torch.zeros(4, Hkv, d)
    torch.ops.peagle.rope_write(qkv.clone(), cos, sin, H, k32, v32, torch.tensor([2, 0, 3]))
    assert torch.equal(got[3], k32.half()) and torch.equal(got[4], v32.half())


@each_isa()
def test_silu_mul_gives_its_references_bits_and_float64s_values(isa):
    """silu_mul on every path: the bits of its scalar reference (silu_mul_ref, a loop of its own, not the SIMD
    template over plain lanes) and float64's silu(gate) * up within a few float32 roundings, over gates from
    -100 to 100 (exp_scalar's clamps and cut-off at -87 included) and a tail past every vector width: a fault in
    exp_scalar, which every path and the attention tiles share, shows here."""
    g = torch.Generator().manual_seed(9)
    gate = torch.cat([torch.linspace(-100, 100, 2001), torch.randn(1002, generator=g) * 8]).view(3, 1001)
    gu = torch.cat([gate, torch.randn(3, 1001, generator=g)], 1)  # n = 1001: a tail of 9 past 16 lanes
    with kernels.use_isa("scalar"):
        want = torch.ops.peagle.silu_mul(gu)
    with kernels.use_isa(isa):
        got = torch.ops.peagle.silu_mul(gu)
    assert torch.equal(got, want)
    a, u = gu[:, :1001].double(), gu[:, 1001:].double()
    exact = a / (1 + torch.exp(-a)) * u
    assert ((got.double() - exact).abs() <= 1e-6 * exact.abs() + 1e-30).all(), \
        (got.double() - exact).abs().div(exact.abs() + 1e-30).max()


@native
def test_row_ops_split_between_two_threads_give_one_threads_bits():
    """rms_norm (alone and after the residual add), silu_mul, rope_write, argmax and the integer path's row
    quantization split their rows between threads (in chunks of up to 16): 40 rows on two threads give the
    bits of one."""
    from conftest import torch_threads
    from test_quant import random_blocks

    from peagle.models.quant import blocks_of, pack

    g = torch.Generator().manual_seed(8)
    x, r = torch.randn(40, 576, generator=g), torch.randn(40, 576, generator=g)
    w, gu = torch.randn(576, generator=g), torch.randn(40, 2 * 96, generator=g)
    T, H, Hkv, d = 40, 2, 1, 16
    qkv = torch.randn(T, H + 2 * Hkv, d, generator=g)
    cos, sin = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
    blocks = pack(blocks_of(random_blocks("q8_0", 64, 576), "q8_0"))

    def run():
        k, v = torch.zeros(T, Hkv, d, dtype=torch.float16), torch.zeros(T, Hkv, d, dtype=torch.float16)
        q = qkv.clone()
        torch.ops.peagle.rope_write(q, cos, sin, H, k, v, torch.arange(T).flip(0))
        return [torch.ops.peagle.rms_norm(x, w, 1e-5), *torch.ops.peagle.add_rms_norm(x, r, w, 1e-5),
                torch.ops.peagle.silu_mul(gu), q, k, v, *torch.ops.peagle.argmax(x),
                torch.ops.peagle.linear(x, blocks, None)]

    one = run()
    with torch_threads(2):
        two = run()
    for a, b in zip(one, two):
        assert torch.equal(a, b)


@native
def test_layer_ops_match_torch():
    """rms_norm (alone and fused with the residual add), silu_mul and rope_write against torch's ops."""
    import torch.nn.functional as F

    from peagle.models.layers import apply_rope

    g = torch.Generator().manual_seed(4)
    x, r, w = (torch.randn(7, 576, generator=g) for _ in range(3))
    w = w[0].contiguous()
    torch.testing.assert_close(torch.ops.peagle.rms_norm(x, w, 1e-5), F.rms_norm(x, (576,), w, 1e-5))
    y, h = torch.ops.peagle.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(h, x + r)
    torch.testing.assert_close(y, F.rms_norm(x + r, (576,), w, 1e-5))
    gu = torch.randn(5, 2 * 96, generator=g)
    torch.testing.assert_close(torch.ops.peagle.silu_mul(gu), F.silu(gu[:, :96]) * gu[:, 96:])
    T, H, Hkv, d = 4, 6, 2, 16
    qkv = torch.randn(T, H + 2 * Hkv, d, generator=g)
    cos, sin = torch.randn(T, 1, d, generator=g), torch.randn(T, 1, d, generator=g)
    k, v = torch.zeros(10, Hkv, d), torch.zeros(10, Hkv, d)
    slots = torch.tensor([3, 9, 0, 5])
    want = apply_rope(qkv[:, :H + Hkv], (cos, sin))
    vals = qkv[:, H + Hkv:].clone()
    torch.ops.peagle.rope_write(qkv, cos.view(T, d), sin.view(T, d), H, k, v, slots)
    assert torch.equal(qkv[:, :H + Hkv], want)  # the same three rounded operations as torch's eager ones
    assert torch.equal(k[slots], want[:, H:]) and torch.equal(v[slots], vals)
    with pytest.raises(RuntimeError, match=r"slots\[3\] = 10 is no slot"):
        torch.ops.peagle.rope_write(qkv, cos.view(T, d), sin.view(T, d), H, k, v, torch.tensor([3, 9, 0, 10]))


def assert_stack_gives_layer_by_layer_bits(monkeypatch, model, passes, run_pass, tag=None):
    """``model``'s passes (``run_pass(p, caches)`` each: outputs to compare) with its ``native_stack`` and with
    its layers' own forwards (``stacks`` patched off): ``native_stack`` runs every pass where allowed, and both
    give the same outputs bit for bit and the same KV caches after."""
    cls, calls = type(model), []
    stack = cls.native_stack
    monkeypatch.setattr(cls, "native_stack", lambda *args: calls.append(1) or stack(*args))

    def run(stacked: bool):
        monkeypatch.setattr(cls, "stacks", cls.stacks if stacked else lambda *_: False)
        caches, outs = model.make_caches(128), []
        with torch.inference_mode():
            for p in passes:
                outs += run_pass(p, caches)
        return outs, caches

    stacked, stacked_caches = run(True)
    assert len(calls) == len(passes)
    plain, plain_caches = run(False)
    assert len(calls) == len(passes)
    for got, want in zip(stacked, plain):
        assert torch.equal(got, want), tag
    for got, want in zip(stacked_caches, plain_caches):
        assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v), tag


@native
@pytest.mark.parametrize("threads", [1, 2])   # two: the layers run in one team (team.h), each op's ranges split
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "llama3"])  # plain, a window, biases, scaled RoPE
def test_the_native_stack_gives_the_bits_of_the_layer_by_layer_path(family, threads, monkeypatch):
    """``peagle::decoder_layers`` (every layer in one call, decoding and verification) against the layers'
    own forwards: the same logits and taps bit for bit over a prompt, one-row steps and an 8-row
    verification pass of two sequences side by side, and the same KV cache after."""
    from conftest import native_from_hf, tiny_hf, torch_threads

    from peagle.models.attention import AttnMeta, Span
    from peagle.models.layers import set_precision
    from peagle.models.llama import LlamaModel

    target = native_from_hf(tiny_hf(family))
    set_precision(target, torch.bfloat16, torch.float32)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, target.cfg.vocab_size, (40,), generator=gen) for _ in range(2))
    passes = [([Span(30, 30, list(range(64)), 0)], [a[:30]], [torch.arange(30)]),
              ([Span(12, 12, list(range(64, 128)), 0)], [b[:12]], [torch.arange(12)])]
    passes += [([Span(1, p + 1, list(range(64)), p), Span(1, p - 17, list(range(64, 128)), p - 18)],
                [a[p:p + 1], b[p - 18:p - 17]], [torch.tensor([p]), torch.tensor([p - 18])]) for p in range(30, 32)]
    passes += [([Span(8, 40, list(range(64)), 32), Span(3, 17, list(range(64, 128)), 14)],
                [a[32:40], b[14:17]], [torch.arange(32, 40), torch.arange(14, 17)])]
    with torch_threads(threads):
        assert_stack_gives_layer_by_layer_bits(
            monkeypatch, target, passes, lambda p, caches: target(torch.cat(p[1]), torch.cat(p[2]), caches,
                                                                  AttnMeta(p[0], 1)), family)


@native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_the_drafters_native_stack_gives_the_bits_of_its_layer_by_layer_path(layers, norm_before_residual, threads,
                                                                              monkeypatch):
    """The drafter's layers in one ``peagle::decoder_layers`` call (layer 0 reading [normed embedding, normed
    hidden] handed in) against its layers' own forwards: the same normed and pre-norm outputs bit for bit over
    a prompt with rejected rows (no KV written), one-row passes and a 6-row pass of two sequences, and the same
    KV caches after."""
    import dataclasses

    from conftest import native_from_hf, tiny_hf

    from peagle.models.attention import AttnMeta, Span
    from peagle.models.drafter import Drafter
    from peagle.models.layers import set_precision
    from peagle.models.loader import init_drafter

    target = native_from_hf(tiny_hf("llama"))
    cfg = dataclasses.replace(init_drafter(target, layers, 3).cfg, norm_before_residual=norm_before_residual)
    head = Drafter(cfg)
    head.init_weights(1, std=0.2)  # large enough that a wrong key, mask or position moves the outputs
    set_precision(head, torch.bfloat16, torch.float32)
    head.eval()
    gen = torch.Generator().manual_seed(0)
    H = cfg.hidden_size
    passes = [([Span(20, 20, list(range(64)), 0)], 20, torch.arange(20), torch.arange(20) >= 18),
              ([Span(1, 21, list(range(64)), 20), Span(9, 9, list(range(64, 128)), 0)], 10,
               torch.cat([torch.tensor([20]), torch.arange(9)]), None),
              ([Span(4, 25, list(range(64)), 21), Span(2, 11, list(range(64, 128)), 9)], 6,
               torch.cat([torch.arange(21, 25), torch.arange(9, 11)]), torch.tensor([0, 0, 1, 0, 0, 0]).bool())]
    passes = [(*p, torch.randint(0, cfg.vocab_size, (p[1],), generator=gen), torch.randn(p[1], H, generator=gen))
              for p in passes]
    from conftest import torch_threads

    with torch_threads(threads):
        assert_stack_gives_layer_by_layer_bits(
            monkeypatch, head, passes, lambda p, caches: head(p[4], p[5], p[2], caches, AttnMeta(p[0], 1, no_write=p[3])))


@native
def test_a_drafters_long_catch_up_runs_natively_in_pieces_and_attends_as_sdpa_does(monkeypatch):
    """The drafter's rows past the attention kernel's span (a catch-up on a prompt prefilled without drafts: 150
    rows whose positions the drafter batch knows only on the device, two of them rejected, two mask rows after)
    are cut into pieces the kernel takes whole, through the one native call; every row attends exactly its keys
    up to its own position, as SDPA's path over the whole span does (the cut off: the path before): outputs and
    KV within float32 rounding of it, where a key past a row's position, or one missed, moves them."""
    from conftest import native_from_hf, tiny_hf

    from peagle.models.attention import AttnMeta, Span
    from peagle.models.drafter import Drafter
    from peagle.models.layers import set_precision
    from peagle.models.loader import init_drafter

    target = native_from_hf(tiny_hf("llama"))
    head = Drafter(init_drafter(target, 1, 3).cfg)
    head.init_weights(1, std=0.2)
    set_precision(head, torch.bfloat16, torch.float32)   # (as served: weights the native stack takes)
    head.eval()
    gen = torch.Generator().manual_seed(0)
    n = 150
    positions = torch.cat([torch.arange(n - 2), torch.tensor([n - 3, n - 2])])   # (masks reuse the rejected rows' places)
    rejected = torch.zeros(n, dtype=torch.bool)
    rejected[n - 4:n - 2] = True
    ids, hidden = torch.randint(0, head.cfg.vocab_size, (n,), generator=gen), torch.randn(n, head.cfg.hidden_size, generator=gen)
    stack, calls = Drafter.native_stack, []
    monkeypatch.setattr(Drafter, "native_stack", lambda *a: calls.append(1) or stack(*a))

    def run():
        caches = head.make_caches(256)
        with torch.inference_mode():
            normed, _ = head(ids, hidden, positions, caches, AttnMeta([Span(n, n - 2, list(range(256)))], 1, no_write=rejected))
        return normed, caches

    cut, cut_caches = run()
    assert calls == [1]
    monkeypatch.setattr(AttnMeta, "cut", lambda self, rows: self)
    whole, whole_caches = run()
    assert calls == [1]   # SDPA's path: the layers one by one
    torch.testing.assert_close(cut, whole, rtol=1e-4, atol=1e-4)
    for a, b in zip(cut_caches, whole_caches):
        torch.testing.assert_close(a.k, b.k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.v, b.v, rtol=1e-4, atol=1e-4)


@native
def test_an_error_in_a_teams_chunk_reaches_the_caller_and_the_next_pass_runs(monkeypatch):
    """With two threads ``decoder_layers`` runs its layers in one team (team.h): a row whose KV slot lies past
    the pool, in the other thread's chunk of the rows, raises the operator's error in the caller (not a
    crash, not a hang; rope_write checks every slot before it splits the rows, so nothing is written), and the
    team is free after: the next pass gives the one-thread bits."""
    from conftest import native_from_hf, tiny_hf, torch_threads

    from peagle.models.attention import AttnMeta, Span
    from peagle.models.llama import LlamaModel

    target = native_from_hf(tiny_hf("llama"))
    ids = torch.randint(0, target.cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    calls, stack = [], LlamaModel.native_stack
    monkeypatch.setattr(LlamaModel, "native_stack", lambda *args: calls.append(1) or stack(*args))

    def run(slots: int):
        with torch.inference_mode():
            return target(ids, torch.arange(40), target.make_caches(slots), AttnMeta([Span(40, 40, list(range(64)), 0)], 1))

    want = run(64)
    with torch_threads(2):
        with pytest.raises(RuntimeError, match="is no slot of the pools"):
            run(32)   # rows 0-19 one thread's, 20-39 the other's: slots 32-39 past the pool
        got = run(64)
    assert len(calls) == 3
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@native
def test_the_kernels_publish_the_limits_the_python_side_reads():
    """``peagle::limits`` (kernels.h) is what :func:`kernels.limits` returns, and its fallback where the
    kernels are not loaded holds the same values; :func:`kernels.native` refuses heads past them."""
    lim, q = kernels.limits(), torch.zeros(2, 4, 8)   # (loads the kernels)
    assert torch.ops.peagle.limits() == dataclasses.asdict(kernels.Limits()) == dataclasses.asdict(lim)
    assert lim.tree_nodes == lim.span_rows - 1
    with torch.inference_mode():
        assert kernels.native(q, lim.head_dim, lim.group) and kernels.native(torch.device("cpu"))
        assert not kernels.native(q, lim.head_dim + 1, 1) and not kernels.native(q, 64, lim.group + 1)
        assert not kernels.native(q.double()) and not kernels.native(torch.device("meta"))
