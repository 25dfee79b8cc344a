"""Loading without copies: a sharded bf16 checkpoint of about 1 GB is read tensor by tensor, each
materialised once in the target dtype, so the process peaks near the weights' size (issue: <= 1.3x
the weights plus the runtime), not at a float32 copy or a second full copy; and what else a loaded engine
would keep resident for nothing (file maps, fused parts, an untouched KV pool, torch._dynamo, Triton, the
tokenizer's Python vocabulary)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=32000, hidden_size=2048,
              intermediate_size=5504, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
              max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=2)

MEASURE = """
import json, resource, sys, torch
from peagle.models.loader import load_target
torch.ones(8) @ torch.ones(8)  # the runtime: torch, its thread pool, peagle's imports
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, _ = load_target(sys.argv[1], "bfloat16", device="cpu")
for p in model.parameters():  # touch every page: weights left memory-mapped count once read (packed: their bytes)
    getattr(p, "blocks", p).max()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(p.numel() * p.element_size() for p in model.parameters())
linear = {str(p.dtype) for k, p in model.named_parameters() if k.endswith("proj.weight")}
rest = {str(p.dtype) for k, p in model.named_parameters() if not k.endswith("proj.weight")}
print(json.dumps({"base_kb": base, "peak_kb": peak, "param_bytes": n, "linear": sorted(linear), "rest": sorted(rest),
                  "rest_numel": sum(p.numel() for k, p in model.named_parameters() if not k.endswith("proj.weight")),
                  "compute": str(model.dtype)}))
"""


def write_checkpoint(path) -> int:
    """A random bf16 Llama of about 0.95 GB in shards of two layers; returns its weight bytes."""
    c = CONFIG
    H, inter, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.empty(shape, dtype=torch.bfloat16).uniform_(-0.02, 0.02, generator=g)

    shards = [{"model.embed_tokens.weight": rand(c["vocab_size"], H), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}]
    for i in range(L):
        if i % 2 == 0:
            shards.append({})
        p = f"model.layers.{i}."
        shards[-1].update({p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                           p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                           **{p + f"self_attn.{n}_proj.weight": rand(H, H) for n in "qkvo"},
                           p + "mlp.gate_proj.weight": rand(inter, H), p + "mlp.up_proj.weight": rand(inter, H),
                           p + "mlp.down_proj.weight": rand(H, inter)})
    index, total = {}, 0
    for s, tensors in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        index.update({k: name for k in tensors})
        total += sum(t.numel() * 2 for t in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    (path / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}))
    return total


def test_bf16_checkpoint_loads_near_its_size(tmp_path):
    weights = write_checkpoint(tmp_path)
    assert weights > 0.9e9
    r = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    # the linear layers keep the file's bf16; embeddings and norms take the compute dtype (float32 on the
    # CPU with peagle's kernels: 16-bit weights, float32 arithmetic; packed for bf16 dot products where the CPU has
    # them, nominally bf16 all the same)
    assert m["linear"] == ["torch.bfloat16"] and m["rest"] == [m["compute"]]
    upcast = m["rest_numel"] * 2 if m["compute"] == "torch.float32" else 0
    assert m["param_bytes"] == weights + upcast
    extra = (m["peak_kb"] - m["base_kb"]) * 1024
    assert extra <= 1.3 * (weights + upcast), f"loading peaked at {extra / weights:.2f}x the weights"


def test_load_checkpoint_takes_the_tensors_over_and_fuses_in_place():
    """``load_checkpoint`` empties the dict it is given, and the model holds the checkpoint's own tensors
    (fused q/k/v and gate/up once, each group's parts dropped as it goes): a dict still holding the parts would
    keep every layer's projections twice until loading ends."""
    from conftest import tiny_hf

    from peagle.models.checkpoint import fuse_checkpoint
    from peagle.models.layers import wants_in_out
    from peagle.models.llama import ModelConfig, build_target

    hf = tiny_hf("llama")
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    down = sd["model.layers.0.mlp.down_proj.weight"]
    with torch.device("meta"):
        model = build_target(ModelConfig.from_hf(hf.config.to_dict()))
    model.load_checkpoint(sd)
    assert sd == {}
    w = model.model.layers[0].mlp.down_proj.weight
    if wants_in_out(down):  # float32 without peagle's kernels: stored [in, out] (set_fast_layout), once
        assert w.stride() == (1, w.shape[0]) and torch.equal(w, down)
    else:
        assert w.data_ptr() == down.data_ptr()  # not copied
    parts = {f"a.self_attn.{n}_proj.weight": torch.full((2, 4), float(i)) for i, n in enumerate("qkv")}
    assert fuse_checkpoint(parts) is parts and list(parts) == ["a.self_attn.qkv_proj.weight"]
    assert parts["a.self_attn.qkv_proj.weight"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]


def test_safetensors_are_read_off_the_files_map(tmp_path):
    """The tensors ``read_safetensors`` gives are the file's values in memory of their own, the file not left
    mapped: a tensor on the file's map keeps every page of it mapped and resident (counted once touched) beside
    the copies that fusing and packing make of the others."""
    from peagle.models.checkpoint import read_safetensors

    tensors = {"a": torch.randn(64, 32).bfloat16(), "b": torch.arange(5), "c": torch.tensor(True), "d": torch.zeros(0, 3)}
    f = tmp_path / "weights.safetensors"
    save_file(tensors, str(f))
    got = read_safetensors(f)
    maps = open("/proc/self/maps").read()
    assert str(f) not in maps
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in tensors.items())


