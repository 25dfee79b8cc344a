"""The drafter-batch expansion: the worked example of docs/design.md ("One round of parallel drafting"), and
torch against the fused Triton kernel (run by Triton's interpreter on CPU) and peagle's CPU kernel on random
ragged batches."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE

from peagle import kernels
from peagle.engine.expansion import DraftBatch, expand, expand_native, expand_torch, expand_triton

M = 999
native = pytest.mark.skipif(not kernels.available(), reason="native kernels not built")


def run(fn, *args) -> DraftBatch:
    """Run an expansion on the test device (the Triton kernel needs CUDA tensors or the interpreter)."""
    args = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*args)
    return DraftBatch(*(getattr(out, f.name).cpu() for f in dataclasses.fields(out)))


@pytest.mark.parametrize("fn", [expand_torch, expand_triton, pytest.param(expand_native, marks=native)])
def test_worked_example(fn):
    if fn is expand_native and torch.device(DEVICE).type != "cpu":
        pytest.skip("peagle's kernels are CPU kernels")
    # K = 3: tokens [10, 11, 12, 13] at positions 5..8, 13 rejected (two accepted), bonus 100
    b = run(fn, torch.tensor([10, 11, 12, 13]), torch.arange(5, 9), torch.tensor([0, 4]), torch.tensor([3]),
           torch.tensor([100]), 2, M)
    assert b.input_ids[~b.is_rejected].tolist() == [11, 12, 100, M, M]
    assert b.positions[~b.is_rejected].tolist() == [5, 6, 7, 8, 9]
    assert b.is_rejected.tolist() == [False, False, False, True, False, False]
    assert b.is_masked.tolist() == [False, False, False, False, True, True]
    assert b.hidden_map.tolist() == [0, 1, 2, 3, -1, -1]
    assert b.sample_idx.tolist() == [[2, 4, 5]]


@pytest.mark.parametrize("num_masks", [0, 1, 6, 9, 17])
@pytest.mark.parametrize("fused", [expand_triton, pytest.param(expand_native, marks=native)])
def test_fused_kernels_equal_torch_on_random_ragged_batches(num_masks, fused):
    if fused is expand_native and torch.device(DEVICE).type != "cpu":
        pytest.skip("peagle's kernels are CPU kernels")
    g = torch.Generator().manual_seed(num_masks)
    for _ in range(5):
        B = int(torch.randint(1, 9, (1,), generator=g))
        n = torch.randint(1, 40, (B,), generator=g)          # prefill-sized and verify-sized requests
        cu = torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)])
        valid = torch.stack([torch.randint(1, int(k) + 1, (1,), generator=g)[0] for k in n])
        ids = torch.randint(0, 500, (int(n.sum()),), generator=g)
        starts = torch.randint(0, 100, (B,), generator=g)
        positions = torch.cat([s + torch.arange(int(k)) for s, k in zip(starts, n)])
        bonus = torch.randint(0, 500, (B,), generator=g)
        a = run(expand_torch, ids, positions, cu, valid, bonus, num_masks, M)
        b = run(fused, ids, positions, cu, valid, bonus, num_masks, M)
        for field in ("input_ids", "positions", "is_rejected", "is_masked", "hidden_map", "sample_idx"):
            assert getattr(a, field).dtype == getattr(b, field).dtype and torch.equal(getattr(a, field), getattr(b, field)), field
        # the drafts are read at the bonus row and then the mask rows of each request
        for i in range(B):
            rows = a.sample_idx[i]
            assert a.input_ids[rows[0]] == bonus[i] and not a.is_rejected[rows].any()
            assert a.is_masked[rows[1:]].all()


@native
def test_the_cpu_takes_peagles_kernel_and_it_refuses_bad_input():
    if torch.device(DEVICE).type != "cpu":
        pytest.skip("peagle's kernels are CPU kernels")
    calls = []
    real = torch.ops.peagle.expand
    try:
        torch.ops.peagle.expand = lambda *a: calls.append(1) or real(*a)
        expand(torch.tensor([10, 11]), torch.arange(2), torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([7]), 1, M)
    finally:
        torch.ops.peagle.expand = real
    assert calls == [1]
    with pytest.raises(RuntimeError, match="keeps 3 of 2 rows"):
        expand_native(torch.tensor([10, 11]), torch.arange(2), torch.tensor([0, 2]), torch.tensor([3]),
                      torch.tensor([7]), 1, M)
