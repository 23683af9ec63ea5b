"""What admission refuses, as the spec types say it: every refusal names the field by its path below spec, in
the words the CRD's rules use (tests/k8s/test_admission.py sends the same kinds of spec to a real API
server)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from tandem.spec import IGNORED_BY_MODE, InferenceServiceSpec
from tandem.spec_model import MAX_CONTEXT_LENGTH
from tests.unit.test_operator_crd import _schema

MODEL = {"source": {"path": "/m"}, "servedName": "m"}


def _spec(**fields) -> dict:
    return {"model": MODEL, **fields}


REFUSED = [
    # (id, spec, text the refusal must contain)
    (
        "context-past-any-model",
        _spec(model={**MODEL, "maxContextLength": 10**12}),
        "less than or equal to 10000000",
    ),
    (
        "decode-min-zero",
        _spec(decode={"replicas": 0, "minReplicas": 0}),
        "spec.decode.minReplicas 0 needs autoscaling",
    ),
    ("prefill-min-zero", _spec(prefill={"minReplicas": 0}), "spec.prefill.minReplicas 0 needs autoscaling"),
    (
        "colocated-decode-min-zero",
        _spec(mode="colocated", decode={"minReplicas": 0}),
        "spec.decode.minReplicas 0",
    ),
    (
        "min-above-max",
        _spec(prefill={"minReplicas": 5, "replicas": 5}),
        "minReplicas must be less than or equal to",
    ),
    (
        "colocated-prefill-replicas",
        _spec(mode="colocated", prefill={"replicas": 2, "maxReplicas": 8}),
        "spec.prefill.replicas is ignored in mode colocated: one pool serves both phases, sized by "
        "spec.decode",
    ),
    (
        "colocated-prefill-gpus",
        _spec(mode="colocated", prefill={"resources": {"gpus": 4}}),
        "spec.prefill.resources.gpus is ignored in mode colocated",
    ),
    (
        "colocated-prefill-overlay",
        _spec(mode="colocated", prefill={"podTemplate": {"labels": {"a": "b"}}}),
        "spec.prefill.podTemplate is ignored in mode colocated",
    ),
    (
        "colocated-disaggregation",
        _spec(mode="colocated", router={"disaggregation": {"mode": "conditional"}}),
        "spec.router.disaggregation.mode is ignored in mode colocated",
    ),
    (
        "colocated-kv-transfer",
        _spec(mode="colocated", kvTransfer={"transport": "grpc"}),
        "spec.kvTransfer.transport is ignored in mode colocated",
    ),
    (
        "colocated-role-flip",
        _spec(mode="colocated", roleFlip=True),
        "spec.roleFlip is ignored in mode colocated",
    ),
    (
        "conditional-knob-under-always",
        _spec(router={"disaggregation": {"mixedDecodeRatio": 0.5}}),
        "spec.router.disaggregation.mixedDecodeRatio is ignored in router.disaggregation.mode always or "
        "never",
    ),
    (
        "flip-without-role-flip",
        _spec(autoscaling={"flip": {"enabled": True}}),
        "spec.autoscaling.flip.enabled needs",
    ),
    (
        "auto-without-autoscaling",
        _spec(mode="auto", roleFlip=True),
        "spec.mode auto needs autoscaling.enabled",
    ),
    ("auto-without-role-flip", _spec(mode="auto", autoscaling={"enabled": True}), "spec.mode auto needs"),
]


@pytest.mark.parametrize("spec,want", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_careless_spec_is_refused_naming_the_field(spec, want):
    with pytest.raises(ValidationError) as e:
        InferenceServiceSpec.model_validate(spec)
    assert want in str(e.value)


@pytest.mark.parametrize(
    "spec",
    [
        _spec(model={**MODEL, "maxContextLength": MAX_CONTEXT_LENGTH}),
        _spec(
            mode="colocated", prefill={"replicas": 1, "resources": {"gpus": 1}}
        ),  # the defaults, written out
        _spec(mode="colocated", decode={"replicas": 3, "maxReplicas": 3, "resources": {"gpus": 0}}),
        _spec(router={"disaggregation": {"mode": "conditional", "mixedDecodeRatio": 0.5}}),
        _spec(router={"disaggregation": {"mode": "never"}}),
        _spec(
            mode="auto",
            roleFlip=True,
            autoscaling={"enabled": True, "flip": {"enabled": True}},
            router={"disaggregation": {"mode": "conditional"}},
        ),
    ],
    ids=[
        "longest-context",
        "colocated-prefill-at-defaults",
        "colocated-decode",
        "conditional-knob",
        "never",
        "auto",
    ],
)
def test_what_the_mode_reads_is_accepted(spec):
    InferenceServiceSpec.model_validate(spec)


def _rules(schema: dict) -> list[dict]:
    return schema.get("x-kubernetes-validations", [])


def test_the_crd_refuses_what_each_mode_ignores_with_the_types_words():
    """The CRD's spec carries one rule per setting IGNORED_BY_MODE lists, pointing at that field, with the
    message the types raise; and only those (a rule for a field the types no longer list would refuse it)."""
    crd = [
        (r["fieldPath"], r["message"], r["rule"])
        for r in _rules(_schema())
        if "is ignored in" in r["message"]
    ]
    want = [(f".{path}", rule.message(path), rule.cel) for rule in IGNORED_BY_MODE for path in rule.fields]
    assert [(path, message) for path, message, _ in crd] == [(path, message) for path, message, _ in want]
    for (_, _, cel), (_, _, when) in zip(crd, want, strict=True):
        assert cel.startswith(f"!({when}) || ")


def test_every_crd_rule_on_the_spec_names_its_field():
    """A rule on the whole spec would make the API server say only `spec: Invalid value`; each names a
    field."""
    assert all("fieldPath" in r for r in _rules(_schema())), yaml.safe_dump(_rules(_schema()))


def test_the_crd_bounds_the_context_as_the_types_do():
    assert _schema()["properties"]["model"]["properties"]["maxContextLength"]["maximum"] == MAX_CONTEXT_LENGTH
