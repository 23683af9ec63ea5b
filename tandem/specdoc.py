"""Write the InferenceService field reference (docs/inferenceservice.md) from the CRDs' structural schemas, so
the page says exactly what the API server checks; `python -m tandem.crdgen` writes it beside the CRDs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tandem.spec_k8s import DNS_SUBDOMAIN

# Kubernetes types a spec passes through: one row each, named as the Kubernetes API reference names them.
KUBERNETES = {
    "affinity": "Affinity",
    "tolerations": "[]Toleration",
    "volumes": "[]Volume",
    "env": "[]EnvVar",
    "valueFrom": "EnvVarSource",
    "metricsFrom": "[]NetworkPolicyPeer",
}
# Objects several sections share: one row where they appear, their fields in a table of their own.
SHARED = ("podTemplate",)
PATTERNS = {
    DNS_SUBDOMAIN: "DNS subdomain",
    "^[a-z]([-a-z0-9]*[a-z0-9])?$": "DNS-1035 label",
    r"^\S+$": "no spaces",
    "^https?://": "an http:// or https:// URL",
    "^/": "an absolute path",
}
STATUS_DETAIL = ("pools", "conditions")  # the status fields whose insides get a table


@dataclass(frozen=True)
class Row:
    path: str
    kind: str
    default: str
    bounds: str
    description: str

    def line(self) -> str:
        cells = (f"`{self.path}`", self.kind, self.default, self.bounds)
        return "| " + " | ".join((*(c.replace("|", "\\|") for c in cells), prose(self.description))) + " |"


def prose(text: str) -> str:
    """Text for a table cell: pipes escaped, and words like <name>-router in code, where Markdown keeps
    them."""
    return re.sub(r"[\w./-]*<\w+>[\w./-]*", lambda m: f"`{m.group()}`", text.replace("|", "\\|"))


HEADER = "| field | type | default | allowed values | description |\n| --- | --- | --- | --- | --- |"


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def kind(name: str, s: dict[str, Any]) -> str:
    if name in KUBERNETES:
        return KUBERNETES[name]
    if s.get("type") == "array":
        return "[]" + kind("", s.get("items", {}))
    if s.get("type") == "object" and isinstance(s.get("additionalProperties"), dict):
        return "map[string]" + kind("", s["additionalProperties"])
    if s.get("format") == "date-time":
        return "timestamp"
    return str(s.get("type", "any"))


def default(s: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in s or "properties" in s:  # an object's default is its fields' defaults
        return ""
    value = s["default"]
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def _range(lo: Any, hi: Any, unit: str = "") -> str:
    if (lo, hi, unit) == (1, None, " characters"):
        return "not empty"
    if lo is not None and hi is not None:
        return f"{lo} to {hi}{unit}"
    return f"at least {lo}{unit}" if lo is not None else f"at most {hi}{unit}"


def bounds(s: dict[str, Any]) -> str:
    """What the schema itself allows: enum, range, length, pattern, item and entry counts."""
    out = []
    if "enum" in s:
        out.append(", ".join(f"`{json.dumps(v) if v == '' else v}`" for v in s["enum"]))
    for lo, hi, unit in (
        ("minimum", "maximum", ""),
        ("minLength", "maxLength", " characters"),
        ("minItems", "maxItems", " items"),
        ("minProperties", "maxProperties", " entries"),
    ):
        if lo in s or hi in s:
            out.append(_range(s.get(lo), s.get(hi), unit))
    if "pattern" in s:
        out.append(PATTERNS.get(s["pattern"], f"matches `{s['pattern']}`"))
    return "; ".join(out)


def row(path: str, name: str, s: dict[str, Any], required: bool, link: str = "") -> Row:
    what = f"[{kind(name, s)}](#{link})" if link else kind(name, s)
    return Row(path, what, default(s, required), bounds(s), s.get("description", ""))


def rows(node: dict[str, Any], path: str = "", links: dict[str, str] | None = None) -> Iterator[Row]:
    """A row per field below node, objects before their fields; a Kubernetes type or a shared object is one
    row, a list's items are `name[]`, a map's values `name.<key>`. `links`: fields whose row points at a
    table of their own instead."""
    links = links or {}
    required = set(node.get("required", ()))
    for name, child in node.get("properties", {}).items():
        at = f"{path}.{name}" if path else name
        if name in links or name in SHARED:
            yield row(at, name, child, name in required, links.get(name, anchor(name)))
            continue
        yield row(at, name, child, name in required)
        if name in KUBERNETES:
            continue
        inner = child.get("items") if child.get("type") == "array" else child.get("additionalProperties")
        suffix = "[]" if child.get("type") == "array" else ".<key>"
        if "properties" in child:
            yield from rows(child, at)
        elif isinstance(inner, dict) and "properties" in inner:
            yield from rows(inner, at + suffix)


def nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below node, with the path a user writes to reach it."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], path + ".<key>")


def admission_rules(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Each CEL rule's message, with the fields it names (its fieldPath, else the object it sits on)."""
    out: dict[str, list[str]] = {}
    for path, node in nodes(spec, "spec"):
        for rule in node.get("x-kubernetes-validations", ()):
            field = path + rule.get("fieldPath", "")
            if field not in out.setdefault(rule["message"], []):
                out[rule["message"]].append(field)
    return out


