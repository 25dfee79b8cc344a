"""The native Llama-family target against HF transformers: logits, auxiliary hidden states,
paged-cache decoding, flat batches, and loading checkpoints from disk."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import kernels_on, native_from_hf, run_full, tiny_hf
from peagle.models.attention import AttnMeta, Span, prefix_then_causal
from peagle.models.llama import SUPPORTED_ARCHITECTURES, CheckpointError, LlamaModel, ModelConfig, \
    UnsupportedModelError, build_target
from peagle.models.loader import ModelNotFoundError, load_target

ATOL = 1e-4
T = 40


def rand_ids(n: int, vocab: int = 160, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def hf_forward(hf, ids: torch.Tensor):
    with torch.no_grad():
        out = hf(ids[None], output_hidden_states=True)
    return out.logits[0], [h[0] for h in out.hidden_states]


# ----------------------------------------------------------------------------- numerics vs HF

def test_logits_match_hf(family):
    hf = tiny_hf(family)
    model = native_from_hf(hf)
    ids = rand_ids(T)
    ref, _ = hf_forward(hf, ids)
    logits, aux = run_full(model, ids)
    assert logits.shape == (T, hf.config.vocab_size)
    assert aux.shape == (T, 3 * hf.config.hidden_size)
    assert (logits - ref).abs().max().item() <= ATOL


def test_sliding_window_is_exercised():
    """Guard for the mistral case above: with a window of 8 over 40 tokens, a model that ignored the
    window would give different logits (so the HF match really checks the window)."""
    hf = tiny_hf("mistral")
    assert hf.config.sliding_window == 8
    ids = rand_ids(T)
    ref, _ = hf_forward(hf, ids)
    hf.config.sliding_window = None  # each attention layer takes its window when built
    logits, _ = run_full(native_from_hf(hf), ids)
    assert (logits - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("fault", ["no window", "wider window", "RoPE bases swapped", "one RoPE base",
                                   "head_dim scale", "no soft-capping"])
def test_gemma3_faults_are_seen(fault):
    """Guard for the gemma3 case above: each detail of Gemma 3 got wrong moves the logits far past ATOL."""
    hf = tiny_hf("gemma3")
    ids = rand_ids(T)
    ref, _ = hf_forward(hf, ids)
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    change = {"no window": dict(sliding_window=None), "wider window": dict(sliding_window=9),
              "RoPE bases swapped": dict(rope_theta=cfg.rope_local_theta, rope_local_theta=cfg.rope_theta),
              "one RoPE base": dict(rope_local_theta=None), "head_dim scale": dict(query_pre_attn_scalar=None),
              "no soft-capping": dict(final_logit_softcapping=None)}[fault]
    model = build_target(dataclasses.replace(cfg, **change))
    model.load_checkpoint({k: v.detach().clone() for k, v in hf.state_dict().items()})
    logits, _ = run_full(model.eval(), ids)
    assert (logits - ref).abs().max().item() > 100 * ATOL


def _split_aux(aux: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(aux.chunk(n, dim=-1))


def test_aux_hidden_states_default_ids(family):
    hf = tiny_hf(family)
    model = native_from_hf(hf)
    L = hf.config.num_hidden_layers
    assert model.aux_layers == (2, L // 2, L - 3)
    ids = rand_ids(T, seed=2)
    _, hs = hf_forward(hf, ids)
    _, aux = run_full(model, ids)
    for tap, i in zip(_split_aux(aux, 3), model.aux_layers):
        assert (tap - hs[i]).abs().max().item() <= ATOL, f"aux layer {i}"


@pytest.mark.parametrize("aux_ids", [(4, 0, 5), (5, 1, 3)])
def test_aux_hidden_states_custom_unsorted_ids(aux_ids):
    """Id i = the residual stream entering layer i (HF hidden_states[i], i < L), in the order given."""
    hf = tiny_hf("llama")
    model = native_from_hf(hf, aux_layers=aux_ids)
    ids = rand_ids(T, seed=3)
    _, hs = hf_forward(hf, ids)
    _, aux = run_full(model, ids)
    H = hf.config.hidden_size
    assert aux.shape == (T, len(aux_ids) * H)
    taps = _split_aux(aux, len(aux_ids))
    for tap, i in zip(taps, aux_ids):
        assert (tap - hs[i]).abs().max().item() <= ATOL, f"aux layer {i}"
    # Id 0 is the raw embedding.
    j = aux_ids.index(0) if 0 in aux_ids else None
    if j is not None:
        assert torch.equal(taps[j], hf.model.embed_tokens.weight[ids].detach())


def test_aux_id_equal_num_layers_is_final_pre_norm_residual():
    """Id L (no layer L exists): we return the residual leaving the last layer, before the final
    norm. HF's hidden_states[L] has the final norm applied, so compare after applying it."""
    hf = tiny_hf("llama")
    L = hf.config.num_hidden_layers
    model = native_from_hf(hf, aux_layers=(L, 0, 1))
    ids = rand_ids(T, seed=4)
    _, hs = hf_forward(hf, ids)
    _, aux = run_full(model, ids)
    tap = _split_aux(aux, 3)[0]
    with torch.no_grad():
        assert (hf.model.norm(tap) - hs[L]).abs().max().item() <= ATOL


