"""Structured output for the OpenAI API (torch-free): `response_format` and `tool_choice` as llguidance
grammars for the workers' sampler, and a tool call read back out of the constrained text.

A tool call is the JSON object `{"name": <tool>, "arguments": {...}}` (the shape Llama 3's templates
describe, and the tiny model's template shows the model). With `tool_choice` `required` or a named
function the grammar forces exactly that shape (each tool's `parameters` schema for its arguments); with
`auto` the output is free, and read as a tool call only when it is one (bare, or inside `<tool_call>` tags).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import llguidance

from tandem.worker.router.openai_errors import ApiError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# whitespace-free JSON, so a random model cannot spend its tokens on spaces; the OpenAI client parses either
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


def json_schema_grammar(schema: dict[str, Any], param: str) -> str:
    """llguidance's grammar for a JSON schema; a schema it cannot enforce is a 400 naming `param`."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except ValueError as e:
        raise ApiError(400, f"{param}: not a JSON schema: {e}", param=param) from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ApiError(400, f"{param}: the schema cannot be enforced: {error}", param=param)
    return grammar


def response_format_grammar(response_format: dict[str, Any] | None) -> str | None:
    """The grammar a `response_format` asks for (None: free text)."""
    if response_format is None or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    schema = response_format["json_schema"].get("schema") or {"type": "object"}
    return json_schema_grammar(schema, "response_format.json_schema.schema")


def constraint_grammar(param: str, kind: str, value: Any) -> str:
    """llguidance's grammar for one constraint on the output, named by the field `param` that set it:
    vLLM's json (a schema, or its JSON text), json_object, regex, choice (the output is one of the strings),
    grammar (Lark or GBNF), or a `response_format`."""
    if kind == "response_format":
        grammar = response_format_grammar(value)
        assert grammar is not None
        return grammar
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else value
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ApiError(400, f"{param}: not JSON: {e}", param=param) from None
        return json_schema_grammar(schema, param)
    formats: dict[str, Literal["regex", "choice", "grammar"]] = {
        "regex": "regex",
        "choice": "choice",
        "grammar": "grammar",
    }
    try:
        grammar = llguidance.grammar_from(formats[kind], json.dumps(value) if kind == "choice" else value)
    except ValueError as e:
        raise ApiError(400, f"{param}: {e}", param=param) from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ApiError(400, f"{param}: the {kind} cannot be enforced: {error}", param=param)
    return grammar


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One call of any of `tools`: {"name": <its name>, "arguments": <its parameters>}."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or EMPTY_PARAMETERS,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def forced_tools(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
) -> list[dict] | None:
    """The tools the output must call one of (None: the model may answer in text)."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        return tools
    assert isinstance(tool_choice, dict)
    name = tool_choice["function"]["name"]
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise ApiError(
            400, f"tool_choice names function {name!r}, which is not in tools", param="tool_choice"
        )
    return chosen


def tool_choice_grammar(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
) -> str | None:
    forced = forced_tools(tools, tool_choice)
    return None if forced is None else json_schema_grammar(tool_call_schema(forced), "tools")


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> list[ToolCall] | None:
    """The tool calls `text` makes (a call object, a list of them, or either inside <tool_call> tags),
    or None when it is not (only) tool calls of these tools."""
    body = text.strip()
    open_tag, close_tag = TOOL_CALL_TAGS
    if body.startswith(open_tag):
        parts = [p.split(close_tag)[0].strip() for p in body.split(open_tag)[1:]]
        body = "[" + ",".join(parts) + "]"
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) else [value]
    names = {t["function"]["name"] for t in tools}
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls or None


def may_be_tool_call(text: str) -> bool:
    """`text` (an answer's start) could still become a tool call: held back from a stream until it is not."""
    head = text.lstrip()
    return not head or head[0] in "{[" or TOOL_CALL_TAGS[0].startswith(head[: len(TOOL_CALL_TAGS[0])])