def collapse(paths: list[str]) -> list[str]:
    """spec.prefill.x and spec.decode.x as spec.{prefill,decode}.x: the pools, and the sections that share an
    object, say a rule once."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        root, section, rest = (p.split(".", 2) + ["", ""])[:3]
        groups.setdefault(f"{root}.{{}}" + (f".{rest}" if rest else ""), []).append(section)
    return [f.format(s[0] if len(s) == 1 else "{" + ",".join(s) + "}") for f, s in groups.items()]


def _sections(spec: dict[str, Any]) -> list[tuple[list[str], dict[str, Any]]]:
    """The spec's object fields, those of one schema (the pools) together."""
    out: list[tuple[list[str], dict[str, Any]]] = []
    for name, s in spec["properties"].items():
        if "properties" not in s:
            continue
        same = [names for names, t in out if _shape(t) == _shape(s)]
        if same:
            same[0].append(name)
        else:
            out.append(([name], s))
    return out


def _shape(s: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in s.items() if k != "description"}, sort_keys=True)


def _heading(names: list[str]) -> str:
    return ", ".join(f"spec.{n}" for n in names)


def _table(rs: Iterator[Row] | list[Row]) -> str:
    return "\n".join([HEADER, *(r.line() for r in rs)])


def _schema(document: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _columns(document: dict[str, Any]) -> str:
    lines = ["| column | shows | description |", "| --- | --- | --- |"]
    for c in document["spec"]["versions"][0]["additionalPrinterColumns"]:
        about = " ".join(
            filter(None, (c.get("description"), "(with `-o wide`)" if c.get("priority") else ""))
        )
        lines.append(f"| {c['name']} | `{c['jsonPath']}` | {about} |")
    return "\n".join(lines)


def render(service: dict[str, Any], pool: dict[str, Any], example_path: str, example: str) -> str:
    """The page, from the InferenceService and TandemPool CRD documents and an example spec's text."""
    group, version = service["spec"]["group"], service["spec"]["versions"][0]["name"]
    short = service["spec"]["names"]["shortNames"][0]
    schema = _schema(service)
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    sections = _sections(spec)
    links = {n: anchor(_heading(names)) for names, _ in sections for n in names}
    shared = {
        name: s
        for _, node in nodes(spec, "spec")
        for name, s in node.get("properties", {}).items()
        if name in SHARED
    }
    out = [
        "# InferenceService reference",
        "",
        "With this page you can write an InferenceService by hand, or read why the API server refused one: "
        "every field of the spec with its type, default and allowed values, every rule checked on admission "
        "with the message it answers, and what the status reports. The same spec runs on Kubernetes "
        "(`kubectl apply`) and locally (`tandem up -f`).",
        "",
        f"A minimal one, [{example_path}](../{example_path}) (`tandem up -f {example_path} --create-tiny` "
        "runs it; [examples/inferenceservice-gpu.yaml](../examples/inferenceservice-gpu.yaml) is one for GPU "
        "nodes):",
        "",
        "```yaml",
        example.rstrip("\n"),
        "```",
        "",
        f"`apiVersion: {group}/{version}`, `kind: {service['spec']['names']['kind']}`, short name `{short}`. "
        "This page is generated from the spec types by `python -m tandem.crdgen`, with the CRDs, and a test "
        "fails when it is out of date; `kubectl explain tsvc.spec` shows the same descriptions (the bare "
        "`inferenceservice` is KServe's kind where KServe is installed).",
        "",
        "## spec",
        "",
        prose(spec.get("description", "")),
        "",
    ]
    top = [
        row("metadata.name", "name", schema["properties"]["metadata"]["properties"]["name"], True),
        *rows(spec, "", links),
    ]
    out += [_table(top), ""]
    for names, s in sections:
        out += [f"## {_heading(names)}", ""]
        out += (
            [f"- `spec.{n}`: {prose(spec['properties'][n].get('description', ''))}" for n in names]
            if len(names) > 1
            else [prose(s.get("description", ""))]
        )
        out += ["", _table(rows(s)), ""]
    for name, s in shared.items():
        users = ", ".join(f"`{p}`" for p, _ in nodes(spec, "spec") if p.endswith("." + name))
        out += [f"## {name}", "", f"{users}: {prose(s.get('description', ''))}", "", _table(rows(s)), ""]
    out += [
        "## Admission rules",
        "",
        "Besides the types and bounds above, the API server checks these rules (CEL in the CRD) and refuses "
        "an object that breaks one with the message below, naming the field.",
        "",
        "| field | refused with |",
        "| --- | --- |",
        *(
            f"| {', '.join(f'`{p}`' for p in collapse(paths))} | {prose(message)} |"
            for message, paths in admission_rules(spec).items()
        ),
        "",
        "## status",
        "",
        f"{status.get('description', '')} `kubectl get {short}` shows:",
        "",
        _columns(service),
        "",
        _table(row(f"status.{n}", n, s, False) for n, s in status["properties"].items()),
        "",
    ]
    for name in STATUS_DETAIL:
        s = status["properties"][name]
        inner = s["items"] if s.get("type") == "array" else s["additionalProperties"]
        path = f"status.{name}" + ("[]" if s.get("type") == "array" else ".<pool>")
        out += [f"### `{path}`", "", prose(s.get("description", "")), "", _table(rows(inner, "")), ""]
    pool_schema = _schema(pool)
    pool_names = pool["spec"]["names"]
    out += [
        f"## {pool_names['kind']}",
        "",
        f"The operator creates one {pool_names['kind']} (short name `{pool_names['shortNames'][0]}`) per "
        "pool of an InferenceService, named `<service>-<pool>`, and owns it. "
        f"{pool_schema['properties']['spec'].get('description', '')} `kubectl scale "
        f"{pool_names['shortNames'][0]} <service>-decode --replicas 3`, an HPA or KEDA drive one pool this "
        "way while `spec.autoscaling` is off.",
        "",
        _table(
            [
                *rows(pool_schema["properties"]["spec"], "spec"),
                *rows(pool_schema["properties"]["status"], "status"),
            ]
        ),
        "",
        "Its admission rules: "
        + "; ".join(prose(m) for m in admission_rules(pool_schema["properties"]["spec"]))
        + ".",
    ]
    return "\n".join(out).rstrip("\n") + "\n"
