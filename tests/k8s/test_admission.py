"""Invalid InferenceServices are rejected by the API server itself, each with a message naming the field."""

from __future__ import annotations

import copy

import pytest
import yaml

VALID = {
    "apiVersion": "serving.tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "bad"},
    "spec": {"model": {"source": {"path": "/models/m"}, "servedName": "m"}},
}


def _with(path: str, value):
    obj = copy.deepcopy(VALID)
    node = obj["spec"]
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return obj


_DELETE = object()

CASES = [
    # (id, object, text the error must contain)
    ("replicas-above-max", _with("decode", {"replicas": 5, "maxReplicas": 4}), "spec.decode"),
    ("min-above-max", _with("prefill", {"replicas": 2, "minReplicas": 3, "maxReplicas": 2}), "spec.prefill"),
    ("negative-replicas", _with("prefill.replicas", -1), "spec.prefill.replicas"),
    ("zero-ttft", _with("slo.ttftMs", 0), "spec.slo.ttftMs"),
    ("negative-tpot", _with("slo.tpotMs", -5), "spec.slo.tpotMs"),
    ("percentile-over-100", _with("slo.percentile", 101), "spec.slo.percentile"),
    ("unknown-dtype", _with("model.dtype", "float8"), "spec.model.dtype"),
    ("two-sources", _with("model.source", {"path": "/a", "image": "m:1"}), "spec.model.source"),
    ("no-source", _with("model.source", {}), "spec.model.source"),
    ("missing-served-name", _with("model.servedName", _DELETE), "spec.model.servedName"),
    ("bad-transport", _with("kvTransfer.transport", "rdma"), "spec.kvTransfer.transport"),
    ("bad-compression", _with("kvTransfer.compression", "zstd"), "spec.kvTransfer.compression"),
    ("bad-quantity", _with("decode.resources", {"cpu": "lots"}), "spec.decode.resources.cpu"),
    ("negative-gpus", _with("prefill.resources", {"gpus": -1}), "spec.prefill.resources.gpus"),
    ("relative-host-path", _with("model.source", {"hostPath": "models"}), "spec.model.source.hostPath"),
    ("float-slo", _with("slo.ttftMs", 0.5), "spec.slo.ttftMs"),
    ("unknown-mode", _with("mode", "pipelined"), "spec.mode"),
    ("kv-percent-zero", _with("engine.kvCacheMemoryPercent", 0), "spec.engine.kvCacheMemoryPercent"),
    ("bad-hf-repo", _with("model.source", {"huggingFace": {"repoId": "no-slash"}}),
     "spec.model.source.huggingFace.repoId"),
    ("zero-router-replicas", _with("router.replicas", 0), "spec.router.replicas"),
]


def test_valid_object_is_accepted_with_defaults(control_plane):
    out = control_plane.kubectl("create", "--dry-run=server", "-o", "yaml", "-f", "-", input=yaml.safe_dump(VALID))
    spec = yaml.safe_load(out.stdout)["spec"]
    assert spec["mode"] == "disaggregated"
    assert spec["prefill"] == {"replicas": 1, "minReplicas": 1, "maxReplicas": 4, "resources": {"gpus": 1}}
    assert spec["router"]["resources"]["gpus"] == 0
    assert spec["slo"] == {"ttftMs": 500, "tpotMs": 50, "percentile": 90}
    assert spec["model"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("obj,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_object_rejected_naming_the_field(control_plane, obj, field):
    out = control_plane.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert out.returncode != 0, f"accepted: {obj['spec']}"
    assert "is invalid" in out.stderr or "Invalid value" in out.stderr or "Required value" in out.stderr, out.stderr
    assert field in out.stderr, out.stderr


def test_unknown_field_rejected(control_plane):
    obj = _with("prefil", {"replicas": 1})
    out = control_plane.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert out.returncode != 0 and "prefil" in out.stderr, out.stderr


def test_pool_identity_is_immutable(control_plane, namespace):
    pool = {"apiVersion": "serving.tandem.dev/v1alpha1", "kind": "TandemPool",
            "metadata": {"name": "p", "namespace": namespace}, "spec": {"service": "a", "pool": "decode"}}
    control_plane.kubectl("create", "-f", "-", input=yaml.safe_dump(pool))
    out = control_plane.kubectl("patch", "tpool", "p", "-n", namespace, "--type=merge",
                                "-p", '{"spec":{"pool":"prefill"}}', check=False)
    assert out.returncode != 0 and "spec.pool" in out.stderr, out.stderr


def test_kubectl_explain_documents_every_slo_field(control_plane):
    out = control_plane.kubectl("explain", "tsvc.spec.slo").stdout
    assert "<no description>" not in out
    for field in ("ttftMs", "tpotMs", "percentile"):
        assert field in out
    assert "Time to first token" in out
    pool = control_plane.kubectl("explain", "tpool.spec").stdout
    assert "<no description>" not in pool and "InferenceService" in pool
