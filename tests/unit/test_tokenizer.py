"""The tokenizer wrapper: round trips, streaming detokenization, special tokens and chat templates."""

from __future__ import annotations

import json
import shutil

import pytest

from tandem.worker.hf.config import ModelLoadError
from tandem.worker.hf.tokenizer import ChatTemplateError, StreamDecoder, Tokenizer

MULTIBYTE = "Grüße aus Köln — 日本語のテキスト 🙂👍🏽 naïve café"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Tell me about the sea."},
]


@pytest.mark.parametrize(
    "text", ["The quick brown fox jumps over the lazy dog.", MULTIBYTE, "  two  spaces\n\tand tabs"]
)
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_common_words_are_single_tokens(tok):
    assert len(tok.encode(" the quick brown fox", add_special_tokens=False)) == 4


def test_bos_is_prepended_only_when_asked(tok):
    assert tok.bos_token_id == tok.backend.token_to_id("<s>")
    with_bos, without = (
        tok.encode("hello", add_special_tokens=True),
        tok.encode("hello", add_special_tokens=False),
    )
    assert with_bos == [tok.bos_token_id, *without]
    assert tok.decode(with_bos) == "hello"
    assert tok.decode(with_bos, skip_special_tokens=False) == "<s>hello"


def test_eos_ids_collect_tokenizer_config_and_generation_config(tok):
    assert tok.eos_token_ids == (tok.backend.token_to_id("</s>"), tok.backend.token_to_id("<|end|>"))


def _stream(tok, ids, prompt=()):
    decoder = StreamDecoder(tok, prompt)
    pieces = [decoder.push(i) for i in ids]
    return pieces, decoder.flush()


@pytest.mark.parametrize("text", [MULTIBYTE, "plain ascii text, streamed one token at a time"])
def test_streamed_pieces_join_to_the_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids) == text
    assert tail == ""
    assert not any("\ufffd" in p for p in pieces)
    assert len(ids) > len(text.encode("utf-8")) // 4  # multi-byte chars really span several tokens here


def test_stream_after_a_prompt_yields_only_new_text(tok):
    prompt = tok.encode("Once upon a time", add_special_tokens=True)
    ids = tok.encode(" there was a café 🙂", add_special_tokens=False)
    pieces, tail = _stream(tok, ids, prompt)
    assert "".join(pieces) + tail == " there was a café 🙂"


def test_stream_holds_back_an_incomplete_character_until_flush(tok):
    ids = tok.encode("ok 🙂", add_special_tokens=False)
    assert len(tok.encode("🙂", add_special_tokens=False)) > 1  # the emoji spans several byte tokens
    pieces, tail = _stream(tok, ids[:-1])
    assert "".join(pieces).rstrip() == "ok"
    assert not any("\ufffd" in p for p in pieces)
    assert tail.endswith("\ufffd")
    assert "".join(pieces) + tail == tok.decode(ids[:-1])


def test_incremental_decode_returns_offsets(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    text, prefix, read = tok.decode_incremental(ids, 0, 0)
    assert (text, prefix, read) == ("hello world", 0, len(ids))
    assert tok.decode_incremental(ids, prefix, read) == ("", prefix, read)


def test_chat_template_renders_roles_and_generation_prompt(tok):
    text = tok.apply_chat_template(CHAT)
    assert text.startswith("<s><|system|>\nBe brief.<|end|>\n<|user|>\nHi there<|end|>\n")
    assert text.endswith("<|user|>\nTell me about the sea.<|end|>\n<|assistant|>\n")
    assert not tok.apply_chat_template(CHAT, add_generation_prompt=False).endswith("<|assistant|>\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == tok.bos_token_id and tok.backend.token_to_id("<|assistant|>") in ids


def test_chat_template_raise_exception_becomes_chat_template_error(tok):
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "beep"}])


def test_missing_tokenizer_json_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_template_from_chat_template_jinja_and_none_at_all(tmp_path, tiny_model_dir):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    shutil.copy(tiny_model_dir / "tokenizer.json", model_dir / "tokenizer.json")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer.from_dir(model_dir).apply_chat_template(CHAT)
    (model_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content | tojson }}\n{% endfor %}"
    )
    assert (
        Tokenizer.from_dir(model_dir).apply_chat_template(CHAT[:2])
        == '[system] "Be brief."\n[user] "Hi there"\n'
    )


