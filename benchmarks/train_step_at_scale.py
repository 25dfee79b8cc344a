"""One P-EAGLE training step on one long document at a real target's dimensions, with no target weights on disk.

Writes, under OUT: a config-only target folder (Llama-3.1-8B's dimensions by default), one safetensors file with
the only target tensors training reads when its hidden states are precomputed (embedding, final norm, LM head;
random), one random-token document of ``--tokens`` tokens in ``peagle synth``'s format, and its random hidden
states in ``peagle hidden``'s. Then it trains ``--steps`` steps with ``--hidden`` and prints the peak memory
(CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS) and tokens/s of the last step. Usage
(a GPU: the 8B step; ``--small`` checks the script on a CPU in seconds):

    python benchmarks/train_step_at_scale.py /tmp/scale --layers 4 -k 8 --tokens 8192 --device cuda
    python benchmarks/train_step_at_scale.py /tmp/scale-small --small --device cpu
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from peagle.train.data import HIDDEN_SHARD
from peagle.train.synth import SHARD
from peagle.train.target import load_target_ends
from peagle.train.trainer import Trainer, TrainConfig

LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "max_position_embeddings": 131072, "vocab_size": 128256, "tie_word_embeddings": False,
               "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"}
SMALL = {**LLAMA_31_8B, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024, "num_hidden_layers": 4,
         "bos_token_id": 1, "eos_token_id": [2]}


def write_inputs(out: Path, cfg: dict, tokens: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    target = out / "target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16(),
               "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
               "lm_head.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16()}, str(target / "model.safetensors"))
    data = out / "data"
    data.mkdir(exist_ok=True)
    ids = torch.randint(3, V - 16, (tokens,), generator=g).tolist()
    record = {"id": "long-0", "prompt": "", "response": "", "prompt_token_ids": ids[:64], "response_token_ids": ids[64:]}
    (data / SHARD.format(0)).write_text(json.dumps(record) + "\n")
    aux = load_target_ends(str(target), "bfloat16", "cpu").aux_layers
    hidden = out / "hidden"
    hidden.mkdir(exist_ok=True)
    save_file({"taps": torch.randn(tokens, 3 * H, generator=g).bfloat16(),
               "final": torch.randn(tokens, H, generator=g).bfloat16(),
               "argmax": torch.randint(3, V - 16, (tokens,), generator=g, dtype=torch.int32),
               "offsets": torch.tensor([0, tokens])},
              str(hidden / HIDDEN_SHARD.format(0)),
              metadata={"target_hidden_size": str(H), "aux_layers": json.dumps(list(aux)), "target_dtype": "bfloat16",
                        "ids": json.dumps(["long-0"])})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--small", action="store_true", help="tiny dimensions: check the script on a CPU")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--max-elements", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2, help="the first includes FlexAttention's compilation")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--online", action="store_true", help="the target itself (llama-3.1-8b, --load-format dummy, "
                                                          "bf16) computes the states: no --hidden")
    args = ap.parse_args()
    out = Path(args.out)
    cfg = SMALL if args.small else LLAMA_31_8B
    write_inputs(out, cfg, args.tokens)
    where = dict(target="llama-3.1-8b", load_format="dummy") if args.online else dict(
        target=str(out / "target"), hidden=str(out / "hidden"))
    trainer = Trainer(TrainConfig(
        data=str(out / "data"), out=str(out / "head"), **where, target_dtype="bfloat16", layers=args.layers, k=args.k, draft_vocab=min(args.draft_vocab, cfg["vocab_size"]),
        mask_token_id=cfg["vocab_size"] - 1, max_len=args.tokens, micro_tokens=args.tokens, batch_size=1,
        max_elements=args.max_elements, eval_fraction=0.0, progress=False, device=args.device,
        max_steps=args.steps, save_every=10 ** 9, eval_every=10 ** 9))
    cuda = trainer.device.type == "cuda"
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        rec = trainer.train_step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"step": step + 1, "loss": rec["loss"], "wall_s": round(wall, 2),
                          "tokens_per_s": round(args.tokens / wall, 1), "peak_gib": round(peak / 2 ** 30, 2),
                          "device": str(trainer.device), "layers": args.layers, "k": args.k, "online": args.online,
                          "hidden_size": cfg["hidden_size"]}), flush=True)


if __name__ == "__main__":
    main()