@pytest.mark.parametrize("bad", [(-1, 2, 3), (0, 2, 7)])
def test_aux_id_out_of_range_refused(bad):
    hf = tiny_hf("llama")
    with pytest.raises(ValueError, match="out of range"):
        LlamaModel(ModelConfig.from_hf(hf.config.to_dict()), bad)


def test_logits_rows_subset():
    hf = tiny_hf("qwen3")
    model = native_from_hf(hf)
    ids = rand_ids(T, seed=5)
    full, aux = run_full(model, ids)
    rows = torch.tensor([0, 7, 39, 20])
    pos = torch.arange(T)
    with torch.inference_mode():
        sub, aux2 = model(ids, pos, model.make_caches(T), AttnMeta.single(pos, 0, T), logits_rows=rows)
    assert sub.shape == (4, hf.config.vocab_size)
    assert (sub - full[rows]).abs().max().item() <= ATOL
    assert torch.equal(aux2, aux)  # taps always cover every row


def test_tied_head_follows_new_weights():
    """The tied LM head keeps a transposed copy of the embedding: loading new weights must refresh it."""
    hf0, hf1 = tiny_hf("llama-bias-tied", seed=0), tiny_hf("llama-bias-tied", seed=1)
    model = native_from_hf(hf0)
    ids = rand_ids(T, seed=15)
    run_full(model, ids)
    model.load_checkpoint({k: v.detach().clone() for k, v in hf1.state_dict().items()})
    ref, _ = hf_forward(hf1, ids)
    logits, _ = run_full(model, ids)
    assert (logits - ref).abs().max().item() <= ATOL


def test_config_eos_list_and_rope_formats():
    base = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 6, "num_attention_heads": 2}
    c = ModelConfig.from_hf({**base, "eos_token_id": [2, 7], "rope_theta": 5e5})
    assert c.eos_token_ids == [2, 7] and c.rope_theta == 5e5 and c.rope_scaling is None
    assert c.num_kv_heads == 2 and c.head_dim == 4 and c.default_aux_layers() == (2, 3, 3)
    c = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}})
    assert c.rope_theta == 1234.0 and c.rope_scaling is None
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
    c = ModelConfig.from_hf({**base, "rope_scaling": l3, "rope_theta": 99.0})
    assert c.rope_theta == 99.0 and c.rope_scaling == l3
    c = ModelConfig.from_hf({**base, "rope_parameters": {**l3, "rope_theta": 77.0}})
    assert c.rope_theta == 77.0 and c.rope_scaling == l3
    q = ModelConfig.from_hf({**base, "model_type": "qwen2", "sliding_window": 4, "use_sliding_window": False})
    assert q.sliding_window is None and q.qkv_bias



@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_table_rows_are_the_bits_computed_per_call(scaling, dtype):
    """The CPU table's cached rows (grown past its first 256 positions, read in any order) are RoPE's cos
    and sin computed for those positions alone, bit for bit."""
    from peagle.models.layers import Rotary

    r = Rotary(16, 5e5, scaling)
    g = torch.Generator().manual_seed(0)
    for n, top in [(1, 10), (8, 200), (3, 3000), (40, 9000), (1, 5)]:  # 3000 and 9000 grow the table
        pos = torch.randint(0, top, (n,), generator=g)
        f = pos.to(torch.float32)[:, None] * r.inv_freq[None, :]
        emb = torch.cat([f, f], dim=-1)[:, None, :]
        want = [(t * r.attention_scaling if r.attention_scaling != 1.0 else t).to(dtype) for t in (emb.cos(), emb.sin())]
        got = r.table(pos, dtype)
        assert all(a.shape == (n, 1, 16) and a.dtype == dtype and torch.equal(a, b) for a, b in zip(got, want))
    assert len(r._rows[dtype][0]) >= 9000


