"""peagle's own tokenizer (peagle.models.tokenizer) against transformers' on every folder it serves: the default
model's, the tiny chat model's, a hub-style folder (its template exercising transformers' jinja environment) and a
Unigram one (a BOS post-processor, the decode clean-up); the folders it must leave to transformers; and a start of the
default model that imports neither transformers nor torch.distributed.tensor."""
from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys

import pytest
from jinja2 import TemplateError

from peagle.models import tokenizer as own
from peagle.models.llama import SUPPORTED_ARCHITECTURES
from peagle.models.loader import (ModelNotFoundError, choose_mask_token, gemma_gguf, generic_tokenizer, load_tokenizer,
                                  resolve_target)

TEXTS = ["Hello, world!", "  leading and   inner   spaces\t\ttabs\n\n\nnewlines  ", " ", "",
         "unicode: café naïve Ωμέγα 中文 日本語 한국어 \u00a0nbsp \u200bzero-width",
         "emoji 🤖👍🏽👨‍👩‍👧 flags 🇫🇷 \U00040000",
         "special tokens in text: <|im_start|>user\nhi<|im_end|><|endoftext|><s></s>",
         "almost special: <|im_start |> <repo_name <s >",
         "code:\ndef f(x):\n\treturn {'a': x ** 2}  # comment\n\n    indented()\r\n",
         "numbers 123 4567 3.14159 1e-9", "the cat 's hat is n't here . really ? yes ! ' quoted ' , fine"]
