"""docs/openai-compatibility.md cannot drift from the code: every request field the router's models declare
is a row there, on the endpoints that declare it, with the outcome the field audit gives it."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from tandem.worker.router import openai_fields
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.openai_vllm import StructuredOutputs

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-compatibility.md"
ROW = re.compile(r"^\| `([a-z_.]+)` \| (both|chat|completions) \| ([^|]+?) \|")
NESTED: dict[str, type[BaseModel]] = {
    "stream_options": oa.StreamOptions,
    "structured_outputs": StructuredOutputs,
}


def documented() -> dict[str, tuple[str, str]]:
    rows = [ROW.match(line) for line in DOC.read_text().splitlines()]
    table = {m[1]: (m[2], m[3]) for m in rows if m}
    assert len(table) == sum(1 for m in rows if m), "a field has two rows"
    return table


def declared() -> dict[str, str]:
    """Every field name (nested ones dotted) and the endpoints whose models declare it."""
    completion, chat = set(oa.CompletionRequest.model_fields), set(oa.ChatCompletionRequest.model_fields)
    out = {
        n: "both" if n in completion and n in chat else "chat" if n in chat else "completions"
        for n in completion | chat
    }
    for parent, model in NESTED.items():
        out |= {f"{parent}.{f.alias or name}": out[parent] for name, f in model.model_fields.items()}
    return out


def test_every_declared_field_has_its_row_with_the_outcome_the_code_gives():
    table, fields = documented(), declared()
    assert set(fields) - set(table) == set(), "fields the docs do not list"
    assert set(table) - set(fields) == set(), "rows for fields the router does not declare"
    code = {n: (endpoints, openai_fields.outcome(n)) for n, endpoints in fields.items()}
    assert {n: table[n] for n in code if table[n] != code[n]} == {
        n: code[n] for n in code if table[n] != code[n]
    }


def test_the_audit_names_only_declared_fields():
    fields = declared()
    named = set(openai_fields.REFUSED_UNLESS) | openai_fields.NO_EFFECT | openai_fields.REFUSED_ELSEWHERE
    assert named - set(fields) == set()
