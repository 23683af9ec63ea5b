"""Write the CRDs from the spec types: pydantic's JSON schema made structural for Kubernetes, plus the names,
printer columns and subresources declared here. `python -m tandem.crdgen` rewrites the chart's CRD files and
the field reference drawn from them (docs/inferenceservice.md, tandem.specdoc); `--check` only says whether
they are current (tests/unit/test_crd_drift.py, tests/unit/test_spec_doc_drift.py)."""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tandem import names, specdoc
from tandem.spec import API_GROUP, API_VERSION, KIND, InferenceServiceSpec
from tandem.spec_pool import TandemPoolSpec, TandemPoolStatus
from tandem.spec_status import InferenceServiceStatus

# A DNS-1035 label: Services need one, and every child is named <name>-<pool>.
DNS_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX = (
    63
    - len("-")
    - max(len(p) for p in (names.POOL_PREFILL, names.POOL_DECODE, names.POOL_COLOCATED, names.POOL_ROUTER))
)


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as Kubernetes takes it: every $ref inlined, `X | None` as X, `gt` on an
    integer as `minimum`, a model field's defaults as `default: {}`, descriptions on one line."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _ordered(_clean(schema, schema.get("$defs", {}), _defaults(model)))


def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Defaults pydantic's schema leaves out (those of default_factory), by field alias, nested by model. A
    model's default is `{}`: the API server then fills in its fields' own defaults (but checks the default
    against the model's rules before that: a model whose rules read its fields declares a fuller default)."""
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        alias = f.alias or name
        if f.default_factory is not None:
            value = f.default_factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                out[alias] = {"default": {}}
            elif value:
                out[alias] = {"default": copy.deepcopy(value)}
        if (inner := model_of(f)) is not None:
            out.setdefault(alias, {})["properties"] = _defaults(inner)
    return out


def model_of(f: FieldInfo) -> type[BaseModel] | None:
    """The model a field holds (itself, optional, or in a list or map), if any."""
    for t in (f.annotation, *getattr(f.annotation, "__args__", ())):
        for u in (t, *getattr(t, "__args__", ())):
            if isinstance(u, type) and issubclass(u, BaseModel):
                return u
    return None


def _clean(
    node: dict[str, Any], defs: dict[str, Any], defaults: dict[str, Any], own_doc: bool = False
) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:  # the field's own keys (description, default, rules) win over its type's; a class's
        ref = defs[node.pop("$ref").rsplit("/", 1)[-1]]  # docstring describes a list's item or a map's value
        node = {**{k: v for k, v in ref.items() if own_doc or k != "description"}, **node}
    if "anyOf" in node:
        (one,) = [s for s in node.pop("anyOf") if s.get("type") != "null"]
        node = {**_clean(one, defs, {}, own_doc), **node}
        if "default" in node and node["default"] is None:
            del node["default"]
    if isinstance(node.get("default"), Enum):
        node["default"] = node["default"].value
    if "exclusiveMinimum" in node and node.get("type") == "integer":
        node["minimum"] = node.pop("exclusiveMinimum") + 1
    if "description" in node:
        node["description"] = " ".join(node["description"].split())
    extra = node.pop("additionalProperties", None)
    if isinstance(extra, dict) and extra:
        node["additionalProperties"] = _clean(extra, defs, {}, own_doc=True)
    elif extra is True or extra == {}:  # dict[str, Any]: a Kubernetes object passed through as written
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in node:
        node["properties"] = {
            k: _clean(v, defs, defaults.get(k, {}).get("properties", {}))
            for k, v in node["properties"].items()
        }
        for k, d in defaults.items():
            if "default" in d and "default" not in node["properties"][k]:  # a default the field declares wins
                node["properties"][k] = {**node["properties"][k], "default": d["default"]}
    if isinstance(node.get("items"), dict):
        node["items"] = _clean(node["items"], defs, {}, own_doc=True)
    for key in ("title", "$defs"):
        node.pop(key, None)
    return node


_FIRST = ("description", "type", "format", "enum", "default", "required")
_LAST = ("properties", "additionalProperties", "items", "x-kubernetes-validations")


def _ordered(node: Any) -> Any:
    """Keys in reading order (what it is, then its bounds, then what it holds), all the way down."""
    if isinstance(node, list):
        return [_ordered(n) for n in node]
    if not isinstance(node, dict):
        return node
    keys = (
        [k for k in _FIRST if k in node]
        + [k for k in node if k not in _FIRST + _LAST]
        + [k for k in _LAST if k in node]
    )
    return {k: (node[k] if k in ("default", "enum", "required") else _ordered(node[k])) for k in keys}


def _column(
    name: str, path: str, kind: str = "string", description: str = "", priority: int = 0
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    return (
        out
        | ({"description": description} if description else {})
        | ({"priority": priority} if priority else {})
    )


@dataclass(frozen=True)
class Crd:
    """One CRD: its names, its spec and status types, what `kubectl get` shows, and its subresources."""

    file: str
    about: str  # the file's opening comment
    kind: str
    short_name: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[dict[str, Any], ...]
    metadata: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    scale: dict[str, str] | None = None

    def document(self) -> dict[str, Any]:
        plural = self.kind.lower() + "s"
        schema = {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": self.metadata,
                "spec": structural(self.spec),
                "status": structural(self.status),
            },
        }
        subresources: dict[str, Any] = {"status": {}} | ({"scale": self.scale} if self.scale else {})
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{API_GROUP}", "labels": {"app.kubernetes.io/name": "tandem"}},
            "spec": {
                "group": API_GROUP,
                "scope": "Namespaced",
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": plural,
                    "singular": self.kind.lower(),
                    "shortNames": [self.short_name],
                    "categories": ["tandem"],
                },
                "versions": [
                    {
                        "name": API_VERSION,
                        "served": True,
                        "storage": True,
                        "subresources": subresources,
                        "additionalPrinterColumns": list(self.columns),
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        }

    def render(self) -> str:
        about = "".join(f"# {line}\n" for line in self.about.splitlines())
        body = yaml.safe_dump(self.document(), sort_keys=False, width=120, allow_unicode=True)
        generated = (
            "# Generated from the spec types by `python -m tandem.crdgen`: edit those, not this file.\n"
        )
        return f"{about}{generated}{body}"


_READY = '.status.conditions[?(@.type=="Ready")]'
AGE = _column("Age", ".metadata.creationTimestamp", "date")

CRDS = (
    Crd(
        "inferenceservice.yaml",
        "The InferenceService API: one object per served model; the operator turns it into prefill, decode\n"
        "and router Deployments.",
        KIND,
        "tsvc",
        InferenceServiceSpec,
        InferenceServiceStatus,
        (
            _column("Ready", f"{_READY}.status"),
            _column("Reason", f"{_READY}.reason", description="why Ready is what it is"),
            _column("Mode", ".spec.mode"),
            _column(
                "Workers",
                ".status.workers",
                description="ready/desired workers of each pool (prefill and decode, or colocated)",
            ),
            _column("Router", ".status.pools.router.summary", description="ready/desired router replicas"),
            _column("TTFT-SLO", ".spec.slo.ttftMs", "integer", priority=1),
            _column("TPOT-SLO", ".spec.slo.tpotMs", "integer", priority=1),
            _column(
                "TTFT",
                ".status.slo.ttft",
                description="observed TTFT at the SLO percentile / target (autoscaling on)",
            ),
            _column(
                "TPOT",
                ".status.slo.tpot",
                description="observed TPOT at the SLO percentile / target (autoscaling on)",
            ),
            _column(
                "SLO",
                '.status.conditions[?(@.type=="SLOMet")].status',
                description="SLOMet condition (True, False, Unknown)",
            ),
            _column("Endpoint", ".status.routerEndpoint", priority=1),
            AGE,
        ),
        metadata={
            "type": "object",
            "properties": {
                "name": {
                    "description": (
                        f"A DNS-1035 label of at most {NAME_MAX} characters, so <name>-colocated fits 63."
                    ),
                    "type": "string",
                    "maxLength": NAME_MAX,
                    "pattern": DNS_LABEL,
                }
            },
        },
    ),
    Crd(
        "tandempool.yaml",
        "TandemPool: one child per pool of an InferenceService, with a /scale subresource so kubectl scale,\n"
        "HPA or KEDA drive that pool's replica count alone. The operator creates and owns these objects.",
        "TandemPool",
        "tpool",
        TandemPoolSpec,
        TandemPoolStatus,
        (
            _column("Service", ".spec.service"),
            _column("Pool", ".spec.pool"),
            _column("Desired", ".spec.replicas", "integer"),
            _column("Ready", ".status.readyReplicas", "integer"),
            AGE,
        ),
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    ),
)


ROOT = Path(__file__).resolve().parent.parent  # a source checkout's
EXAMPLE = "examples/tiny.yaml"  # the reference's minimal example


def repo_crds_dir() -> Path:
    """The chart's CRD folder of a source checkout (crds/ at the top is a link to it)."""
    return ROOT / "charts" / "tandem" / "files" / "crds"


def repo_doc() -> Path:
    """The field reference of a source checkout."""
    return ROOT / "docs" / "inferenceservice.md"


def stale(out_dir: Path) -> list[str]:
    """The CRD files under out_dir that differ from what the types give."""
    return [
        c.file
        for c in CRDS
        if not (out_dir / c.file).exists() or (out_dir / c.file).read_text() != c.render()
    ]


def reference() -> str:
    """docs/inferenceservice.md: every field and admission rule, from the CRDs, with the minimal example."""
    service, pool = (c.document() for c in CRDS)
    return specdoc.render(service, pool, EXAMPLE, (ROOT / EXAMPLE).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.crdgen", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=repo_crds_dir(), help="the CRD folder (default: the chart's)"
    )
    parser.add_argument("--doc", type=Path, default=repo_doc(), help="the field reference (default: docs/'s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    ns = parser.parse_args(argv)
    doc = reference()
    if ns.check:
        old = [ns.out / name for name in stale(ns.out)]
        old += [] if ns.doc.exists() and ns.doc.read_text() == doc else [ns.doc]
        for path in old:
            print(f"{path} is out of date: run python -m tandem.crdgen", file=sys.stderr)
        return 1 if old else 0
    for c in CRDS:
        (ns.out / c.file).write_text(c.render())
        print(ns.out / c.file)
    ns.doc.write_text(doc)
    print(ns.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