CHATS = [[{"role": "user", "content": "hi"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is <b>2 & 3</b>?"},
          {"role": "assistant", "content": "  5, in emoji 🤖  "}, {"role": "user", "content": "Thanks\n\nbye"}],
         [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": None}]]

# A template in the style of Llama 3's and Qwen's: indented block tags (trim_blocks, lstrip_blocks), a namespace,
# break/continue, the generation tag, raise_exception, tojson (indent, HTML characters, non-ASCII), dict, strftime_now
TEMPLATE = """{%- set ns = namespace(system=false) -%}
{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'tool' %}
        {{ raise_exception('this template has no tool role') }}
    {% endif %}
    {% if loop.index > 6 %}{% break %}{% endif %}
    {% if message['role'] == 'system' %}
        {% set ns.system = true %}
    {% endif %}
    {% if message['content'] == 'skip me' %}{% continue %}{% endif %}
<|im_start|>{{ message['role'] }}{% if message.tool_calls is defined %} (calls){% endif %}
    {% if message['role'] == 'assistant' %}
        {% generation %}{{ message['content'] | trim }}{% endgeneration %}
    {% else %}
{{ message['content'] }}
    {% endif %}
<|im_end|>
{% endfor %}
{% if tools %}
{{ tools | tojson(indent=2) }}
{% endif %}
{{ {'system': ns.system, 'meta': 'é <&> \\'q\\'', 'n': [1, 2.5, none]} | tojson }} {{ dict(a=1) | tojson }}
{{ strftime_now('%Y') }} {{ eos_token }}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def default_folder():
    return resolve_target(None, weights=False)


def hub_style(path, template: str = TEMPLATE):
    """The default model's tokenizer.json in a folder as the hub writes them: added_tokens_decoder, the template in the
    config, extra special tokens, clean-up on (a BPE model: transformers skips it), a Qwen 3 config."""
    src = default_folder()
    shutil.copy(src / "tokenizer.json", path / "tokenizer.json")
    added = json.loads((src / "tokenizer.json").read_text())["added_tokens"]
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "pad_token": None, "clean_up_tokenization_spaces": True,
        "extra_special_tokens": ["<repo_name>", "<file_sep>"], "chat_template": template, "model_max_length": 8192,
        "model_input_names": ["input_ids", "attention_mask"], "add_bos_token": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}}))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return path


def unigram(path):
    """A small Unigram (Metaspace) tokenizer whose post-processor adds BOS, clean-up on (applied: not BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    pieces = ["\u2581", *"abcdefghijklmnopqrstuvwxyz.,?!'", "\u2581the", "\u2581cat", "\u2581.", "\u2581,", "\u2581?",
              "\u2581!", "\u2581'", "'s", "\u2581's", "n't", "\u2581n't", "\u2581hat", "\u2581is", "\u2581here"]
    tok = Tokenizer(models.Unigram([(p, 0.0) for p in specials] + [(p, -1.0 - len(pieces) + i) for i, p in
                                                                   enumerate(pieces)], unk_id=0))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TokenizersBackend", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>", "clean_up_tokenization_spaces": True}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.fixture(scope="module", params=["default", "tiny_chat", "hub_style", "unigram"])
def pair(request, tmp_path_factory):
    """(peagle's tokenizer, transformers' AutoTokenizer) of one folder."""
    from transformers import AutoTokenizer

    path = {"default": default_folder, "tiny_chat": lambda: request.getfixturevalue("tiny_chat_dir"),
            "hub_style": lambda: hub_style(tmp_path_factory.mktemp("hub")),
            "unigram": lambda: unigram(tmp_path_factory.mktemp("unigram"))}[request.param]()
    tok = load_tokenizer(path)
    assert isinstance(tok, own.Tokenizer), f"{request.param}: not served by peagle's tokenizer"
    return tok, AutoTokenizer.from_pretrained(str(path))


def test_same_backend_and_class_as_transformers(pair):
    """transformers' generic class is what AutoTokenizer gives, and its Rust tokenizer (added tokens, their flags,
    post-processor, decoder: what DecodeStream and encoding read) is the one read from the file here."""
    from transformers import TokenizersBackend

    tok, ref = pair
    assert type(ref) is TokenizersBackend
    assert tok.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()


def test_encode_as_transformers(pair):
    tok, ref = pair
    for text in TEXTS:
        for special in (True, False):
            assert tok(text, add_special_tokens=special)["input_ids"] == ref(text, add_special_tokens=special)["input_ids"]
            assert tok.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special)
    assert tok("abc")["input_ids"] == ref("abc")["input_ids"]  # the default: with special tokens


def test_decode_as_transformers(pair):
    tok, ref = pair
    seqs = [ref(t)["input_ids"] for t in TEXTS] + [list(range(0, len(ref), max(1, len(ref) // 700))),
                                                   sorted(ref.added_tokens_decoder)]
    for ids in seqs:
        for skip in (True, False):
            for clean in (None, False, True):
                assert tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean) == ref.decode(
                    ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean), (ids, skip, clean)
    assert tok.decode(ids[0]) == ref.decode(ids[0])


def test_chat_template_as_transformers(pair):
    tok, ref = pair
    assert tok.chat_template == ref.chat_template
    if ref.chat_template is None:
        with pytest.raises(ValueError):
            tok.apply_chat_template(CHATS[0], tokenize=False)
        return
    for chat in CHATS:
        for gen in (True, False):
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert text == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(chat, add_generation_prompt=gen)["input_ids"] == ref.apply_chat_template(
                chat, add_generation_prompt=gen)["input_ids"]
    tools = [{"type": "function", "function": {"name": "f", "description": "é <tag> & 'q'", "parameters": {}}}]
    assert (tok.apply_chat_template(CHATS[1], tools=tools, tokenize=False, extra="x")
            == ref.apply_chat_template(CHATS[1], tools=tools, tokenize=False, extra="x"))


def test_template_errors_as_transformers(tmp_path):
    """raise_exception raises jinja's TemplateError (the server answers 400 with it), as transformers' does."""
    from transformers import AutoTokenizer

    path = hub_style(tmp_path)
    tok, ref = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    chat = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]
    for t in (tok, ref):
        with pytest.raises(TemplateError, match="no tool role"):
            t.apply_chat_template(chat, tokenize=False)
    with pytest.raises(TypeError, match="continue_final_message"):
        tok.apply_chat_template(chat, tokenize=False, continue_final_message=True)


@pytest.mark.parametrize("template", [
    "{{ namespace(_x=1).x }}", "{% set ns = namespace() %}{% set ns._y = 1 %}{{ ns }}", "{{ [].append(1) }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ dict.__class__ }}", "{{ dict.fromkeys([1]) | tojson }}"])
def test_the_sandbox_as_transformers(template, tmp_path):
    """Templates come from model files: both sandboxes refuse the same escapes (and allow what they allow)."""
    from transformers import AutoTokenizer

    path = hub_style(tmp_path, template)
    tok, ref = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    got, want = (outcome(lambda: t.apply_chat_template(CHATS[0], tokenize=False)) for t in (tok, ref))
    assert got[0] == want[0] if isinstance(want, tuple) else got == want


def test_attributes_as_transformers(pair):
    tok, ref = pair
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                 "bos_token_id", "eos_token_id", "unk_token_id", "sep_token_id", "pad_token_id", "cls_token_id",
                 "mask_token_id", "all_special_tokens", "all_special_ids", "special_tokens_map",
                 "extra_special_tokens", "added_tokens_decoder"):
        assert getattr(tok, name) == getattr(ref, name), name
    assert tok.get_vocab() == ref.get_vocab() and len(tok) == len(ref) and tok.vocab_size == ref.vocab_size
    assert tok.convert_tokens_to_ids(["a", "no such token \u2603"]) == ref.convert_tokens_to_ids(["a", "no such token \u2603"])
    assert outcome(choose_mask_token, tok) == outcome(choose_mask_token, ref)


def outcome(f, *args):
    """``f(*args)``, or the type and text of what it raised."""
    try:
        return f(*args)
    except Exception as e:  # noqa: BLE001  (compared, whatever it is)
        return type(e), str(e)


def test_pickled_and_copied(pair):
    """The server sends the tokenizer to its API process (pickled); structured outputs copy it."""
    import copy

    tok, _ = pair
    for other in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok)):
        assert other(TEXTS[4])["input_ids"] == tok(TEXTS[4])["input_ids"] and other.eos_token_id == tok.eos_token_id
        if tok.chat_template:
            assert other.apply_chat_template(CHATS[1], tokenize=False) == tok.apply_chat_template(CHATS[1], tokenize=False)


