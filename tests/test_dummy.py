"""``--load-format dummy`` (random weights at a model's real dimensions, vLLM's name and meaning) and the GGUF
files of random weights written for llama.cpp (``peagle dummy-gguf``): presets with the published dimensions,
weights in any dtype or as blocks of any GGUF format, the same engine paths as real weights."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import kernels_on

from peagle.models.dummy import PRESETS, random_blocks, random_state_dict, write_gguf
from peagle.models.llama import ModelConfig, build_target
from peagle.models.loader import ModelNotFoundError, default_gguf, load_target
from peagle.models.checkpoint import split_checkpoint
from peagle.models.quant import FORMATS, QuantTensor, dequantize, formats, gguf_tensors, read_gguf

# Parameters of the published models (their model cards / safetensors headers), so a preset with a wrong
# dimension (a layer count, an FFN width, a vocabulary, tied or untied embeddings) fails.
PARAMETERS = {"llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248,
              "qwen3-8b": 8_190_735_360, "gpt-oss-20b": 20_914_757_184}
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=256,
            intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_have_the_published_dimensions(name):
    with torch.device("meta"):
        model = build_target(ModelConfig.from_hf(PRESETS[name]))
    params = {id(p): p.numel() for p in model.parameters()}
    assert sum(params.values()) == PARAMETERS[name]


@pytest.fixture
def tiny_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path / "config.json"


@pytest.mark.parametrize("fmt", [None, *FORMATS])
def test_random_weights_are_finite_and_near_their_spread(fmt):
    """Norms 1, biases 0, matrices of spread ~0.02 (as blocks of ``fmt``: every scale a finite positive float16),
    reproducible by seed."""
    shapes = {"model.norm.weight": torch.Size([256]), "l.q_proj.bias": torch.Size([256]),
              "l.q_proj.weight": torch.Size([64, 512])}
    sd = random_state_dict(shapes, torch.float32, fmt, seed=3)
    assert torch.equal(sd["model.norm.weight"], torch.ones(256)) and not sd["l.q_proj.bias"].any()
    w = sd["l.q_proj.weight"]
    values = w.dequantize() if fmt else w
    assert isinstance(w, QuantTensor) == (fmt is not None) and values.isfinite().all()
    assert 0.002 < values.std() < 0.2
    again = random_state_dict(shapes, torch.float32, fmt, seed=3)["l.q_proj.weight"]
    assert torch.equal(again.blocks if fmt else again, w.blocks if fmt else w)
    if fmt:
        assert torch.equal(dequantize(random_blocks(64, 512, fmt, torch.Generator().manual_seed(0))).isfinite(),
                           torch.ones(64, 512, dtype=torch.bool))


@pytest.mark.parametrize("quantization", ["none", "q4_0", "q4_k", "q6_k"])
def test_a_dummy_target_loads_and_generates(tiny_config, quantization):
    """From a config.json (its folder has no weights): the model the config describes, its linear weights in
    ``--dtype`` or kept as blocks of the format (packed for the integer path where the kernels run), and the engine
    generates with it."""
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams

    model, path = load_target(tiny_config, "float32", quantization=quantization, load_format="dummy")
    assert json.loads((path / "config.json").read_text()) == TINY  # beside the default model's tokenizer
    assert model.cfg.hidden_size == 256 and model.cfg.num_layers == 4
    assert formats(model) == ([] if quantization == "none" or not kernels_on() else [quantization])
    engine = LLMEngine.from_pretrained(str(tiny_config), method="none", dtype="float32", quantization=quantization,
                                       load_format="dummy", max_model_len=64)
    out = engine.generate([engine.encode_prompt("Hello")], SamplingParams(max_tokens=4))
    assert len(out[0].token_ids) == 4


def test_a_preset_gets_a_folder_with_the_default_tokenizer():
    from peagle.models.loader import dummy_target, load_tokenizer

    folder = dummy_target("llama-3.1-8b")
    assert json.loads((folder / "config.json").read_text()) == PRESETS["llama-3.1-8b"]
    assert load_tokenizer(folder)("Hello")["input_ids"]  # the default model's tokenizer
    assert dummy_target("llama-3.1-8b") == folder


def test_bad_dummy_requests_are_refused(tmp_path, tiny_config):
    with pytest.raises(ModelNotFoundError, match="preset"):
        load_target("no-such-model", load_format="dummy")
    with pytest.raises(ValueError, match="--load-format dummy takes"):
        load_target(tiny_config, quantization="gguf", load_format="dummy")
    with pytest.raises(ValueError, match="--load-format dummy"):  # a block format names random weights only
        load_target(None, quantization="q4_0")
    with pytest.raises(ValueError, match="unknown load format"):
        load_target(tiny_config, load_format="pt")


@pytest.mark.parametrize("ftype,dtype", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_written_gguf_is_the_configs_model_for_peagle(tmp_path, ftype, dtype):
    """``peagle dummy-gguf``'s file: llama.cpp's tensor names and shapes for the config (the default model's
    tokenizer and vocabulary), f16 (or bf16) matrices and f32 norms, which peagle loads as the same model."""
    out = write_gguf(TINY, tmp_path / "tiny.gguf", default_gguf(), ftype)
    arch, tensors = gguf_tensors(out)
    shapes = {name: shape for name, _, shape, _, _ in tensors}
    assert arch == "llama" and len(tensors) == 2 + 9 * 4  # embedding, final norm; 9 a layer; tied: no output
    assert shapes["token_embd.weight"] == [256, 49152] and shapes["blk.3.ffn_down.weight"] == [512, 256]
    assert {t.name for _, t, _, _, _ in tensors} == {ftype.upper(), "F32"}
    import gguf

    meta = gguf.GGUFReader(str(out)).fields
    assert [meta[f"llama.{k}"].contents() for k in ("block_count", "embedding_length", "feed_forward_length",
                                                     "attention.head_count", "attention.head_count_kv")] == [4, 256, 512, 4, 2]
    assert len(meta["tokenizer.ggml.tokens"].data) == 49152
    cfg = ModelConfig.from_hf(TINY)
    with torch.device("meta"):
        names = list(split_checkpoint(build_target(cfg).state_dict(), build_target(cfg)))
    sd = read_gguf(out, names, cfg, False, torch.float32, torch.float32, torch.device("cpu"))
    assert set(sd) == set(names) and sd["model.norm.weight"].eq(1).all()  # every tensor peagle's model has
    w = sd["model.layers.0.mlp.down_proj.weight"]  # the weights' bits, in the file's type: uniform within +-STD * 3**0.5
    assert w.eq(w.to(dtype).float()).all() and 0.03 < w.abs().max() <= 0.035 and w.std() > 0.019
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically
    with pytest.raises(ValueError, match="Llama"):
        write_gguf(PRESETS["qwen3-8b"], tmp_path / "q.gguf", default_gguf())
