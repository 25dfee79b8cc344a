"""A tokenizer on the ``tokenizers`` library and jinja2 alone, for the folders where transformers would build its
generic ``TokenizersBackend``: the same ids, text and chat prompts as transformers' (tests/test_tokenizer.py), without
importing transformers (0.6 s of a start with torch imported; 1 s with the auto tables that decide its class) or
building its wrapper (0.3 s, against 0.09 s for ``tokenizers.Tokenizer.from_file``). Measured alone; on the loading
thread, beside the weights, the imports took 1.4-3 s.

:func:`load` serves a folder only where its files leave transformers nothing to change in the Rust tokenizer it reads
from ``tokenizer.json``: no truncation or padding baked in, a post-processor, every special token the config names
already an added special token, no legacy ``special_tokens_map.json`` / ``added_tokens.json``, and no
``tokenizer_config.json`` key outside :data:`CONFIG_KEYS`. Anything else (and every other tokenizer class) is
transformers' to build (:func:`peagle.models.loader.load_tokenizer`).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as RustTokenizer

GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# The model types of peagle's targets (models.llama.SUPPORTED_ARCHITECTURES) for which AutoTokenizer keeps the generic
# class a tokenizer_config names: none is in transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS or mapped to a
# Mistral tokenizer (tests/test_tokenizer.py checks it against the installed transformers). Reading those tables
# imports transformers and its auto modules (~1 s with torch already imported, 3 s alone), so only other model types
# are decided by them (loader.generic_tokenizer).
GENERIC_MODEL_TYPES = frozenset({"llama", "mistral", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text"})
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys whose effect on transformers' TokenizersBackend this class reproduces (or that have none
# on what it offers: add_bos_token/add_eos_token are dropped by transformers where a tokenizer.json exists, the rest
# are bookkeeping or apply to batches and padding)
CONFIG_KEYS = frozenset({*NAMED_TOKENS, "tokenizer_class", "backend", "is_local", "local_files_only", "name_or_path",
                         "model_max_length", "model_input_names", "padding_side", "truncation_side",
                         "clean_up_tokenization_spaces", "split_special_tokens", "add_bos_token", "add_eos_token",
                         "add_prefix_space", "errors", "chat_template", "extra_special_tokens",
                         "additional_special_tokens", "added_tokens_decoder"})
# apply_chat_template options of transformers' that change what it does beyond rendering: refused here, never
# passed to the template as variables
UNSUPPORTED_CHAT_OPTIONS = frozenset({"chat_template", "continue_final_message", "return_dict", "return_tensors",
                                      "return_assistant_tokens_mask", "sanitize_control_tokens", "padding",
                                      "truncation", "max_length", "tokenizer_kwargs"})


class Tokenizer:
    """What peagle uses of a transformers tokenizer, over the ``tokenizers`` object of the folder's ``tokenizer.json``
    (:attr:`backend_tokenizer`). Picklable (the server sends it to its API process) and copyable."""

    def __init__(self, backend: RustTokenizer, special: dict[str, str], extra: list[str], chat_template: str | None,
                 clean_up_tokenization_spaces: bool, path: Path):
        self.backend_tokenizer = backend
        self.special_tokens_map = special   # named special tokens (bos_token, ...): the chat template sees them too
        self.extra_special_tokens = extra
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self.name_or_path = str(path)

    def __getattr__(self, name: str):
        # bos_token, eos_token_id, ...: None where the config names no such token, as transformers'
        base = name.removesuffix("_id")
        if base in NAMED_TOKENS:
            token = self.__dict__.get("special_tokens_map", {}).get(base)
            return token if token is None or base == name else self.convert_tokens_to_ids(token)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary without the added tokens (``len`` counts them)."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, *, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | list[int], *, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        text = self.backend_tokenizer.decode([ids] if isinstance(ids, int) else list(ids),
                                             skip_special_tokens=skip_special_tokens)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        # transformers skips the clean-up (meant for WordPiece) on BPE models, where it would delete real spaces
        if clean and type(self.backend_tokenizer.model).__name__ != "BPE":
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        """Ids of tokens (the unknown token's id for a string that is no token, as transformers')."""
        if isinstance(tokens, str):
            i = self.backend_tokenizer.token_to_id(tokens)
            return i if i is not None else self.unk_token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self):
        return self.backend_tokenizer.get_added_tokens_decoder()

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def apply_chat_template(self, conversation: list[dict], tools: list[dict] | None = None,
                            documents: list[dict] | None = None, *, add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs):
        """The conversation (one, a list of message dicts) through the chat template as transformers renders it;
        its token ids (as ``{"input_ids": ...}``, transformers' dict) with ``tokenize``. Further keyword arguments are
        the template's variables."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if unsupported := UNSUPPORTED_CHAT_OPTIONS & kwargs.keys():
            raise TypeError(f"apply_chat_template options not supported here: {', '.join(sorted(unsupported))}")
        if not isinstance(conversation, (list, tuple)) or not all(isinstance(m, dict) for m in conversation):
            raise TypeError("the conversation must be one list of message dicts")
        if not conversation:
            raise ValueError("cannot apply the chat template to an empty conversation")
        if any(not isinstance(x, dict) for x in [*(tools or ()), *(documents or ())]):
            raise TypeError("tools and documents must be dicts (tools as JSON schemas)")
        # keys whose value is None are dropped: templates test for a key, and would print "None"
        messages = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        text = _compile(self.chat_template).render(messages=messages, tools=tools, documents=documents,
                                                   add_generation_prompt=add_generation_prompt,
                                                   **{**self.special_tokens_map, **kwargs})
        return self(text, add_special_tokens=False) if tokenize else text

    def transformers(self):
        """transformers' tokenizer of the same folder (for xgrammar, whose TokenizerInfo reads one)."""
        from transformers import TokenizersBackend
        return TokenizersBackend.from_pretrained(self.name_or_path)


def generic(path: Path) -> bool | None:
    """Whether AutoTokenizer gives ``path`` transformers' generic class: its ``tokenizer_config.json`` names it, with
    no code of its own (auto_map), beside a ``tokenizer.json``. None where that also depends on transformers' tables
    (a model type outside :data:`GENERIC_MODEL_TYPES`, or a config naming a ``model_name``, which AutoTokenizer also
    looks up in them)."""
    path = Path(path)
    try:
        tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if (tok_cfg.get("tokenizer_class") not in GENERIC_CLASSES or "auto_map" in tok_cfg
            or not (path / "tokenizer.json").is_file()):
        return False
    return True if cfg.get("model_type") in GENERIC_MODEL_TYPES and "model_name" not in cfg else None


def load(path: Path) -> Tokenizer | None:
    """``path``'s tokenizer, or None where transformers could build it differently: not :func:`generic` for
    certain, or files whose effect this class does not reproduce (module docstring)."""
    path = Path(path)
    if not generic(path):
        return None
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    if (not cfg.keys() <= CONFIG_KEYS or cfg.get("split_special_tokens", False)
            or not {cfg.get("padding_side", "right"), cfg.get("truncation_side", "right")} <= {"left", "right"}
            or any((path / f).exists() for f in ("special_tokens_map.json", "added_tokens.json",
                                                 "chat_template.json", "additional_chat_templates"))):
        return None
    special = {k: cfg[k] for k in NAMED_TOKENS if cfg.get(k) is not None}
    extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens") or []
    template_file = path / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else cfg.get("chat_template")
    listed = cfg.get("added_tokens_decoder", {})
    if (not all(isinstance(t, str) for t in [*special.values(), *extra]) or not isinstance(extra, list)
            or not isinstance(template, (str, type(None))) or not isinstance(listed, dict)
            or not all(i.isdigit() and isinstance(t, dict) for i, t in listed.items())):
        return None  # transformers' to read (or to refuse)
    listed = {int(i): {k: v for k, v in t.items() if k != "__type"} for i, t in listed.items()}
    backend = RustTokenizer.from_file(str(path / "tokenizer.json"))
    added = backend.get_added_tokens_decoder()
    specials = {t.content for t in added.values() if t.special}
    if (backend.truncation is not None or backend.padding is not None or backend.post_processor is None
            or not {*special.values(), *extra} <= specials
            or any(i not in added or added[i].__getstate__() != t for i, t in listed.items())):
        return None
    clean = cfg.get("clean_up_tokenization_spaces", False)
    return Tokenizer(backend, special, list(extra), template, clean, path)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # not jinja's own tojson, which escapes HTML characters (<, >, &, ') that templates write as they are
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace without attributes whose names begin with an underscore (a way out of the sandbox)."""

    def __init__(*args, **kwargs):  # jinja's signature trick: namespace(self=...) stays a valid attribute
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the namespace attribute {name!r}")


class _Dict:
    """The template's ``dict``: builds dicts, without handing the type itself to the template."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args) -> dict:
        return dict.fromkeys(*args)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``, which marks the assistant's text for transformers' assistant
    masks: its body as it is (no masks here)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    """A chat template in transformers' environment: sandboxed (templates come from model files), trim_blocks and
    lstrip_blocks, break/continue, the generation tag, ``raise_exception``, ``strftime_now`` and a ``tojson`` that
    keeps HTML characters and non-ASCII text."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(), namespace=_Namespace)
    return env.from_string(template)