# ----------------------------------------------------------------------------- paged cache

BLOCK = 4


def slot_layout(n: int, kind: str, seed: int = 0) -> torch.Tensor:
    """slot of each position 0..n-1: 'contiguous' (0..n-1 shifted), 'paged' (blocks of BLOCK slots
    in a shuffled order), 'scattered' (a random permutation of single slots)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "contiguous":
        return torch.arange(n) + 3
    nblocks = -(-n // BLOCK) + 3
    if kind == "paged":
        table = torch.randperm(nblocks, generator=g)
        return (table[:, None] * BLOCK + torch.arange(BLOCK)).flatten()[:n]
    return torch.randperm(nblocks * BLOCK, generator=g)[:n]


def step(model, caches, ids, slots, start, end):
    """Feed positions start..end-1 of one sequence (its context is 0..end-1)."""
    pos = torch.arange(start, end)
    meta = AttnMeta.single(slots, start, end)
    with torch.inference_mode():
        logits, aux = model(ids[start:end], pos, caches, meta)
    return logits, aux


@pytest.mark.parametrize("layout", ["contiguous", "paged", "scattered"])
def test_incremental_decoding_equals_full_pass(family, layout):
    hf = tiny_hf(family)
    model = native_from_hf(hf)
    n = 36
    ids = rand_ids(n, seed=6)
    full, full_aux = run_full(model, ids)
    slots = slot_layout(n, layout)
    caches = model.make_caches(int(slots.max()) + 8)
    # prefill 11, then one token at a time up to 21, then chunks of 5 up to 36
    bounds = [0, 11] + list(range(12, 22)) + list(range(26, n + 1, 5))
    assert bounds[-1] == n
    outs, auxs = [], []
    for a, b in zip(bounds, bounds[1:]):
        lg, ax = step(model, caches, ids, slots, a, b)
        outs.append(lg)
        auxs.append(ax)
    got, got_aux = torch.cat(outs), torch.cat(auxs)
    assert (got - full).abs().max().item() <= ATOL
    assert (got_aux - full_aux).abs().max().item() <= ATOL


@pytest.mark.parametrize("fam", ["llama", "mistral", "gemma3", "qwen3"])
def test_a_long_prompt_has_the_same_bits_whole_chunked_or_decoded(fam):
    """Prompts longer than the attention kernel's span (64 rows) attend through it too, cut into spans of at
    most 64 rows (:meth:`AttnMeta.cut`): a 150-token prompt's logits and taps are the same bits prefilled
    whole, in uneven chunks or one token at a time, and match HF's. (Through SDPA, as before, they were not.)"""
    if not kernels_on():
        pytest.skip("peagle's attention kernel is off: prompts attend through SDPA")
    hf = tiny_hf(fam)
    model = native_from_hf(hf)
    ids = rand_ids(150, seed=8)
    slots = slot_layout(150, "paged")
    runs = []
    for bounds in ([0, 150], [0, 7, 40, 110, 150], list(range(151))):
        caches = model.make_caches(int(slots.max()) + 8)
        outs = [step(model, caches, ids, slots, a, b) for a, b in zip(bounds, bounds[1:])]
        runs.append([torch.cat(t) for t in zip(*outs)])
    for logits, aux in runs[1:]:
        assert torch.equal(logits, runs[0][0]) and torch.equal(aux, runs[0][1])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (runs[0][0] - ref).abs().max().item() <= ATOL
    # beside another long prompt in one pass (each cut over its own blocks): the same bits again
    other = rand_ids(90, seed=9)
    caches = model.make_caches(512)
    meta = AttnMeta([Span(90, 90, list(range(256, 346)), 0), Span(150, 150, slots.tolist(), 0)], 1)
    with torch.inference_mode():
        both, both_aux = model(torch.cat([other, ids]), torch.cat([torch.arange(90), torch.arange(150)]), caches, meta)
    assert torch.equal(both[90:], runs[0][0]) and torch.equal(both_aux[90:], runs[0][1])


def test_decode_with_sliding_window_beyond_window_gather():
    """Mistral, window 8: single-token decoding past the window with scattered slots (the masked
    single-query path) equals the full pass."""
    hf = tiny_hf("mistral")
    model = native_from_hf(hf)
    n = 24
    ids = rand_ids(n, seed=7)
    full, _ = run_full(model, ids)
    slots = slot_layout(n, "scattered", seed=3)
    caches = model.make_caches(int(slots.max()) + 1)
    outs = [step(model, caches, ids, slots, 0, 1)[0]]
    for p in range(1, n):
        outs.append(step(model, caches, ids, slots, p, p + 1)[0])
    assert (torch.cat(outs) - full).abs().max().item() <= ATOL


