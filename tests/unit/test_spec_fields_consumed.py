"""Every field of the InferenceService CRD does something: changing its value changes what the operator
renders (children, pool sizes) or what `tandem up` runs (process command lines).

The walk covers each leaf of the CRD's spec schema, so a field added to the CRD without a consumer fails
here. Fields whose consumer is still being built are listed in PENDING, checked strictly: once a field does
have an effect the test asks for its removal from the list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.launch import worker_pools
from tandem.operator.autoscale.backends.kube.loop import autoscaler_inputs
from tandem.operator.local.plan import plan
from tandem.operator.manifests import render
from tandem.operator.pools import desired_pool_replicas
from tandem.spec import InferenceService, InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]
ABSENT = object()

# Read by the autoscaler loop (policy config, metric windows, actuator) that lands in parallel; whoever
# wires a field into a consumer adds that consumer to `observe` below and removes the field here.
PENDING: set[str] = set()

# Values for fields whose schema alone does not give two valid, different ones.
VALUES: dict[str, list[Any]] = {
    "model.source.huggingFace.repoId": ["org/a", "org/b"],
    "prefill.minReplicas": [0, 1],  # at most replicas (1)
    "decode.minReplicas": [0, 1],
    "prefill.tolerations": [[], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]],
    "decode.tolerations": [[], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]],
    "prefill.env": [[], [{"name": "A", "value": "1"}]],
    "decode.env": [[], [{"name": "A", "value": "1"}]],
    "prefill.affinity": [ABSENT, {"nodeAffinity": {}}],
    "decode.affinity": [ABSENT, {"nodeAffinity": {}}],
    "security.networkPolicy.metricsFrom": [[], [{"namespaceSelector": {}}]],
    "autoscaling.prometheusUrl": [ABSENT, "http://prometheus.monitoring:9090"],
    "router.disaggregation.localPrefillMaxTpotFraction": [0.0, 0.8],
    "router.disaggregation.mixedDecodeRatio": [0.0, 0.5],
    **{
        f"{pool}.podTemplate.{field}": values
        for pool in ("router", "prefill", "decode")
        for field, values in {
            "imagePullSecrets": [[], [{"name": "registry"}]],
            "volumes": [[], [{"name": "cache", "emptyDir": {}}]],
            "volumeMounts": [[], [{"name": "cache", "mountPath": "/cache"}]],
            "env": [[], [{"name": "A", "value": "1"}]],
            "labels": [{}, {"team": "a"}],
            "annotations": [{}, {"team": "a"}],
        }.items()
    },
    "gateway.parentRefs": [[{"name": "a"}], [{"name": "b", "namespace": "gw", "sectionName": "http"}]],
}

# The rest of the spec a field needs around it to take effect (merged into the base spec).
CONTEXT: list[tuple[str, dict[str, Any]]] = [
    ("model.source.pvc.", {"model": {"source": {"pvc": {"claimName": "models"}}}}),
    (
        "model.source.huggingFace.tokenSecretRef.",
        {"model": {"source": {"huggingFace": {"repoId": "org/m", "tokenSecretRef": {"name": "hf"}}}}},
    ),
    ("model.source.huggingFace.", {"model": {"source": {"huggingFace": {"repoId": "org/m"}}}}),
    # replica bounds act while the built-in autoscaler owns the count (operator/pools.py)
    ("prefill.minReplicas", {"autoscaling": {"enabled": True}}),
    ("prefill.maxReplicas", {"autoscaling": {"enabled": True}}),
    ("decode.minReplicas", {"autoscaling": {"enabled": True}}),
    ("decode.maxReplicas", {"autoscaling": {"enabled": True}}),
    ("security.apiKeys.", {"security": {"apiKeys": {"secretName": "api-keys"}}}),
    # the live pool is scaled out of bounds in `observe`, so the switch shows as a clamp
    ("autoscaling.enabled", {}),
    ("autoscaling.flip.", {"roleFlip": True}),  # the autoscaler flips only workers that can take both roles
    (
        "autoscaling.shape.",
        {"mode": "auto", "roleFlip": True, "autoscaling": {"enabled": True}},
    ),  # mode auto reads it
    ("engine.speculative.draftModel.", {"engine": {"speculative": {"method": "draft"}}}),
    *(
        (f"router.disaggregation.{f}", {"router": {"disaggregation": {"mode": "conditional"}}})
        for f in (
            "localPrefillMaxTokens",
            "prefillQueueTokens",
            "localPrefillMaxTpotFraction",
            "mixedDecodeRatio",
        )
    ),  # only it reads them
    *(
        (
            f"{pool}.podTemplate.volumeMounts",
            {pool: {"podTemplate": {"volumes": [{"name": "cache", "emptyDir": {}}]}}},
        )
        for pool in ("router", "prefill", "decode")
    ),
    ("gateway.", {"gateway": {"parentRefs": [{"name": "gw"}], "endpointPickerRef": {"name": "epp"}}}),
]

# The rest of the spec one value of a field needs (a method and the section only it takes).
VALUE_CONTEXT: dict[str, dict[Any, dict[str, Any]]] = {
    "engine.speculative.method": {"draft": {"engine": {"speculative": {"draftModel": {"layers": 1}}}}},
    "mode": {"auto": {"roleFlip": True, "autoscaling": {"enabled": True}}},
}

BASE = {"model": {"source": {"path": "/models/m"}, "servedName": "m"}}


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "charts/tandem/files/crds/inferenceservice.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def leaves(schema: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every field a user sets: nested objects are walked, maps and lists are
    leaves."""
    props = schema.get("properties")
    if schema.get("type") == "object" and props:
        return [leaf for key, sub in props.items() for leaf in leaves(sub, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), schema)]