def edit(path, config=None, tokenizer=None, files=(), model=None):
    """``path``'s tokenizer folder changed: config keys set, tokenizer.json changed by ``tokenizer`` (a function of
    its JSON), files added, the model type set."""
    if config:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    if tokenizer:
        t = json.loads((path / "tokenizer.json").read_text())
        tokenizer(t)
        (path / "tokenizer.json").write_text(json.dumps(t))
    for f in files:
        (path / f).write_text("{}")
    if model:
        (path / "config.json").write_text(json.dumps({"model_type": model}))


REFUSED = {
    "another class": dict(config={"tokenizer_class": "Qwen2Tokenizer"}),
    "code of its own": dict(config={"auto_map": {"AutoTokenizer": ["a.B", None]}}),
    "a key not known here": dict(config={"legacy": False}),
    "a model-specific special token": dict(config={"image_token": "<filename>"}),
    "split special tokens": dict(config={"split_special_tokens": True}),
    "a padding side transformers refuses": dict(config={"padding_side": "middle"}),
    "a special token that is no added token": dict(config={"eos_token": "hello"}),
    "a special token that is not special": dict(tokenizer=lambda t: t["added_tokens"][0].update(special=False)),
    "an added token listed otherwise": dict(config={"added_tokens_decoder": {"0": {
        "content": "<|endoftext|>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False,
        "special": True}}}),
    "an added token not as a dict": dict(config={"added_tokens_decoder": {"0": "<|endoftext|>"}}),
    "a special token as an AddedToken": dict(config={"eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}}),
    "truncation": dict(tokenizer=lambda t: t.update(truncation={"direction": "Right", "max_length": 8,
                                                                "strategy": "LongestFirst", "stride": 0})),
    "padding": dict(tokenizer=lambda t: t.update(padding={"strategy": "BatchLongest", "direction": "Right",
                                                          "pad_to_multiple_of": None, "pad_id": 2, "pad_type_id": 0,
                                                          "pad_token": "<|im_end|>"})),
    "no post-processor": dict(tokenizer=lambda t: t.update(post_processor=None)),
    "special_tokens_map.json": dict(files=["special_tokens_map.json"]),
    "added_tokens.json": dict(files=["added_tokens.json"]),
    "a model type whose class transformers overrides": dict(model="qwen2"),
    "a model type outside peagle's": dict(model="bert"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_folders_left_to_transformers(case, tmp_path):
    """What this class would not reproduce is left to transformers (the same folder unedited is served here)."""
    path = tmp_path / "tok"
    shutil.copytree(default_folder(), path, ignore=shutil.ignore_patterns("*.safetensors"))
    assert own.load(path) is not None
    edit(path, **REFUSED[case])
    assert own.load(path) is None


def test_the_model_types_read_without_transformers_are_its_generic_ones():
    """GENERIC_MODEL_TYPES is exactly those of peagle's model types for which AutoTokenizer keeps a tokenizer_config's
    generic class (transformers' tables, which cost ~1 s to import and are read by the loader only for other types)."""
    from transformers.models.auto import tokenization_auto as auto

    kept = {t for t in SUPPORTED_ARCHITECTURES if t not in auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
            and "Mistral" not in (auto.TOKENIZER_MAPPING_NAMES.get(t) or "")}
    assert own.GENERIC_MODEL_TYPES == kept


def test_the_generic_decision_for_other_model_types(tmp_path):
    """Outside GENERIC_MODEL_TYPES, the loader asks transformers' tables (Qwen 2's class is overridden)."""
    path = tmp_path / "tok"
    shutil.copytree(default_folder(), path, ignore=shutil.ignore_patterns("*.safetensors"))
    assert own.generic(path) is True and generic_tokenizer(path)
    edit(path, model="qwen2")
    assert own.generic(path) is None and not generic_tokenizer(path)
    assert type(load_tokenizer(path)).__name__ == "Qwen2Tokenizer"


def test_gemma_3_is_left_to_transformers():
    """Gemma 3 270M's folder (a GemmaTokenizer) is transformers' to build."""
    try:
        gguf = gemma_gguf()
    except ModelNotFoundError as e:
        pytest.skip(f"Gemma 3 270M is not installed: {e}")
    from transformers import AutoTokenizer

    path = resolve_target(gguf, weights=False)
    ref = AutoTokenizer.from_pretrained(str(path))
    tok = load_tokenizer(path)
    assert (own.load(path) is not None) == (type(ref).__name__ == "TokenizersBackend")
    assert tok(TEXTS[4])["input_ids"] == ref(TEXTS[4])["input_ids"]


def test_a_start_of_the_default_model_imports_no_transformers():
    """``peagle generate`` on the default model (its folder made once) imports neither transformers (its tokenizer is
    peagle's) nor torch.distributed.tensor (with sympy: torch imports it at the first dispatch to a tensor subclass,
    which loading the GGUF's weights no longer makes)."""
    default_folder()
    code = ("import sys\nfrom peagle.cli import main\n"
            "main(['generate', '--max-new-tokens', '2', '--method', 'none', 'hi'])\n"
            "print(sorted(m for m in ('transformers', 'torch.distributed.tensor', 'sympy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
