"""The speculators format both ways: ``peagle export --format speculators`` writes heads that the
``speculators`` package's own config and model classes load, tensor for tensor, and that vLLM's rules for
speculators configs turn into the head vLLM loads; heads written by ``speculators`` load in peagle with
their draft-vocabulary maps."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from test_public_heads import vllm_problems

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.checkpoint import split_checkpoint
from peagle.models.drafter import load_drafter, save_drafter, save_speculators
from peagle.models.loader import init_drafter, load_drafter_for, load_target

K = 5
DRAFT_VOCAB = 100


def speculators_or_skip():
    """The package (the ``speculators`` test extra), or a skip naming why it is not there."""
    try:
        import speculators
        from speculators.models.eagle3 import Eagle3DraftModel  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the speculators package cannot be imported here ({e}); pip install -e '.[speculators]'")
    return speculators


@pytest.fixture(scope="module")
def target(tiny_chat_dir):
    return load_target(str(tiny_chat_dir), "float32")[0]


def trained_like_head(target, seed: int = 1):
    """A 2-layer head with a reduced draft vocabulary (a non-trivial d2t/t2d) and every weight random."""
    head = init_drafter(target, 2, 17, draft_vocab_size=DRAFT_VOCAB, seed=seed, trained_k=K)
    g = torch.Generator().manual_seed(seed)
    head.set_vocab_map(torch.randperm(target.cfg.vocab_size, generator=g)[:DRAFT_VOCAB].sort().values)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return head


def export(tiny_chat_dir, src, out, kind: str) -> None:
    p = subprocess.run([sys.executable, "-m", "peagle.cli", "export", "--target", str(tiny_chat_dir), "--drafter",
                        str(src), "--out", str(out), "--format", "speculators", "--kind", kind, "--dtype", "float32"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_exported_heads_load_in_speculators_and_back(tiny_chat_dir, target, tmp_path, kind):
    spec = speculators_or_skip()
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig

    save_drafter(trained_like_head(target), tmp_path / "vllm")
    export(tiny_chat_dir, tmp_path / "vllm", tmp_path / "spec", kind)
    cfg = spec.SpeculatorModelConfig.from_pretrained(str(tmp_path / "spec"))
    model_cls, cfg_cls = (PEagleDraftModel, PEagleSpeculatorConfig) if kind == "peagle" else \
        (Eagle3DraftModel, Eagle3SpeculatorConfig)
    assert type(cfg) is cfg_cls and cfg.speculators_model_type == kind
    layer = cfg.transformer_layer_config
    assert (type(layer).__name__, layer.num_hidden_layers, layer.vocab_size, layer.hidden_size) == \
        ("LlamaConfig", 2, 49152, 64)
    assert cfg.draft_vocab_size == DRAFT_VOCAB and cfg.target_hidden_size == 64 and not cfg.norm_before_residual
    assert cfg.eagle_aux_hidden_state_layer_ids == list(target.aux_layers)
    assert cfg.speculators_config.proposal_methods[0].speculative_tokens == K
    assert cfg.speculators_config.verifier.name_or_path == str(tiny_chat_dir)
    assert cfg.speculators_config.verifier.architectures == ["LlamaForCausalLM"]
    if kind == "peagle":
        assert cfg.mask_token_id == 17

    # speculators' own model class takes every tensor, by name and shape: only its training-time copies of
    # the verifier's norm and LM head are not in the file (it never saves them either)
    model = model_cls(cfg)
    disk = load_file(str(tmp_path / "spec" / "model.safetensors"))
    missing, unexpected = model.load_state_dict(disk, strict=False)
    assert unexpected == [] and sorted(missing) == ["verifier_lm_head.weight", "verifier_norm.weight"]
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in disk.items())
    assert model.d2t.shape == (DRAFT_VOCAB,) and int(model.t2d.sum()) == DRAFT_VOCAB

    # and back: the same head in peagle (an EAGLE-3 head has no mask_hidden, never read by EAGLE-3 drafting)
    a, b = load_drafter(tmp_path / "vllm").state_dict(), load_drafter(tmp_path / "spec").state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a if not (kind == "eagle3" and k == "mask_hidden"))
    assert load_drafter(tmp_path / "spec").cfg.trained_k == K
    # and the engine drafts with it, the target's output unchanged
    head = load_drafter_for(target, tiny_chat_dir, tmp_path / "spec")
    method = "parallel" if kind == "peagle" else "eagle3"
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ref = LLMEngine(target, None, EngineConfig(method="none")).generate([[1, 5, 9, 30]], params)[0].token_ids
    out = LLMEngine(target, head, EngineConfig(method=method, num_speculative_tokens=K)).generate([[1, 5, 9, 30]], params)
    assert out[0].token_ids == ref and out[0].stats.num_drafts > 0


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_heads_written_by_speculators_load_in_peagle(target, tmp_path, kind):
    speculators_or_skip()
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.models.peagle import PEagleDraftModel

    from speculators import SpeculatorModelConfig

    export_dir = tmp_path / "ours"   # the config: ours, read by speculators (the weights are theirs, below)
    save_speculators(trained_like_head(target, seed=2), export_dir, kind, K, "tiny", ["LlamaForCausalLM"],
                     torch.float32)
    cfg = SpeculatorModelConfig.from_pretrained(str(export_dir))
    model = (PEagleDraftModel if kind == "peagle" else Eagle3DraftModel)(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        ids = torch.randperm(target.cfg.vocab_size, generator=g)[:DRAFT_VOCAB].sort().values
        model.d2t.copy_(ids - torch.arange(DRAFT_VOCAB))
        model.t2d.zero_()
        model.t2d[ids] = True
    model.save_pretrained(str(tmp_path / "theirs"))   # speculators writes config.json and the weights
    written = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert written["speculators_model_type"] == kind
    drafter = load_drafter(tmp_path / "theirs")
    assert drafter.cfg.num_layers == 2 and drafter.cfg.draft_vocab_size == DRAFT_VOCAB and drafter.cfg.trained_k == K
    assert torch.equal(drafter.draft_vocab_ids(), ids)  # their d2t, read as the draft vocabulary's target ids
    assert drafter.to_target_ids(torch.arange(DRAFT_VOCAB)).tolist() == ids.tolist()
    theirs, ours = model.state_dict(), drafter.state_dict()
    for name, t in theirs.items():
        if name.startswith("verifier_") or "rotary" in name:
            continue
        mine = name.replace("layers.0.", "midlayer.", 1) if name.startswith("layers.0.") else name
        if ".q_proj." in mine or ".k_proj." in mine or ".v_proj." in mine or ".gate_proj." in mine or ".up_proj." in mine:
            continue   # fused in peagle: compared through the split checkpoint below
        assert torch.equal(ours[mine].to(t.dtype), t), name
    split = split_checkpoint(ours, drafter)
    for name in ("layers.0.self_attn.q_proj.weight", "layers.1.mlp.up_proj.weight", "layers.0.self_attn.v_proj.weight"):
        mine = name.replace("layers.0.", "midlayer.", 1)
        assert torch.equal(split[mine], theirs[name]), name


# ----------------------------------------------------------------------------- vLLM's rules

# vllm-project/vllm: model_executor/models/registry.py maps each of these to llama_eagle3's Eagle3LlamaForCausalLM
VLLM_REGISTRY = {"Eagle3LlamaForCausalLM": "Eagle3LlamaForCausalLM", "PeagleLlamaForCausalLM": "Eagle3LlamaForCausalLM",
                 "PEagleDraftModel": "Eagle3LlamaForCausalLM"}


def vllm_reads_speculators(cfg: dict) -> tuple[dict, dict]:
    """(the transformers config vLLM builds, its speculative config) from a speculators config.json, by the
    rules of vllm-project/vllm's transformers_utils/configs/speculators/base.py (``SpeculatorsConfig``:
    ``validate_speculators_config``, ``extract_transformers_pre_trained_config``,
    ``build_vllm_speculative_config``) and algos.py (``update_eagle3``, ``update_peagle``)."""
    try:   # validate_speculators_config
        spec = cfg["speculators_config"]
        first = spec["proposal_methods"][0]
        _ = first["speculative_tokens"], spec["verifier"]["name_or_path"], cfg["speculators_model_type"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError("Invalid speculators config structure") from e
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        raise ValueError("Must provide transformer_layer_config")
    kind = cfg["speculators_model_type"]
    if kind not in ("eagle3", "peagle"):
        raise ValueError(f"unsupported speculators_model_type {kind}")
    pre = dict(cfg["transformer_layer_config"])
    pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        pre["target_hidden_size"] = cfg["target_hidden_size"]
    # the default differs: true for eagle3, false for peagle
    pre["norm_before_residual"] = cfg.get("norm_before_residual", kind == "eagle3")
    pre["norm_before_fc"] = cfg.get("norm_before_fc", False)
    if kind == "eagle3":
        pre["architectures"] = ["Eagle3LlamaForCausalLM"]
    else:
        pre["architectures"] = ["PeagleLlamaForCausalLM"]
        pre["pard_token"] = cfg["mask_token_id"]   # required: a KeyError in vLLM without it
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        pre["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    pre.setdefault("num_lookahead_tokens", first["speculative_tokens"])
    pre["architectures"] = [VLLM_REGISTRY[a] for a in pre["architectures"]]
    speculative = {"method": kind, "num_speculative_tokens": first["speculative_tokens"]}
    if kind == "peagle":
        speculative.update({"method": "eagle3", "parallel_drafting": True})
    return pre, speculative


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_vllm_reads_the_exported_heads(tiny_chat_dir, target, tmp_path, kind):
    save_drafter(trained_like_head(target), tmp_path / "vllm")
    export(tiny_chat_dir, tmp_path / "vllm", tmp_path / "spec", kind)
    pre, speculative = vllm_reads_speculators(json.loads((tmp_path / "spec" / "config.json").read_text()))
    assert speculative == ({"method": "eagle3", "num_speculative_tokens": K, "parallel_drafting": True}
                           if kind == "peagle" else {"method": "eagle3", "num_speculative_tokens": K})
    assert pre["norm_before_residual"] is False and pre["draft_vocab_size"] == DRAFT_VOCAB
    if kind == "peagle":
        assert pre["pard_token"] == 17
    # the config vLLM builds, beside the same weights: what vLLM's EAGLE-3 loader would refuse (test_public_heads)
    seen = tmp_path / "as-vllm-sees-it"
    seen.mkdir()
    (seen / "config.json").write_text(json.dumps(pre))
    (seen / "model.safetensors").symlink_to(tmp_path / "spec" / "model.safetensors")
    assert vllm_problems(seen, parallel_drafting=kind == "peagle") == []


def test_scaled_rope_survives_both_ways(tmp_path):
    """Llama 3's RoPE scaling: written as rope_parameters, read by speculators, written by it as a diff against
    transformers' defaults, and read back by peagle the same."""
    speculators_or_skip()
    from speculators import SpeculatorModelConfig
    from speculators.models.peagle import PEagleDraftModel

    from conftest import native_from_hf, tiny_hf

    head = init_drafter(native_from_hf(tiny_hf("llama3")), 1, 150, trained_k=4)
    save_speculators(head, tmp_path / "ours", "peagle", 4, "tiny", [], torch.float32)
    cfg = SpeculatorModelConfig.from_pretrained(str(tmp_path / "ours"))
    assert cfg.transformer_layer_config.rope_parameters == {**head.cfg.rope_scaling, "rope_theta": head.cfg.rope_theta}
    PEagleDraftModel(cfg).save_pretrained(str(tmp_path / "theirs"))
    for d in ("ours", "theirs"):
        back = load_drafter(tmp_path / d).cfg
        assert (back.rope_theta, back.rope_scaling) == (head.cfg.rope_theta, head.cfg.rope_scaling), d