# ----------------------------------------------------------------------------- flat batches

@pytest.mark.parametrize("fam", ["llama", "mistral", "qwen2"])
def test_two_sequences_in_one_flat_batch(fam):
    hf = tiny_hf(fam)
    model = native_from_hf(hf)
    a, b = rand_ids(29, seed=8), rand_ids(13, seed=9)
    ref_a, aux_a = run_full(model, a)
    ref_b, aux_b = run_full(model, b)
    sa = slot_layout(29, "paged", seed=1)
    sb = slot_layout(13, "paged", seed=2) + 1000  # disjoint blocks
    ids = torch.cat([a, b])
    pos = torch.cat([torch.arange(29), torch.arange(13)])
    meta = AttnMeta([Span(29, 29, sa.tolist(), 0), Span(13, 13, sb.tolist(), 0)], 1)
    caches = model.make_caches(1100)
    with torch.inference_mode():
        logits, aux = model(ids, pos, caches, meta)
    assert (logits[:29] - ref_a).abs().max().item() <= ATOL
    assert (logits[29:] - ref_b).abs().max().item() <= ATOL
    assert (aux[:29] - aux_a).abs().max().item() <= ATOL
    assert (aux[29:] - aux_b).abs().max().item() <= ATOL


def test_mixed_batch_decode_plus_chunk():
    """One sequence decodes one token while another feeds a 4-token chunk, in one flat batch."""
    hf = tiny_hf("llama3")
    model = native_from_hf(hf)
    a, b = rand_ids(20, seed=10), rand_ids(15, seed=11)
    ref_a, _ = run_full(model, a)
    ref_b, _ = run_full(model, b)
    sa = slot_layout(20, "scattered", seed=4)
    sb = slot_layout(15, "paged", seed=5) + 500
    caches = model.make_caches(600)
    step(model, caches, a, sa, 0, 19)
    step(model, caches, b, sb, 0, 11)
    ids = torch.cat([a[19:20], b[11:15]])
    pos = torch.cat([torch.tensor([19]), torch.arange(11, 15)])
    meta = AttnMeta([Span(1, 20, sa.tolist(), 19), Span(4, 15, sb.tolist(), 11)], 1)
    with torch.inference_mode():
        logits, _ = model(ids, pos, caches, meta)
    assert (logits[0] - ref_a[19]).abs().max().item() <= ATOL
    assert (logits[1:] - ref_b[11:15]).abs().max().item() <= ATOL


# ----------------------------------------------------------------------------- configs and loading

def test_unsupported_architecture_lists_supported():
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 100, "n_embd": 64,
           "n_layer": 2, "n_head": 4}
    with pytest.raises(UnsupportedModelError) as ei:
        ModelConfig.from_hf(cfg)
    msg = str(ei.value)
    assert "GPT2LMHeadModel" in msg
    for target in SUPPORTED_ARCHITECTURES.values():
        assert target.architecture in msg