def test_a_kv_pool_is_resident_only_where_written():
    """A CPU KV pool's pages become resident as its blocks are first written (zeros all the same): 256 MiB of
    pool cost a few MiB until used (``torch.zeros`` would make all of it resident at once)."""
    from peagle.models.attention import KVCache

    def rss() -> int:
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))

    before = rss()
    cache = KVCache(128 * 1024 - 1, 4, 64, torch.float32, "cpu")  # 2 x 128 MiB
    assert rss() - before < 16 << 20
    cache.k[:16] = 1.0
    assert rss() - before < 16 << 20
    assert float(cache.k[16:].abs().sum()) == 0 and float(cache.v.abs().sum()) == 0  # reading leaves it unallocated
    assert rss() - before < 16 << 20


def test_the_engine_loads_without_dynamo_or_triton(tmp_path):
    """Importing the engine and the CLI and building a target on the meta device (as the loader does) pull in
    neither torch._dynamo (with sympy: 144 MB resident) nor Triton (75 MB): they are for CUDA and compile."""
    code = ("import sys, torch, peagle.cli, peagle.engine.llm_engine\n"
            "from peagle.models.llama import ModelConfig, build_target\n"
            f"cfg = ModelConfig.from_hf({CONFIG!r})\n"
            "with torch.device('meta'):\n    build_target(cfg)\n"
            "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def tiny_gemma_tokenizer(path) -> None:
    """A Gemma tokenizer (transformers 5 builds it from Python vocabulary and merges) of a few tokens, saved."""
    from transformers import GemmaTokenizer

    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581", "a", "b", "c", "ab", "abc", "\u2581ab"]
    GemmaTokenizer(vocab={p: i for i, p in enumerate(pieces)},
                   merges=[("a", "b"), ("ab", "c"), ("\u2581", "ab")]).save_pretrained(str(path))


@pytest.mark.parametrize("which", ["default", "gemma"])
def test_the_tokenizer_keeps_no_python_copy_of_its_vocabulary(which, tmp_path):
    """``load_tokenizer`` drops the Python vocabulary and merges transformers keeps beside the Rust tokenizer
    it built from them (Gemma's: 262k strings and 515k merges), and the tokenizer is the class ``AutoTokenizer``
    chooses (Gemma's, through AutoTokenizer), or peagle's own where that is transformers' generic class (the default
    model's: tests/test_tokenizer.py), and encodes, decodes and renders the chat template as transformers' own."""
    from transformers import AutoTokenizer

    from peagle.models.loader import generic_tokenizer, load_tokenizer, resolve_target
    from peagle.models.tokenizer import Tokenizer

    path = resolve_target(None, weights=False) if which == "default" else tmp_path
    if which == "gemma":
        tiny_gemma_tokenizer(path)
    tok, ref = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    if which == "gemma" and not hasattr(ref, "_merges"):
        pytest.skip("this transformers keeps no Python copy of a Gemma tokenizer's merges")
    assert not hasattr(tok, "_merges") and not hasattr(tok, "_vocab")
    assert type(tok) is (Tokenizer if which == "default" else type(ref))
    assert generic_tokenizer(path) == (which == "default")
    text = "Loading without copies: abc ab cab, a tokenizer's strings once. \u00bd caf\u00e9 \u2713"
    assert tok(text)["input_ids"] == ref(text)["input_ids"]
    if ref.chat_template:
        msgs = [{"role": "user", "content": text}]
        assert tok.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(msgs, tokenize=False)
    ids = list(range(0, len(ref), max(1, len(ref) // 500)))
    assert tok.decode(ids) == ref.decode(ids) and tok.get_vocab() == ref.get_vocab()


def test_a_loaded_engine_is_frozen_for_the_collector_and_still_freed(tiny_chat_dir):
    """What the loaders load is frozen (``runtime.trim_heap``: never walked by the cyclic collector again, which
    walking it again and again cost ~1 s of a start), and an engine dropped is still freed: freezing keeps only
    reference cycles, and an engine and its models have none."""
    import gc
    import weakref

    from peagle.engine.llm_engine import LLMEngine

    gc.unfreeze()
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32")
    assert gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    target, runner = weakref.ref(engine.target), weakref.ref(engine.runner)
    gc.disable()   # no collection on the way: refcounts alone must free them
    try:
        del engine
        assert target() is None and runner() is None
    finally:
        gc.enable()
    assert gc.get_freeze_count() < frozen   # the frozen engine and models among what was freed


def test_a_target_without_a_head_is_told_so_in_one_line(tiny_chat_dir, tmp_path, monkeypatch, capsys):
    """No shipped head and no --drafter: the random 1-layer head P-EAGLE then drafts with is announced once a
    load (what to do instead included), never silent; a head that ships or is named says nothing."""
    from peagle.models.drafter import save_drafter
    from peagle.models.loader import init_drafter, load_drafter_for, load_target, load_tokenizer

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    target, path = load_target(str(tiny_chat_dir), "float32")
    tok = load_tokenizer(path)
    capsys.readouterr()
    for _ in range(2):  # made, then read from the cache: announced both times
        load_drafter_for(target, path, None, tok)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no head ships for tiny_chat" in err and "--method ngram" in err, err
    save_drafter(init_drafter(target, 1, 1), tmp_path / "head")
    load_drafter_for(target, path, str(tmp_path / "head"), tok)
    assert "random" not in capsys.readouterr().err


def test_the_random_head_has_a_trained_heads_draft_vocabulary(tiny_chat_dir, tmp_path, monkeypatch):
    """The random head that drafts where no head ships reads what a trained one would: `peagle train`'s draft
    vocabulary (DRAFT_VOCAB, the first ids), not the target's whole vocabulary; a target with fewer tokens keeps
    all of them."""
    from peagle.models import loader
    from peagle.models.drafter import DRAFT_VOCAB
    from peagle.train.trainer import TrainConfig

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    assert TrainConfig.draft_vocab == DRAFT_VOCAB
    target, path = loader.load_target(str(tiny_chat_dir), "float32")
    tok = loader.load_tokenizer(path)
    head = loader.load_drafter_for(target, path, None, tok)
    assert target.cfg.vocab_size > DRAFT_VOCAB and head.cfg.draft_vocab_size == DRAFT_VOCAB
    assert head.lm_head.weight.shape[0] == DRAFT_VOCAB
    assert torch.equal(head.draft_vocab_ids(), torch.arange(DRAFT_VOCAB))
    monkeypatch.setattr(loader, "DRAFT_VOCAB", 10 ** 6)
    shutil.rmtree(tmp_path / "cache" / "heads")
    assert loader.load_drafter_for(target, path, None, tok).cfg.draft_vocab_size == target.cfg.vocab_size


def test_the_random_head_cache_is_keyed_by_the_targets_content(tiny_chat_dir, tmp_path, monkeypatch):
    """Two targets in folders of one name (other weights) get random heads of their own; the same target,
    loaded again, finds its cached head. (Keyed by the folder's name, the second target took the first's.)"""
    from peagle.models.loader import load_drafter_for, load_target, load_tokenizer, random_head_dir

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    shutil.copytree(tiny_chat_dir, a)
    shutil.copytree(tiny_chat_dir, b)
    weights = load_file(b / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] + 0.01
    save_file(weights, b / "model.safetensors", metadata={"format": "pt"})
    tok = load_tokenizer(a)
    ta, tb, again = (load_target(str(p), "float32")[0] for p in (a, b, a))
    assert random_head_dir(ta, a) != random_head_dir(tb, b)
    assert random_head_dir(again, a) == random_head_dir(ta, a)
    load_drafter_for(ta, a, None, tok)
    load_drafter_for(tb, b, None, tok)
    assert sorted(p.name for p in (tmp_path / "cache" / "heads").iterdir()) == sorted(
        [random_head_dir(ta, a).name, random_head_dir(tb, b).name])
