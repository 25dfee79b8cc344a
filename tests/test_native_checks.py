"""The native entry points check every index they read against the tensors' shapes: a malformed block table,
position, row, slot or id (a scheduler's bug, a caller's mistake) is a RuntimeError naming the argument, never a
read or write outside a tensor. Each case first runs the well-formed call (so the check cannot be one that
refuses everything), then breaks one argument. Every case runs in this process: a crash would kill pytest.
docs/native-checks.md records this file's run under AddressSanitizer."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import torch

from peagle import kernels

if os.environ.get("PEAGLE_NATIVE") == "0" or not kernels.available():  # before the ops below are looked up
    pytest.skip("the native kernels are off or not built: nothing native to check", allow_module_level=True)
ops = torch.ops.peagle

HID, H, HKV, D, BS, BLOCKS, VOCAB = 8, 2, 1, 4, 4, 3, 20
SLOTS = BLOCKS * BS + 1  # the pools' last slot: the scratch slot rejected drafts write


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def i64(*values):
    return torch.tensor(values, dtype=torch.long)


@dataclass
class Attn:
    """A well-formed attention call: one sequence of 3 rows in blocks [0, 1, 2] of 4 slots."""
    q: torch.Tensor = field(default_factory=lambda: rand(3, H, D))
    k: torch.Tensor = field(default_factory=lambda: rand(SLOTS, HKV, D, seed=1))
    v: torch.Tensor = field(default_factory=lambda: rand(SLOTS, HKV, D, seed=2))
    table: torch.Tensor = field(default_factory=lambda: i64([0, 1, 2]))
    seq: torch.Tensor = field(default_factory=lambda: i64(0, 0, 0))
    pos: torch.Tensor = field(default_factory=lambda: i64(3, 4, 5))
    rows: torch.Tensor = field(default_factory=lambda: i64(0, 1, 2))
    block_size: int = BS
    window: int = 0
    tree_base: torch.Tensor | None = None
    tree_map: torch.Tensor | None = None

    def __call__(self, op=ops.attention):
        extra = (None, 8) if op is ops.attention_ref else (None, "")
        return op(self.q, self.k, self.v, self.table, self.seq, self.pos, self.rows, self.block_size, self.window,
                  D ** -0.5, *extra, self.tree_base, self.tree_map)


ATTENTION_FAULTS = {  # name: (what is broken, the argument the error must name)
    "row past q": (dict(rows=i64(0, 1, 3)), r"rows\[2\] = 3"),
    "negative row": (dict(rows=i64(-1)), r"rows\[0\] = -1"),
    "sequence past the table": (dict(seq=i64(0, 1, 0)), r"seq\[1\] = 1"),
    "position past the table's capacity": (dict(pos=i64(3, 4, 12)), r"pos\[2\] = 12"),
    "negative position": (dict(pos=i64(-1, 4, 5)), r"pos\[0\] = -1"),
    "block id past the pool": (dict(table=i64([0, 7, 2])), r"table\[0, 1\] = 7"),
    "negative block id": (dict(table=i64([-1, 1, 2])), r"table\[0, 0\] = -1"),
    "block_size 0": (dict(block_size=0), "block_size"),
    "negative window": (dict(window=-2), "window"),
    "table of one dimension": (dict(table=i64(0, 1, 2)), "table"),
    "no KV heads": (dict(k=torch.zeros(SLOTS, 0, D), v=torch.zeros(SLOTS, 0, D)), "KV pools"),
    "tree key past the table": (dict(tree_base=i64(3, 3, 3), tree_map=i64([0, 1, 2], [0, 1, 2], [0, 1, 99])),
                                "tree_map"),
    "tree key in an unchecked block": (dict(table=i64([0, 1, 2, 9]), tree_base=i64(3, 3, 3),
                                            tree_map=i64([0, 1, 2], [0, 1, 2], [0, 1, 13])), r"table\[0, 3\] = 9"),
}


@pytest.mark.parametrize("op", ["attention", "attention_ref"])
@pytest.mark.parametrize("fault", list(ATTENTION_FAULTS))
def test_attention_checks_every_index(op, fault):
    fn = getattr(ops, op)
    Attn()(fn)
    Attn(tree_base=i64(3, 3, 3), tree_map=i64([0, 1, 2], [0, 1, 2], [0, 1, 2]))(fn)
    Attn(table=i64([0, 1, 2, 9]))(fn)  # a block past every row's position is not read, so not checked
    broken, names = ATTENTION_FAULTS[fault]
    with pytest.raises(RuntimeError, match=names):
        Attn(**broken)(fn)


def test_rope_write_checks_slots_heads_and_pools():
    def call(qkv=None, heads=H, k=None, v=None, slots=i64(0, 5, 12), d=D):
        qkv = rand(3, H + 2 * HKV, d) if qkv is None else qkv
        k = torch.zeros(SLOTS, HKV, d) if k is None else k
        v = torch.zeros(SLOTS, HKV, d) if v is None else v
        ops.rope_write(qkv, rand(3, d), rand(3, d), heads, k, v, slots)
        return qkv, k

    call()
    with pytest.raises(RuntimeError, match=r"slots\[1\] = 13"):
        qkv = rand(3, H + 2 * HKV, D)
        k = torch.zeros(SLOTS, HKV, D)
        before = qkv.clone()
        call(qkv=qkv, k=k, slots=i64(0, 13, 2))
    assert torch.equal(qkv, before) and not k.any(), "a refused call wrote"
    with pytest.raises(RuntimeError, match=r"slots\[0\] = -1"):
        call(slots=i64(-1, 1, 2))
    with pytest.raises(RuntimeError, match=r"H \(-2\)"):
        call(heads=-2, k=torch.zeros(SLOTS, 3, D), v=torch.zeros(SLOTS, 3, D))
    with pytest.raises(RuntimeError, match="pools"):
        call(v=torch.zeros(4, HKV, D))
    with pytest.raises(RuntimeError, match="head_dim 520"):
        call(d=520)


def test_move_rows_checks_src_and_dst_before_moving():
    pools = [torch.arange(12.0).view(6, 2), torch.arange(8.0).view(4, 2)]
    ops.move_rows(pools, i64(1), i64(2))
    before = [p.clone() for p in pools]
    with pytest.raises(RuntimeError, match=r"src\[0\] = 1 or dst\[0\] = 5"):  # in the first pool, not the second
        ops.move_rows(pools, i64(1), i64(5))
    assert all(torch.equal(p, b) for p, b in zip(pools, before)), "a refused move moved rows"
    with pytest.raises(RuntimeError, match=r"src\[1\] = -3"):
        ops.move_rows(pools, i64(0, -3), i64(1, 2))


def test_row_ops_check_their_widths():
    ops.silu_mul(rand(2, 8))
    with pytest.raises(RuntimeError, match="gate_up"):
        ops.silu_mul(rand(2, 7))
    ops.argmax(rand(2, 3))
    with pytest.raises(RuntimeError, match="empty rows"):
        ops.argmax(torch.zeros(2, 0))


def test_dequantize_rows_checks_ids():
    blocks = torch.zeros(4, 2, 34, dtype=torch.uint8)  # q8_0: 4 rows of 64 weights
    assert ops.dequantize_rows(blocks, i64(0, 3)).shape == (2, 64)
    with pytest.raises(RuntimeError, match="row 4 out of 4"):
        ops.dequantize_rows(blocks, i64(0, 4))
    with pytest.raises(RuntimeError, match="row -1 out of 4"):
        ops.dequantize_rows(blocks, i64(-1))


def test_expand_checks_cu_num_tokens():
    ids, pos = i64(5, 6, 7, 8), i64(0, 1, 2, 3)
    ops.expand(ids, pos, i64(0, 1, 4), i64(1, 2), i64(9, 9), 2, 19)
    for cu in (i64(0, 9, 4), i64(0, 0, 4)):  # a request past the rows; a request of none
        with pytest.raises(RuntimeError, match="cu_num_tokens"):
            ops.expand(ids, pos, cu, i64(1, 2), i64(9, 9), 2, 19)
    with pytest.raises(RuntimeError, match="keeps 3 of 1"):
        ops.expand(ids, pos, i64(0, 1, 4), i64(3, 2), i64(9, 9), 2, 19)


def test_accept_paths_checks_parents_and_lineage():
    y = torch.zeros(1, 3, dtype=torch.long)
    depths, lineage = i64([0, 1, 2]), i64([[0, 0, 0], [0, 1, 1], [0, 1, 2]])
    ops.accept_paths(y, y, i64([0, 0, 1]), depths, lineage)
    with pytest.raises(RuntimeError, match="parent 3"):
        ops.accept_paths(y, y, i64([0, 0, 3]), depths, lineage)
    with pytest.raises(RuntimeError, match="lineage names -1"):
        ops.accept_paths(y, y, i64([0, 0, 1]), depths, i64([[0, 0, 0], [0, 1, 1], [0, -1, 2]]))


def layer_weights(first_width: int = HID) -> list[torch.Tensor | None]:
    """One Llama layer's weights in decoder_layers' order (fused q/k/v and gate/up, whose parts' slots stay None;
    no biases)."""
    qkv, o = rand((H + 2 * HKV) * D, first_width, seed=3) / 4, rand(HID, H * D, seed=4) / 4
    gate_up, down = rand(2 * 16, HID, seed=5) / 4, rand(HID, 16, seed=6) / 4
    return [torch.ones(HID), qkv, None, None, None, o, None, torch.ones(HID), gate_up, None, None, down, None]


def pools():
    return [torch.zeros(SLOTS, HKV, D)], [torch.zeros(SLOTS, HKV, D)]


def test_decoder_layers_checks_weights_and_layout():
    def call(weights=None, table=i64([0, 1, 2]), slots=i64(3, 4, 5), out_rows=None):
        k, v = pools()
        cos, sin = rand(3, D, seed=7), rand(3, D, seed=8)
        return ops.decoder_layers(rand(3, HID), layer_weights() if weights is None else weights, cos, sin, k, v, slots,
                                  table, i64(0, 0, 0), i64(3, 4, 5), i64(0, 1, 2), BS, [0], H, D, D ** -0.5, 1e-6, [],
                                  None, None, None, out_rows)

    call()
    call(out_rows=i64(2))
    broken = layer_weights()
    broken[8] = None
    with pytest.raises(RuntimeError, match=r"weights\[8\]"):
        call(weights=broken)
    with pytest.raises(RuntimeError, match=r"table\[0, 1\] = 5"):
        call(table=i64([0, 5, 2]))
    with pytest.raises(RuntimeError, match=r"slots\[2\] = 99"):
        call(slots=i64(3, 4, 99))
    with pytest.raises(RuntimeError, match=r"rows\[0\] = 3"):
        call(out_rows=i64(3))


def test_target_pass_checks_ids_positions_and_logit_rows():
    embed, lm_head = rand(VOCAB, HID, seed=9), rand(VOCAB, HID, seed=10)
    cos, sin = rand(8, D, seed=7), rand(8, D, seed=8)

    def call(ids=i64(1, 2, 3), pos=i64(3, 4, 5), logit_rows=i64(2), table=i64([0, 1, 2]), emb=embed):
        k, v = pools()
        return ops.target_pass(ids, emb, layer_weights(), cos, sin, k, v, i64(3, 4, 5), table, i64(0, 0, 0), pos,
                               i64(0, 1, 2), BS, [0], H, D, D ** -0.5, 1e-6, [], None, None, logit_rows,
                               torch.ones(HID), lm_head)

    call()
    call(logit_rows=i64(0, 1, 2))
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 20"):
        call(ids=i64(1, 20, 3))
    with pytest.raises(RuntimeError, match=r"ids\[0\] = -1"):
        call(ids=i64(-1, 2, 3))
    with pytest.raises(RuntimeError, match=r"pos\[2\] = 8"):
        call(pos=i64(3, 4, 8))
    for rows, name in ((i64(3), r"logit_rows\[0\] = 3"), (i64(0, 1, 7), r"logit_rows\[2\] = 7")):
        with pytest.raises(RuntimeError, match=name):
            call(logit_rows=rows)
    with pytest.raises(RuntimeError, match=r"table\[0, 0\] = 8"):
        call(table=i64([8, 1, 2]))
    q8 = torch.zeros(VOCAB // 4 * 4, HID * 4 // 32, 34, dtype=torch.uint8)  # a GGUF embedding: dequantize_rows' check
    with pytest.raises(RuntimeError, match="dequantize_rows: row 20"):
        call(ids=i64(1, 20, 3), emb=q8)


def test_draft_checks_its_table_positions_and_tokens():
    """A P-EAGLE drafting pass: 3 verified rows of one request (2 kept), 2 mask rows."""
    embed, lm_head, fc = rand(VOCAB, HID, seed=9), rand(VOCAB, HID, seed=10), rand(HID, 3 * HID, seed=11)

    def call(table=i64([0, 1, 2]), positions=i64(3, 4, 5), taps=None, num_slots=SLOTS - 1, bonus=i64(4),
             mask_id=VOCAB - 1, rope_rows=12):
        k, v = pools()
        cos, sin = rand(rope_rows, D, seed=7), rand(rope_rows, D, seed=8)
        return ops.draft(i64(1, 2, 3), positions, i64(0, 3), i64(2), bonus, rand(3, 3 * HID) if taps is None else taps,
                         2, mask_id, fc, None, rand(HID, seed=12), embed, torch.ones(HID), torch.ones(HID), False,
                         layer_weights(2 * HID), cos, sin, k, v, table, BS, num_slots, H, D, D ** -0.5, 1e-6,
                         torch.ones(HID), lm_head, torch.zeros(VOCAB, dtype=torch.long))

    assert call().shape == (1, 3)
    with pytest.raises(RuntimeError, match=r"table\[0, 1\] = 3"):
        call(table=i64([0, 3, 2]))
    with pytest.raises(RuntimeError, match=r"table\[0, 0\] = -1"):
        call(table=i64([-1, 1, 2]))
    with pytest.raises(RuntimeError, match="position 12 .* RoPE table"):  # a mask row's, inside the table
        call(table=i64([0, 1, 2, 0]), positions=i64(3, 10, 11))
    with pytest.raises(RuntimeError, match="position 13 outside"):
        call(positions=i64(3, 4, 13), rope_rows=20)
    with pytest.raises(RuntimeError, match="taps has 2 rows"):
        call(taps=rand(2, 3 * HID))
    with pytest.raises(RuntimeError, match="num_slots 13"):
        call(num_slots=SLOTS)
    with pytest.raises(RuntimeError, match="token 20"):
        call(bonus=i64(VOCAB))
    with pytest.raises(RuntimeError, match="token 25"):
        call(mask_id=25)