def test_added_token_dict_form_of_special_tokens(tmp_path, tiny_model_dir):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["bos_token"] = {"content": "<s>", "special": True}
    config["eos_token"] = {"content": "<|end|>", "special": True}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(model_dir)
    assert tok.bos_token_id == tok.backend.token_to_id("<s>")
    assert tok.eos_token_ids[0] == tok.backend.token_to_id("<|end|>")


def test_transformers_decodes_our_ids(tok, tiny_model_dir):
    import transformers  # a test dependency; imported here because it is slow to import

    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny_model_dir / "tokenizer.json"))
    assert fast.decode(tok.encode(MULTIBYTE, add_special_tokens=False)) == MULTIBYTE


ABSENT = object()
POST_PROCESSORS = {  # what tokenizer.json says about special tokens
    "bos-template": None,  # the tiny model's own: TemplateProcessing "<s> $A" (Llama 2 style)
    "byte-level": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
    "none": "null",  # no post-processor at all
}
TEXTS = ("The quick brown fox.", MULTIBYTE, "<|user|>\nhi<|end|> and </s> inside")


def _variant(tmp_path, tiny_model_dir, post_processor, add_bos, add_eos):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / name, model_dir / name)
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    if post_processor is not None:
        tokenizer["post_processor"] = None if post_processor == "null" else post_processor
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    for key, value in (("add_bos_token", add_bos), ("add_eos_token", add_eos)):
        config.pop(key, None)
        if value is not ABSENT:
            config[key] = value
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


@pytest.mark.parametrize("post_processor", list(POST_PROCESSORS))
@pytest.mark.parametrize(
    "add_bos, add_eos",
    [(True, ABSENT), (False, ABSENT), (ABSENT, ABSENT), (ABSENT, True), (True, True)],
    ids=["bos-true", "bos-false", "bos-absent", "eos-true", "bos-eos-true"],
)
def test_encode_and_chat_match_transformers_auto_tokenizer(
    tmp_path, tiny_model_dir, post_processor, add_bos, add_eos
):
    import transformers

    model_dir = _variant(tmp_path, tiny_model_dir, POST_PROCESSORS[post_processor], add_bos, add_eos)
    ours = Tokenizer.from_dir(model_dir)
    hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), text
    assert ours.apply_chat_template(CHAT) == hf.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    chat_ids = hf.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    assert ours.encode_chat(CHAT) == list(chat_ids)
    assert chat_ids[:2] == [
        ours.bos_token_id,
        ours.backend.token_to_id("<|system|>"),
    ]  # one BOS, from the template


def test_chat_template_sees_the_named_special_tokens_transformers_passes(tmp_path, tiny_model_dir):
    import transformers

    model_dir = _variant(tmp_path, tiny_model_dir, None, True, ABSENT)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(
        unk_token="<|user|>",
        chat_template="{{ pad_token }}|{{ unk_token }}|{{ bos_token }}|{{ sep_token }}|"
        "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
    )
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_dir(model_dir)
    hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    rendered = ours.apply_chat_template(CHAT[:2])
    assert rendered == hf.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("</s>|<|user|>|<s>||")  # pad is EOS in the tiny config; no sep_token


def test_special_tokens_come_from_the_post_processor_alone(tmp_path, tiny_model_dir):
    """The rule the transformers comparison checks, stated, so a change in transformers shows up here as
    well."""

    def added(post_processor, add_bos, add_eos):
        sub = tmp_path / f"{post_processor}-{add_bos}-{add_eos}"
        sub.mkdir()
        t = Tokenizer.from_dir(
            _variant(sub, tiny_model_dir, POST_PROCESSORS[post_processor], add_bos, add_eos)
        )
        full, body = t.encode("hello"), t.encode("hello", add_special_tokens=False)
        assert full[len(full) - len(body) :] == body
        return [t.backend.id_to_token(i) for i in full[: len(full) - len(body)]]

    assert added("bos-template", ABSENT, ABSENT) == ["<s>"]
    assert added("bos-template", False, ABSENT) == ["<s>"]  # the flag does not override tokenizer.json
    assert added("byte-level", True, True) == []  # a file without BOS: no BOS, whatever the flags say
    assert added("none", True, ABSENT) == []
