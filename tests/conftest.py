"""Tiny random models of every supported family, and helpers to run them without the engine."""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

import torch

# Triton kernels run in Triton's CPU interpreter unless a GPU is there. It must be set before
# triton is first imported: kernels are bound to the interpreter when they are decorated.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from peagle.cpu import configure_cpu
from peagle.models.attention import AttnMeta
from peagle.models.llama import LlamaModel, ModelConfig, build_target
from peagle.models.loader import resolve_target

# packed-weights caches of the suite's files in a folder of its own, not the user's ~/.cache, removed when this
# process ends (each xdist worker has its own): left behind, every run kept ~100 MB per worker in /tmp.
if "PEAGLE_PACKED_CACHE" not in os.environ:
    os.environ["PEAGLE_PACKED_CACHE"] = tempfile.mkdtemp(prefix="peagle-packed-")
    atexit.register(shutil.rmtree, os.environ["PEAGLE_PACKED_CACHE"], ignore_errors=True)
# Tiny models run as fast on one thread, and the other core stays free (the engine reads this).
os.environ.setdefault("PEAGLE_TORCH_THREADS", "1")
configure_cpu()


def kernels_on() -> bool:
    """Whether peagle's native kernels run the tiny models (built, loaded and not turned off by ``PEAGLE_NATIVE=0``)."""
    from peagle import kernels
    return kernels.available() and os.environ.get("PEAGLE_NATIVE") != "0"


@contextlib.contextmanager
def torch_threads(n: int):
    """The block on ``n`` torch threads: the suite runs one, where the kernels' splits of a pass between
    threads (column ranges, attention tiles) never happen."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=1)

FAMILIES = {
    "llama": lambda: LlamaConfig(**TINY),
    "llama3": lambda: LlamaConfig(**TINY, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 32}),
    "llama-bias-tied": lambda: LlamaConfig(**TINY, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "mistral": lambda: MistralConfig(**TINY, sliding_window=8),
    "qwen2": lambda: Qwen2Config(**TINY),
    "qwen3": lambda: Qwen3Config(**{**TINY, "head_dim": 24}),
    # a window of 8 on 5 of 6 layers; RoPE bases far apart (local 100, global 1e4), so a swap shows
    "gemma3": lambda: Gemma3TextConfig(**{**TINY, "head_dim": 16}, sliding_window=8, query_pre_attn_scalar=24,
                                       final_logit_softcapping=5.0, rope_parameters={
                                           "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                           "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
}


# HF's initialisation (std 0.02) gives tiny models nearly uniform attention, blind to positions: a
# RoPE base of 1e6 instead of 1e4 left 72 of 72 greedy tokens unchanged. Scaled q and k projections
# give attention scores of a few units, so a wrong position, mask or RoPE base changes the output
# (test_engine.test_test_models_see_position_faults).
QK_SCALE = 12.0


def randomize(model, bias_std: float = 0.05) -> None:
    """Norms and biases randomised (a wrong bias or norm placement shows in the logits), q and k
    projections scaled by ``QK_SCALE`` (peaked attention)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(bias_std * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(QK_SCALE)


def tiny_hf(family: str = "llama", seed: int = 0):
    """A HF model with random weights (float32, eval), randomised by :func:`randomize`."""
    torch.manual_seed(seed)
    cfg = FAMILIES[family]()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(model)
    return model


def native_from_hf(hf, aux_layers=None) -> LlamaModel:
    model = build_target(ModelConfig.from_hf(hf.config.to_dict()), aux_layers)
    model.load_checkpoint({k: v.detach().clone() for k, v in hf.state_dict().items()})
    return model.eval()


def run_full(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefill of a single sequence through a fresh cache: (logits [T, V], aux [T, 3H])."""
    n = ids.shape[0]
    pos = torch.arange(n)
    caches = model.make_caches(n)
    with torch.inference_mode():
        return model(ids, pos, caches, AttnMeta.single(pos, 0, n))


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory):
    """A tiny random Llama folder with SmolLM2's tokenizer and chat template (vocab 49152), for the
    code paths that need text: the server, synthesis. Randomised as the other tiny models (:func:`randomize`),
    so its outputs see positions."""
    d = tmp_path_factory.mktemp("tiny_chat")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg)
    randomize(model)
    model.save_pretrained(d)
    for f in resolve_target(None).iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, d / f.name)
    return d


@pytest.fixture(params=list(FAMILIES))
def family(request):
    return request.param
