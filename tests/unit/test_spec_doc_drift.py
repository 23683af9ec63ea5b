"""docs/inferenceservice.md is what the spec types give, with every field and admission rule they declare."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tandem import crdgen, specdoc
from tandem.spec import InferenceServiceSpec, parse_object

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "inferenceservice.md"


def test_checked_in_reference_equals_what_the_types_give():
    assert DOC.read_text() == crdgen.reference(), "regenerate with `python -m tandem.crdgen`"


def test_check_mode_finds_a_stale_reference(tmp_path, capsys):
    out = ["--out", str(tmp_path), "--doc", str(tmp_path / "ref.md")]
    assert crdgen.main(out) == 0
    assert crdgen.main([*out, "--check"]) == 0
    (tmp_path / "ref.md").write_text(
        (tmp_path / "ref.md").read_text().replace("| `servedName` |", "| `name` |")
    )
    assert crdgen.main([*out, "--check"]) == 1
    assert "ref.md is out of date" in capsys.readouterr().err


def field_paths(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """Every field below model as the YAML spells its path, read from the pydantic types (not the CRD)."""
    for name, f in model.model_fields.items():
        path = f"{prefix}.{f.alias or name}"
        yield path
        inner = crdgen.model_of(f)
        if inner is None:
            continue
        shapes = {typing.get_origin(a) for a in (f.annotation, *typing.get_args(f.annotation))}
        yield from field_paths(inner, path + ("[]" if list in shapes else ".<key>" if dict in shapes else ""))


def documented(text: str, expected: set[str]) -> set[str]:
    """The field paths the spec's tables give, each row's path below its section's heading."""
    out: set[str] = set()
    prefixes: list[str] = []
    for line in text[: text.index("## Admission rules")].splitlines():
        if line.startswith("## "):
            heading = line[3:]
            own = heading == "spec" or heading.startswith("spec.")  # else a shared object's table
            prefixes = (
                heading.split(", ") if own else sorted(p for p in expected if p.endswith("." + heading))
            )
        elif m := re.match(r"\| `([^`]+)` \|", line):
            out |= {m[1] if m[1].startswith("metadata.") else f"{p}.{m[1]}" for p in prefixes}
    return out


def test_every_field_of_the_types_has_exactly_one_row_per_place():
    """Kubernetes types passed through (tolerations, affinity, volumes, env) are one row each, without their
    insides; a shared object (podTemplate) has a table of its own that covers every place it appears."""
    expected = set(field_paths(InferenceServiceSpec, "spec"))
    rows = documented(DOC.read_text(), expected)
    assert rows - {"metadata.name"} == expected
    assert "spec.decode.tolerations" in rows and not any(
        ".tolerations[]" in r or ".affinity." in r for r in rows
    )
    assert "spec.router.podTemplate.volumeMounts[].mountPath" in rows


def _descriptions(model: type[BaseModel]) -> Iterator[str]:
    for f in model.model_fields.values():
        if f.description:
            yield " ".join(f.description.split())
        if (inner := crdgen.model_of(f)) is not None:
            yield from _descriptions(inner)


def test_every_field_docstring_is_on_the_page():
    text = DOC.read_text().replace("`", "").replace("\\|", "|")
    missing = [d for d in _descriptions(InferenceServiceSpec) if d.replace("`", "") not in text]
    assert not missing


def _messages(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", ()):
            yield rule["message"]
        for v in node.values():
            yield from _messages(v)
    elif isinstance(node, list):
        for v in node:
            yield from _messages(v)


def test_every_admission_rule_of_the_crds_is_listed_with_its_field():
    text = DOC.read_text()
    for crd in crdgen.CRDS:
        for message in set(_messages(crd.document())):
            assert specdoc.prose(message) in text, message
    rules = text[text.index("## Admission rules") : text.index("## status")]
    assert (
        "| `spec.{prefill,decode}.replicas` | replicas must be between minReplicas and maxReplicas |" in rules
    )
    assert "| `spec.model.source.hostPath` | spec.model.source.hostPath must be an absolute path |" in rules


def test_the_example_is_the_example_file_and_a_valid_spec():
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert block and block[1] == (ROOT / crdgen.EXAMPLE).read_text()
    assert parse_object(yaml.safe_load(block[1])).spec.model.served_name == "tiny"


def test_every_link_resolves():
    text = DOC.read_text()
    anchors = {specdoc.anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith("#"):
            assert target[1:] in anchors, target
        else:
            assert (DOC.parent / target).exists(), target


def test_a_row_says_type_default_and_bounds():
    spec = crdgen.structural(InferenceServiceSpec)["properties"]
    slo = {r.path: r for r in specdoc.rows(spec["slo"])}
    assert slo["percentile"] == specdoc.Row(
        "percentile", "integer", "`90`", "1 to 100", slo["percentile"].description
    )
    gw = {r.path: r for r in specdoc.rows(spec["gateway"])}
    assert (gw["parentRefs"].kind, gw["parentRefs"].default, gw["parentRefs"].bounds) == (
        "[]object",
        "required",
        "1 to 32 items",
    )
    assert gw["endpointPickerRef.failureMode"].bounds == "`FailOpen`, `FailClose`"
    assert specdoc.bounds({"type": "string", "minLength": 1, "pattern": r"^\S+$"}) == "not empty; no spaces"


def test_rules_shared_by_sections_are_said_once():
    assert specdoc.collapse(
        ["spec.prefill.env[]", "spec.decode.env[]", "spec.router.podTemplate", "spec.mode"]
    ) == ["spec.{prefill,decode}.env[]", "spec.router.podTemplate", "spec.mode"]


def test_angle_brackets_and_pipes_survive_markdown():
    assert specdoc.prose("named <name>-router | x") == "named `<name>-router` \\| x"
    assert (
        specdoc.Row("a", "string", "", specdoc.bounds({"pattern": "^(a|b)$"}), "").line()
        == "| `a` | string |  | matches `^(a\\|b)$` |  |"
    )
