"""The optional second model, Gemma 3 270M (base) in Q4_K_M (``make gemma``): read as it ships (Q4_K, Q6_K,
Q5_0 and Q8_0 blocks kept), its logits are transformers' on the same file, and greedy text is sensible.
Skipped where the file is absent (it is a 250 MB download)."""
from __future__ import annotations

import pytest
import torch

from conftest import run_full
from peagle.models.loader import ModelNotFoundError, gemma_gguf, load_target, load_tokenizer

try:
    GGUF = gemma_gguf()
except ModelNotFoundError:
    GGUF = None
pytestmark = pytest.mark.skipif(GGUF is None, reason="the Gemma 3 270M file is absent: `make gemma` fetches it")
PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def exact():
    model, path = load_target("gemma3", "float32", device="cpu", compute="exact")
    return model, load_tokenizer(path)


def test_logits_match_transformers_on_the_same_file(exact):
    """float32 arithmetic on the kept blocks against transformers' Gemma3ForCausalLM de-quantizing the file."""
    from transformers import AutoModelForCausalLM

    model, tok = exact
    assert {"q4_k", "q6_k", "q5_0", "q8_0"} <= set(model.precision.lower().replace("/", " ").split())
    ids = torch.tensor(tok(PROMPT)["input_ids"])
    hf = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    logits, _ = run_full(model, ids)
    assert (logits - ref).abs().max().item() < 5e-4  # 2.7e-5 measured (AVX-512)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_greedy_text_is_sensible(exact):
    model, tok = exact
    seq = tok(PROMPT)["input_ids"]
    n = len(seq)
    for _ in range(4):
        logits, _ = run_full(model, torch.tensor(seq))
        seq.append(int(logits[-1].argmax()))
    assert tok.decode(seq[n:]).strip().startswith("Berlin")
