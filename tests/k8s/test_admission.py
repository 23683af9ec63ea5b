"""Invalid InferenceServices are rejected by the API server itself, each with a message naming the field."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.k8s.conftest import get_json, wait_for

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


def _colocated(**spec):
    obj = copy.deepcopy(VALID)
    obj["spec"].update(mode="colocated", **spec)
    return obj


CASES = [
    # (id, object, text the error must contain)
    ("replicas-above-max", _with("decode", {"replicas": 5, "maxReplicas": 4}), "spec.decode.replicas"),
    (
        "min-above-max",
        _with("prefill", {"replicas": 2, "minReplicas": 3, "maxReplicas": 2}),
        "spec.prefill.minReplicas",
    ),
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
    ("gpus-not-a-power-of-two", _with("decode.resources", {"gpus": 6}), "spec.decode.resources.gpus"),
    ("relative-host-path", _with("model.source", {"hostPath": "models"}), "spec.model.source.hostPath"),
    ("float-slo", _with("slo.ttftMs", 0.5), "spec.slo.ttftMs"),
    ("unknown-mode", _with("mode", "pipelined"), "spec.mode"),
    ("kv-percent-zero", _with("engine.kvCacheMemoryPercent", 0), "spec.engine.kvCacheMemoryPercent"),
    (
        "bad-hf-repo",
        _with("model.source", {"huggingFace": {"repoId": "no-slash"}}),
        "spec.model.source.huggingFace.repoId",
    ),
    ("zero-router-replicas", _with("router.replicas", 0), "spec.router.replicas"),
    # a pool at zero wakes only through the autoscaler
    (
        "min-zero-without-autoscaling",
        _with("decode", {"replicas": 0, "minReplicas": 0}),
        "spec.decode.minReplicas: Invalid value",
    ),
    (
        "prefill-min-zero-without-autoscaling",
        _with("prefill", {"minReplicas": 0}),
        "spec.prefill.minReplicas: Invalid value",
    ),
    (
        "colocated-min-zero-without-autoscaling",
        _colocated(decode={"minReplicas": 0, "replicas": 0}),
        "spec.decode.minReplicas",
    ),
    (
        "context-past-any-model",
        _with("model.maxContextLength", 1_000_000_000_000),
        "spec.model.maxContextLength",
    ),
    ("flip-without-role-flip", _with("autoscaling.flip", {"enabled": True}), "spec.autoscaling.flip.enabled"),
    # settings the chosen mode never reads (tandem.spec.IGNORED_BY_MODE), each refused naming the field
    (
        "colocated-prefill-pool",
        _colocated(prefill={"replicas": 2, "maxReplicas": 8, "resources": {"gpus": 4}}),
        "spec.prefill.replicas: Invalid value",
    ),
    ("colocated-prefill-gpus", _colocated(prefill={"resources": {"gpus": 4}}), "spec.prefill.resources.gpus"),
    (
        "colocated-prefill-min-zero",
        _colocated(prefill={"replicas": 0, "minReplicas": 0}),
        "spec.prefill.replicas",
    ),
    (
        "colocated-prefill-overlay",
        _colocated(prefill={"nodeSelector": {"a": "b"}}),
        "spec.prefill.nodeSelector",
    ),
    (
        "colocated-disaggregation",
        _colocated(router={"disaggregation": {"mode": "conditional"}}),
        "spec.router.disaggregation.mode",
    ),
    ("colocated-kv-transfer", _colocated(kvTransfer={"compression": "int8"}), "spec.kvTransfer.compression"),
    ("colocated-role-flip", _colocated(roleFlip=True), "spec.roleFlip"),
    (
        "conditional-knob-under-always",
        _with("router.disaggregation", {"localPrefillMaxTokens": 64}),
        "spec.router.disaggregation.localPrefillMaxTokens",
    ),
    (
        "negative-wake-queue",
        _with("router.wakeQueue", {"maxRequests": -1}),
        "spec.router.wakeQueue.maxRequests",
    ),
    # podTemplate: nothing over the operator's own fields, nothing the restricted profile forbids
    (
        "overlay-selector-label",
        _with("prefill.podTemplate", {"labels": {"serving.tandem.dev/pool": "x"}}),
        "spec.prefill.podTemplate.labels",
    ),
    (
        "overlay-component-label",
        _with("router.podTemplate", {"labels": {"app.kubernetes.io/component": "x"}}),
        "spec.router.podTemplate.labels",
    ),
    (
        "overlay-scrape-annotation",
        _with("decode.podTemplate", {"annotations": {"prometheus.io/port": "1"}}),
        "spec.decode.podTemplate.annotations",
    ),
    (
        "overlay-operator-volume",
        _with("prefill.podTemplate", {"volumes": [{"name": "model", "emptyDir": {}}]}),
        "the operator's",
    ),
    (
        "overlay-two-sources",
        _with(
            "decode.podTemplate", {"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}
        ),
        "exactly one of",
    ),
    (
        "overlay-mount-without-volume",
        _with("prefill.podTemplate", {"volumeMounts": [{"name": "c", "mountPath": "/c"}]}),
        "must each name a volume",
    ),
    (
        "overlay-mount-over-models",
        _with(
            "prefill.podTemplate",
            {
                "volumes": [{"name": "c", "emptyDir": {}}],
                "volumeMounts": [{"name": "c", "mountPath": "/models/x"}],
            },
        ),
        "mount paths",
    ),
    (
        "overlay-tandem-env",
        _with("router.podTemplate", {"env": [{"name": "TANDEM_LOG_LEVEL", "value": "x"}]}),
        "TANDEM_",
    ),
    (
        "overlay-bad-service-account",
        _with("decode.podTemplate", {"serviceAccountName": "Bad_SA"}),
        "spec.decode.podTemplate.serviceAccountName",
    ),
]


def test_valid_object_is_accepted_with_defaults(control_plane):
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-o", "yaml", "-f", "-", input=yaml.safe_dump(VALID)
    )
    spec = yaml.safe_load(out.stdout)["spec"]
    assert spec["mode"] == "disaggregated"
    assert spec["prefill"] == {"replicas": 1, "minReplicas": 1, "maxReplicas": 4, "resources": {"gpus": 1}}
    assert spec["router"]["resources"]["gpus"] == 0
    assert spec["slo"] == {"ttftMs": 500, "tpotMs": 50, "percentile": 90}
    assert spec["model"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("obj,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_object_rejected_naming_the_field(control_plane, obj, field):
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False
    )
    assert out.returncode != 0, f"accepted: {obj['spec']}"
    assert "is invalid" in out.stderr or "Invalid value" in out.stderr or "Required value" in out.stderr, (
        out.stderr
    )
    assert field in out.stderr, out.stderr


@pytest.mark.parametrize(
    "spec",
    [
        {
            "autoscaling": {"enabled": True},
            "prefill": {"replicas": 0, "minReplicas": 0},
            "decode": {"replicas": 0, "minReplicas": 0},
        },
        {"mode": "colocated", "decode": {"replicas": 0, "minReplicas": 0}, "autoscaling": {"enabled": True}},
    ],
    ids=["autoscaled", "colocated-autoscaled"],
)
def test_a_pool_at_zero_is_accepted_where_something_can_wake_it(control_plane, spec):
    obj = copy.deepcopy(VALID)
    obj["spec"].update(spec)
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-o", "yaml", "-f", "-", input=yaml.safe_dump(obj)
    )
    assert yaml.safe_load(out.stdout)["spec"]["router"]["wakeQueue"] == {
        "maxRequests": 64,
        "timeoutSeconds": 300,
    }


@pytest.mark.parametrize(
    "obj",
    [
        _colocated(
            prefill={"replicas": 1, "resources": {"gpus": 1}}, decode={"replicas": 2}
        ),  # prefill's defaults
        _with(
            "router.disaggregation",
            {"mode": "conditional", "localPrefillMaxTokens": 64, "mixedDecodeRatio": 0.5},
        ),
        _with("model.maxContextLength", 10_000_000),
    ],
    ids=["colocated-prefill-at-defaults", "conditional-knobs", "longest-context"],
)
def test_what_the_mode_reads_is_accepted(control_plane, obj):
    control_plane.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj))


def test_unknown_field_rejected(control_plane):
    obj = _with("prefil", {"replicas": 1})
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False
    )
    assert out.returncode != 0 and "prefil" in out.stderr, out.stderr


def test_pool_identity_is_immutable(control_plane, namespace):
    pool = {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "TandemPool",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"service": "a", "pool": "decode"},
    }
    control_plane.kubectl("create", "-f", "-", input=yaml.safe_dump(pool))
    out = control_plane.kubectl(
        "patch",
        "tpool",
        "p",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"pool":"prefill"}}',
        check=False,
    )
    assert out.returncode != 0 and "spec.pool" in out.stderr, out.stderr


def test_kubectl_explain_documents_every_slo_field(control_plane):
    out = control_plane.kubectl("explain", "tsvc.spec.slo").stdout
    assert "<no description>" not in out
    for field in ("ttftMs", "tpotMs", "percentile"):
        assert field in out
    assert "Time to first token" in out
    pool = control_plane.kubectl("explain", "tpool.spec").stdout
    assert "<no description>" not in pool and "InferenceService" in pool


@pytest.mark.parametrize("validate", ["strict", "false"])
def test_a_host_path_volume_is_refused(control_plane, validate):
    """kubectl's strict field validation names the unknown source; a client without it gets the source pruned,
    which leaves the volume without one: refused by the rule that names the restricted profile."""
    obj = _with("prefill.podTemplate", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]})
    out = control_plane.kubectl(
        "create",
        "--dry-run=server",
        f"--validate={validate}",
        "-f",
        "-",
        input=yaml.safe_dump(obj),
        check=False,
    )
    assert out.returncode != 0, out.stdout
    want = (
        'unknown field "spec.prefill.podTemplate.volumes[0].hostPath"'
        if validate == "strict"
        else "restricted Pod Security Standard"
    )
    assert want in out.stderr, out.stderr


def test_pod_template_overlay_reaches_pods_the_restricted_profile_admits(control_plane, operator, namespace):
    """An overlay on every pool: the operator merges it, and the pods (in a namespace enforcing the restricted
    Pod Security Standard) are created with it beside everything the operator renders."""
    cp, ns = control_plane, namespace
    cp.kubectl("create", "serviceaccount", "llm", "-n", ns)
    cp.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": f"{ns}-serving"},
                "value": 1000,
            }
        ),
    )
    overlay = {
        "labels": {"team": "search"},
        "annotations": {"example.com/owner": "search"},
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccountName": "llm",
        "priorityClassName": f"{ns}-serving",
        "volumes": [{"name": "prompts", "configMap": {"name": "prompts", "optional": True}}],
        "volumeMounts": [{"name": "prompts", "mountPath": "/etc/prompts", "readOnly": True}],
        "env": [{"name": "EXTRA", "value": "1"}],
    }
    obj = copy.deepcopy(VALID)
    obj["metadata"] = {"name": "overlaid", "namespace": ns}
    obj["spec"]["prefill"] = {"resources": {"gpus": 0}, "podTemplate": overlay}
    obj["spec"]["decode"] = {"resources": {"gpus": 0}, "podTemplate": overlay}
    obj["spec"]["router"] = {"podTemplate": overlay}
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    for pool in ("prefill", "decode", "router"):
        pods = wait_for(
            lambda pool=pool: get_json(
                cp,
                "pods",
                "-l",
                f"serving.tandem.dev/inferenceservice=overlaid,serving.tandem.dev/pool={pool}",
                namespace=ns,
            )["items"],
            90,
            f"{pool} pods admitted",
        )
        pod = pods[0]
        assert (
            pod["metadata"]["labels"]["team"] == "search"
            and pod["metadata"]["labels"]["serving.tandem.dev/pool"] == pool
        )
        assert pod["metadata"]["annotations"]["example.com/owner"] == "search"
        assert "prometheus.io/scrape" in pod["metadata"]["annotations"]
        spec = pod["spec"]
        assert spec["serviceAccountName"] == "llm" and spec["priorityClassName"] == f"{ns}-serving"
        assert spec["priority"] == 1000 and spec["imagePullSecrets"] == [{"name": "registry"}]
        assert spec["automountServiceAccountToken"] is False
        assert "prompts" in {v["name"] for v in spec["volumes"]} and "scratch" in {
            v["name"] for v in spec["volumes"]
        }
        main = spec["containers"][0]
        assert {"name": "prompts", "mountPath": "/etc/prompts", "readOnly": True} in main["volumeMounts"]
        assert {"name": "EXTRA", "value": "1"} in main["env"]
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
    cp.kubectl("delete", "priorityclass", f"{ns}-serving", "--wait=false", check=False)
