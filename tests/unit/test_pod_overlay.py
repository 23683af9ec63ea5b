"""A pool's podTemplate goes beside what the operator renders, never over it."""

from __future__ import annotations

from tandem.operator.manifests import render
from tandem.spec import InferenceServiceSpec

BASE = {"model": {"source": {"pvc": {"claimName": "models"}}, "servedName": "m"}}
OVERLAY = {
    "labels": {"team": "a", "serving.tandem.dev/pool": "x"},
    "annotations": {"owner": "a"},
    "imagePullSecrets": [{"name": "reg"}],
    "serviceAccountName": "llm",
    "priorityClassName": "high",
    "volumes": [{"name": "prompts", "configMap": {"name": "p"}}, {"name": "model", "emptyDir": {}}],
    "volumeMounts": [
        {"name": "prompts", "mountPath": "/etc/prompts", "readOnly": True},
        {"name": "prompts", "mountPath": "/models"},
    ],
    "env": [{"name": "EXTRA", "value": "1"}],
}


def _template(pool: str, **spec) -> dict:
    s = InferenceServiceSpec.model_validate({**BASE, **spec})
    out = {
        (m["kind"], m["metadata"]["name"]): m
        for m in render.children(s, "svc", "ns", "u", {"prefill": 1, "decode": 1})
    }
    return out[("Deployment", f"svc-{pool}")]["spec"]["template"]


def test_overlay_is_merged_beside_the_operators_fields():
    for pool, key in (("decode", "decode"), ("router", "router")):
        plain, t = _template(pool), _template(pool, **{key: {"podTemplate": OVERLAY}})
        assert t["metadata"]["labels"] == {
            **plain["metadata"]["labels"],
            "team": "a",
        }  # the operator's pool label
        assert t["metadata"]["annotations"] == {**plain["metadata"]["annotations"], "owner": "a"}
        spec = t["spec"]
        assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("llm", "high")
        assert spec["imagePullSecrets"] == [{"name": "reg"}] and spec["automountServiceAccountToken"] is False
        assert spec["volumes"] == [*plain["spec"]["volumes"], {"name": "prompts", "configMap": {"name": "p"}}]
        main, before = spec["containers"][0], plain["spec"]["containers"][0]
        assert main["volumeMounts"] == [
            *before.get("volumeMounts", []),
            {"name": "prompts", "mountPath": "/etc/prompts", "readOnly": True},
        ]
        assert main["env"][-1] == {"name": "EXTRA", "value": "1"}
        assert main["securityContext"] == before["securityContext"]


def test_no_overlay_renders_as_before():
    assert _template("decode") == _template("decode", decode={})