def values_for(path: str, schema: dict[str, Any]) -> list[Any]:
    """Two or more valid values of a field (every value of an enum)."""
    if path in VALUES:
        return VALUES[path]
    if "enum" in schema:
        return list(schema["enum"])
    kind = schema.get("type")
    if kind == "boolean":
        return [False, True]
    if kind == "integer":
        low = schema.get("default", schema.get("minimum", 1))
        if low + 1 > schema.get("maximum", low + 1):
            low -= 1
        return [low, low + 1]
    if kind == "string":
        if any("isQuantity" in r.get("rule", "") for r in schema.get("x-kubernetes-validations", [])):
            return ["1", "2"]
        if "pattern" in schema and not re.search(schema["pattern"], "/v1"):  # a name
            return ["v1", "v2"]
        return ["/v1", "/v2"]  # absolute, so path-like fields accept it too
    if kind == "object" and "additionalProperties" in schema:
        return [{}, {"k": "v"}]
    raise AssertionError(f"{path}: no values for schema {schema}; add them to VALUES")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base.get(key) or {}, value) if isinstance(value, dict) and value else value
    return out


def _with_source(doc: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """A model has exactly one source: this one replaces the base's."""
    return {**doc, "model": {**doc["model"], "source": source}}


def spec_with(path: str, value: Any) -> InferenceServiceSpec:
    doc: dict[str, Any] = BASE
    for prefix, context in CONTEXT:
        if path.startswith(prefix):
            source = context.get("model", {}).get("source")
            doc = _merge(_with_source(doc, source) if source else doc, context)
            break
    doc = _merge(doc, VALUE_CONTEXT[path].get(value, {}) if path in VALUE_CONTEXT else {})
    *parents, leaf = path.split(".")
    if parents == ["model", "source"]:  # the field is the source itself
        doc = _with_source(doc, {})
    patch: dict[str, Any] = {}
    node = patch
    for p in parents:
        node = node.setdefault(p, {})
    if value is not ABSENT:
        node[leaf] = value
    return InferenceServiceSpec.model_validate(_merge(doc, patch))


def observe(spec: InferenceServiceSpec) -> str:
    """Everything a spec drives, as one comparable document."""
    pools = worker_pools(spec)
    sizes = {
        repr(live): {p: desired_pool_replicas(spec, p, live) for p in pools}
        for live in (None, {"spec": {"replicas": 0}}, {"spec": {"replicas": 100}})
    }
    initial = {p: n for p, (n, _) in sizes["None"].items()}
    manifests = render.children(spec, "s", "ns", "uid", initial)
    try:
        local = [p.argv for p in plan(InferenceService(name="s", spec=spec), Path("/"), cpus=8)]
    except ValueError as e:  # `tandem up` serves local paths only; it says so
        local = [str(e)]
    autoscaler = autoscaler_inputs(spec, None)  # what the autoscaler loop runs (operator and tandem up)
    return json.dumps(
        {"sizes": sizes, "manifests": manifests, "local": local, "autoscaler": autoscaler},
        sort_keys=True,
        default=str,
    )


FIELDS = leaves(_spec_schema())


def test_the_walk_sees_every_section():
    sections = {path.split(".")[0] for path, _ in FIELDS}
    assert sections == set(_spec_schema()["properties"])
    assert PENDING <= {path for path, _ in FIELDS}, "PENDING names a field the CRD no longer has"


@pytest.mark.parametrize("path,schema", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_crd_field_changes_what_runs(path, schema):
    values = values_for(path, schema)
    seen: dict[str, Any] = {}
    same = []
    for value in values:
        key = observe(spec_with(path, value))
        if key in seen:
            same.append((seen[key], value))
        seen.setdefault(key, value)
    if path in PENDING:
        assert same, f"{path} now changes what runs: remove it from PENDING"
        return
    assert not same, f"{path}: the values {same} render and run identically: the field does nothing"
