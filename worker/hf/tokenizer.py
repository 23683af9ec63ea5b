"""Text <-> token ids for a Hugging Face model directory: `tokenizer.json`, special tokens, chat template.

Encodes exactly as transformers' `AutoTokenizer` does for the same directory: the post-processor in
`tokenizer.json` alone adds the special tokens (none without one). transformers drops `add_bos_token` and
`add_eos_token` from `tokenizer_config.json` whenever a `tokenizer.json` exists, and so do we.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers

from tandem.worker.hf.config import ModelLoadError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where newer transformers versions save the template
REPLACEMENT_CHAR = "\ufffd"  # what a byte-level decoder prints for an incomplete UTF-8 sequence
# The named special tokens transformers hands a chat template (its SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
PREFIX_WINDOW = 6  # tokens of context kept before the unread ones when decoding incrementally


class ChatTemplateError(ValueError):
    """A chat that cannot be rendered: no template, or the template rejected the messages."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: invalid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_content(token: Any) -> str | None:
    """A special token from tokenizer_config.json: a plain string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] if isinstance(value, int) else []


def _chat_template(model_dir: Path, tok_config: dict[str, Any]) -> str | None:
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (model_dir / CHAT_TEMPLATE_FILE).is_file():
        template = (model_dir / CHAT_TEMPLATE_FILE).read_text()
    return template if isinstance(template, str) else None


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(template: str) -> jinja2.Template:
    """Compile a chat template the way transformers does: sandboxed, trim/lstrip blocks, its helpers."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: (
        json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ModelLoadError(f"chat template does not compile: {e}") from None


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special tokens and chat template the model directory declares."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_tokens: Sequence[str] = (),
        extra_eos_ids: Sequence[int] = (),
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token = bos_token
        self.bos_token_id: int | None = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token = eos_tokens[0] if eos_tokens else None
        eos_ids = [backend.token_to_id(t) for t in eos_tokens] + list(extra_eos_ids)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in eos_ids if i is not None))
        self.chat_template = chat_template
        self.special_tokens = dict(
            special_tokens or {}
        )  # named ones (pad_token, unk_token...), for templates
        self._template = compile_chat_template(chat_template) if chat_template else None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """Load `tokenizer.json`, special tokens from `tokenizer_config.json`, EOS ids from the configs."""
        root = Path(model_dir)
        path = root / TOKENIZER_FILE
        if not path.is_file():
            raise ModelLoadError(f"{root}: missing {TOKENIZER_FILE}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception
            raise ModelLoadError(f"{path}: cannot be read by the tokenizers library ({e})") from None
        tok_config = _read_json(root / TOKENIZER_CONFIG_FILE)
        model_config = _read_json(root / "config.json")
        generation_config = _read_json(root / "generation_config.json")
        eos = _token_content(tok_config.get("eos_token"))
        bos = _token_content(tok_config.get("bos_token"))
        if (
            bos is None
            and isinstance(model_config.get("bos_token_id"), int)
            and "bos_token" not in tok_config
        ):
            bos = backend.id_to_token(model_config["bos_token_id"])
        return cls(
            backend,
            bos_token=bos,
            eos_tokens=[eos] if eos else [],
            extra_eos_ids=_as_id_list(model_config.get("eos_token_id"))
            + _as_id_list(generation_config.get("eos_token_id")),
            chat_template=_chat_template(root, tok_config),
            special_tokens={
                name: content
                for name in SPECIAL_TOKEN_NAMES
                if (content := _token_content(tok_config.get(name))) is not None
            },
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, with the special tokens the post-processor adds (as transformers'
        `encode`)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_incremental(
        self, ids: Sequence[int], prefix_offset: int, read_offset: int, skip_special_tokens: bool = True
    ) -> tuple[str, int, int]:
        """New printable text since the last call, and the next (prefix_offset, read_offset).

        `ids` are all ids so far; text of ids[:read_offset] has already been returned. Decoding a
        few tokens of context (from prefix_offset) and diffing keeps spaces that decoders strip at a
        fragment's start; text ending in an incomplete UTF-8 sequence is held back until it completes.
        """
        prefix_text = self.decode(ids[prefix_offset:read_offset], skip_special_tokens)
        new_text = self.decode(ids[prefix_offset:], skip_special_tokens)
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            return new_text[len(prefix_text) :], read_offset, len(ids)
        return "", prefix_offset, read_offset

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        continue_final_message: bool = False,
        documents: Sequence[dict[str, str]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for a chat, rendered by the model's own template (`tools` as transformers hands
        them to it: OpenAI-shaped tool dicts, or None). As transformers: `documents` reach the template,
        `extra` are more variables for it, and `continue_final_message` leaves the last message open, the
        text cut right after its content."""
        if self._template is None:
            raise ChatTemplateError("this model has no chat template (tokenizer_config.json chat_template)")
        variables = {
            **self.special_tokens,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        try:
            text = self._template.render(
                {
                    **(extra or {}),
                    **variables,
                    "messages": list(messages),
                    "tools": None if tools is None else list(tools),
                    "documents": None if documents is None else list(documents),
                    "add_generation_prompt": add_generation_prompt,
                }
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None
        if continue_final_message:
            final = str(messages[-1].get("content") or "").strip() if messages else ""
            at = text.rfind(final) if final else -1
            if at < 0:
                raise ChatTemplateError(
                    "continue_final_message: the final message is not in the rendered chat"
                )
            text = text[: at + len(final)]
        return text

    def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_special_tokens: bool = False,
        **options: Any,
    ) -> list[int]:
        """Token ids of a chat, as transformers' `apply_chat_template(tokenize=True)`: the rendered text
        carries its own special tokens, so none are added (unless `add_special_tokens`, vLLM's option);
        `options` as `apply_chat_template` takes them."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, **options)
        return self.encode(text, add_special_tokens=add_special_tokens)


class StreamDecoder:
    """Turns generated ids, one at a time, into text pieces that never split a character."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.skip_special_tokens = skip_special_tokens
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - PREFIX_WINDOW, 0)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        text, self.prefix_offset, self.read_offset = self.tokenizer.decode_incremental(
            self.ids, self.prefix_offset, self.read_offset, self.skip_special_tokens
        )
        return text

    def flush(self) -> str:
        """Text held back at the end of the stream (an incomplete character prints as U+FFFD)."""
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self.tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens
        )
        new_text = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip_special_tokens)
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