def test_unsupported_architecture_via_load_target(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM"):
        load_target(tmp_path, "float32")


@pytest.mark.parametrize("fam", ["llama", "llama-bias-tied", "qwen3"])
def test_load_target_from_saved_folder(tmp_path, fam):
    hf = tiny_hf(fam)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    model, path = load_target(tmp_path, "float32")
    assert path == tmp_path
    ids = rand_ids(T, seed=12)
    ref, hs = hf_forward(hf, ids)
    logits, aux = run_full(model, ids)
    assert (logits - ref).abs().max().item() <= ATOL
    L = hf.config.num_hidden_layers
    assert (aux[:, :hf.config.hidden_size] - hs[2]).abs().max().item() <= ATOL
    assert model.aux_layers == (2, L // 2, L - 3)


def test_load_target_sharded(tmp_path):
    hf = tiny_hf("qwen2")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    model, _ = load_target(tmp_path, "float32")
    ids = rand_ids(T, seed=13)
    ref, _ = hf_forward(hf, ids)
    logits, _ = run_full(model, ids)
    assert (logits - ref).abs().max().item() <= ATOL


def test_load_target_aux_layers_argument(tmp_path):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    model, _ = load_target(tmp_path, "float32", aux_layers=(1, 3, 5))
    assert model.aux_layers == (1, 3, 5)


def _corrupt(f, how):
    data = f.read_bytes()
    if how == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif how == "header":
        f.write_bytes(b"\xff" * 16 + data[16:])
    else:  # garbage header length
        f.write_bytes((10 ** 12).to_bytes(8, "little") + data[8:])


@pytest.mark.parametrize("how", ["truncate", "header", "length"])
def test_load_target_corrupt_safetensors(tmp_path, how):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    victim = sorted(tmp_path.glob("*.safetensors"))[1]
    _corrupt(victim, how)
    with pytest.raises(CheckpointError) as ei:
        load_target(tmp_path, "float32")
    assert victim.name in str(ei.value)
    assert ei.value.__cause__ is None or isinstance(ei.value.__cause__, CheckpointError)


def test_load_target_without_config(tmp_path):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    os.remove(tmp_path / "config.json")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_target(tmp_path, "float32")


def test_load_target_without_weights(tmp_path):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_target(tmp_path, "float32")


def test_load_target_bad_config_json(tmp_path):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_target(tmp_path, "float32")


def test_load_target_missing_and_misshaped_tensors(tmp_path):
    from safetensors.torch import load_file, save_file
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.layers.3.mlp.up_proj.weight"]
    sd["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(64, 32)
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as ei:
        load_target(tmp_path, "float32")
    msg = str(ei.value)
    assert "model.layers.1.self_attn.o_proj.weight" in msg
    # gate/up cannot be fused without up: the missing fused name or the orphan gate is reported
    assert "model.layers.3.mlp" in msg


@pytest.mark.parametrize("name,shape", [("model.layers.0.self_attn.k_proj.weight", (32, 65)),
                                        ("model.layers.2.mlp.gate_proj.weight", (128, 63))])
def test_load_target_wrong_input_width_of_fused_part(tmp_path, name, shape):
    """A q/k/v or gate/up part whose input width is wrong cannot be fused: still a CheckpointError."""
    from safetensors.torch import load_file, save_file
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    sd[name] = torch.zeros(shape)
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as ei:
        load_target(tmp_path, "float32")
    assert name.rsplit(".", 2)[0] in str(ei.value)


def test_load_target_no_such_path(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_target(tmp_path / "nope")


# ----------------------------------------------------------------------------- the real default model


def test_hub_id_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="could not download 'nobody/no-such-model'"):
        load_target("nobody/no-such-model")


@pytest.mark.slow
def test_default_model_matches_hf():
    model, path = load_target(None, "float32", compute="exact")  # float32 arithmetic on the GGUF's blocks
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    cfg = hf.config
    assert model.cfg.vocab_size == cfg.vocab_size and model.cfg.num_layers == cfg.num_hidden_layers
    ids = rand_ids(32, vocab=cfg.vocab_size, seed=14)
    ref, hs = hf_forward(hf, ids)
    logits, aux = run_full(model, ids)
    assert (logits - ref).abs().max().item() <= 1e-4
    for tap, i in zip(aux.chunk(3, dim=-1), model.aux_layers):
        rel = (tap - hs[i]).abs().max() / hs[i].abs().max()
        assert rel.item() <= 1e-5, f"aux layer {i}: relative error {rel.item():.2e}"


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_long_chunk_after_a_cached_prefix_equals_full_pass(family, layout):
    """A prompt chunk of more than the kernels' span_rows rows after a cached prefix (chunked prefill) attends
    through SDPA's causal kernel aligned to its last key (or its window's mask): 70 then 80 tokens."""
    hf = tiny_hf(family)
    model = native_from_hf(hf)
    ids = rand_ids(150, seed=21)
    full, full_aux = run_full(model, ids)
    slots = slot_layout(150, layout)
    caches = model.make_caches(int(slots.max()) + 8)
    a, a_aux = step(model, caches, ids, slots, 0, 70)
    b, b_aux = step(model, caches, ids, slots, 70, 150)
    assert (torch.cat([a, b]) - full).abs().max().item() <= ATOL
    assert (torch.cat([a_aux, b_aux]) - full_aux).abs().max().item() <= ATOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,L", [(1, 9), (5, 12), (7, 8), (64, 200)])
def test_chunk_after_a_prefix_equals_the_lower_right_causal_mask(dtype, n, L):
    """The CPU path for a prefill chunk after cached keys (prefix without a mask + causal chunk,
    merged by log-sum-exp) equals SDPA under the materialised lower-right causal mask."""
    g = torch.Generator().manual_seed(n * 1000 + L)
    q, k, v = (torch.randn(2, 3, m, 16, generator=g).to(dtype) for m in (n, L, L))
    mask = torch.ones(n, L, dtype=torch.bool).tril(L - n)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    got = prefix_then_causal(q, k, v)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
