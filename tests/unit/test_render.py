"""Pure rendering: spec in, manifests out, no cluster."""

from pathlib import Path

import pytest

from tandem import names
from tandem.operator.manifests import manifest, render
from tandem.operator.model.cache import ModelCache
from tandem.operator.model.source import MODEL_MOUNT
from tandem.spec import InferenceServiceSpec, load_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu_spec() -> InferenceServiceSpec:
    return load_file(ROOT / "examples/inferenceservice-gpu.yaml").spec


def _by(manifests, kind, name):
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def test_disaggregated_children(gpu_spec):
    out = render.children(gpu_spec, "llama", "ml", "uid-1", {"prefill": 1, "decode": 3})
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in out)
    assert kinds == sorted(
        [
            ("Deployment", "llama-prefill"),
            ("Service", "llama-prefill"),
            ("PodDisruptionBudget", "llama-prefill"),
            ("Deployment", "llama-decode"),
            ("Service", "llama-decode"),
            ("PodDisruptionBudget", "llama-decode"),
            ("Deployment", "llama-router"),
            ("Service", "llama-router"),
            ("NetworkPolicy", "llama-prefill"),
            ("NetworkPolicy", "llama-decode"),
            ("NetworkPolicy", "llama-router"),
        ]
    )
    for m in out:
        assert m["metadata"]["namespace"] == "ml"
        (ref,) = m["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "serving.tandem.dev/v1alpha1",
            "kind": "InferenceService",
            "name": "llama",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert m["metadata"]["labels"][names.LABEL_SERVICE] == "llama"


def test_worker_deployment_gpu_probes_labels(gpu_spec):
    dep = render.worker_deployment(gpu_spec, "llama", "ml", "u", names.POOL_DECODE, 3)
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"][names.LABEL_POOL] == "decode"
    assert dep["spec"]["selector"]["matchLabels"] == {
        names.LABEL_SERVICE: "llama",
        names.LABEL_POOL: "decode",
    }
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"] == {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert (
        c["readinessProbe"]["grpc"]["port"] == names.HEALTH_PORT
    )  # its own server: no load on the gRPC port delays it
    assert c["livenessProbe"]["grpc"]["port"] == names.HEALTH_PORT
    # liveness asks for the health service a draining worker keeps SERVING; readiness for the one it drops
    assert c["livenessProbe"]["grpc"]["service"] == names.WORKER_LIVENESS_SERVICE
    assert "service" not in c["readinessProbe"]["grpc"]
    assert c["args"][:3] == ["worker", "--role", "decode"]
    assert c["env"] == gpu_spec.decode.env  # only what the user asked for: pool and service are in the args
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["model"]["persistentVolumeClaim"]["claimName"] == "models"
    assert (
        "--model-dir" in c["args"]
        and c["args"][c["args"].index("--model-dir") + 1] == "/models/meta-llama/Llama-3.1-8B-Instruct"
    )
    # the arguments parse with the real `tandem worker` parser
    from tandem.worker.serve.main import parse_args

    parsed = parse_args(c["args"][1:])
    assert (parsed.role, parsed.port, parsed.block_size) == (
        "decode",
        names.GRPC_PORT,
        gpu_spec.engine.block_size,
    )


def test_router_args_parse_and_find_pools_through_headless_services(gpu_spec):
    from tandem.worker.router.main import build_parser, check_args

    dep = render.router_deployment(gpu_spec, "llama", "ml", "u")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(c["args"][1:])
    assert check_args(args) is None
    assert args.decode == [f"dns:///llama-decode.ml.svc:{names.GRPC_PORT}"]
    assert args.model_dir == "/models/meta-llama/Llama-3.1-8B-Instruct"
    assert {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True} in c["volumeMounts"]


def test_router_deployment_http_probes_and_no_gpu(gpu_spec):
    dep = render.router_deployment(gpu_spec, "llama", "ml", "u")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": names.READINESS_PATH, "port": names.HTTP_PORT}
    assert c["livenessProbe"]["httpGet"] == {"path": names.LIVENESS_PATH, "port": names.HTTP_PORT}
    assert "nvidia.com/gpu" not in c["resources"].get("requests", {})
    assert c["args"][0] == "router"
    assert "dns:///llama-decode.ml.svc:50051" in c["args"]
    assert "dns:///llama-prefill.ml.svc:50051" in c["args"]


def test_colocated_has_one_pool_sized_by_decode(gpu_spec):
    spec = InferenceServiceSpec.model_validate(
        {
            **gpu_spec.model_dump(mode="json", by_alias=True, exclude={"prefill", "kv_transfer"}),
            "mode": "colocated",
        }
    )  # colocated refuses the settings it ignores
    assert render.worker_pools(spec) == ["colocated"]
    out = render.children(spec, "s", "ns", "u", {"colocated": 2})
    deps = [m for m in out if m["kind"] == "Deployment"]
    assert sorted(d["metadata"]["name"] for d in deps) == ["s-colocated", "s-router"]
    co = _by(out, "Deployment", "s-colocated")
    assert co["spec"]["template"]["spec"]["containers"][0]["args"][:3] == ["worker", "--role", "colocated"]


def _edited(spec: InferenceServiceSpec, patch: dict) -> InferenceServiceSpec:
    """The spec with a camelCase patch merged in, validated as the API server's object would be."""

    def merge(base: dict, over: dict) -> dict:
        return {
            **base,
            **{k: merge(base.get(k) or {}, v) if isinstance(v, dict) else v for k, v in over.items()},
        }

    return InferenceServiceSpec.model_validate(merge(spec.model_dump(mode="json", by_alias=True), patch))


def _pod_templates(spec: InferenceServiceSpec) -> dict[str, dict]:
    """Deployment name -> pod template: what Kubernetes compares to decide whether pods restart."""
    out = render.children(spec, "s", "ns", "u", {"prefill": 1, "decode": 1, "colocated": 1})
    return {m["metadata"]["name"]: m["spec"]["template"] for m in out if m["kind"] == "Deployment"}


@pytest.mark.parametrize(
    "patch",
    [
        {"autoscaling": {"enabled": True, "windowSeconds": 300, "scaleDownCooldownSeconds": 1}},
        {
            "decode": {"replicas": 3, "minReplicas": 2, "maxReplicas": 8},
            "prefill": {"maxReplicas": 6},
        },  # min 0 needs autoscaling
        {"router": {"replicas": 3}},
    ],
    ids=["autoscaling", "pool-replicas", "router-replicas"],
)
def test_edits_the_pods_do_not_consume_leave_every_pod_template_alone(gpu_spec, patch):
    edited = _edited(gpu_spec, patch)
    assert edited != gpu_spec
    assert _pod_templates(edited) == _pod_templates(gpu_spec)


@pytest.mark.parametrize(
    "patch,rolled",
    [
        ({"image": "tandem-worker:9"}, {"s-prefill", "s-decode", "s-router"}),
        ({"engine": {"maxBatchTokens": 4096}}, {"s-prefill", "s-decode"}),
        ({"model": {"maxContextLength": 16384}}, {"s-prefill", "s-decode", "s-router"}),
        ({"model": {"servedName": "other"}}, {"s-prefill", "s-decode", "s-router"}),
        ({"decode": {"resources": {"gpus": 2}}}, {"s-decode"}),
        ({"router": {"maxQueuedRequests": 9}}, {"s-router"}),
        # the router exports the SLO targets beside its latency metrics; no GPU pod reads them
        ({"slo": {"ttftMs": 999, "tpotMs": 7, "percentile": 99}}, {"s-router"}),
        # a prefill worker never decodes, so only the decode pool runs with drafts
        ({"engine": {"speculative": {"numTokens": 3}}}, {"s-decode"}),
    ],
    ids=["image", "engine", "context", "served-name", "decode-gpus", "router-queue", "slo", "speculative"],
)
def test_edits_the_pods_consume_roll_exactly_those_pods(gpu_spec, patch, rolled):
    before, after = _pod_templates(gpu_spec), _pod_templates(_edited(gpu_spec, patch))
    assert {name for name in before if before[name] != after[name]} == rolled


def test_rendering_is_deterministic(gpu_spec):
    one = [
        manifest.with_hash(m) for m in render.children(gpu_spec, "s", "ns", "u", {"prefill": 1, "decode": 1})
    ]
    two = [
        manifest.with_hash(m) for m in render.children(gpu_spec, "s", "ns", "u", {"prefill": 1, "decode": 1})
    ]
    assert one == two


@pytest.mark.parametrize(
    "source,volume,init",
    [
        ({"path": "/weights"}, None, False),
        ({"hostPath": "/data/m"}, "hostPath", False),
        ({"image": "models/llama:1"}, "emptyDir", True),
        ({"huggingFace": {"repoId": "org/m", "tokenSecretRef": {"name": "hf"}}}, "emptyDir", True),
    ],
)
def test_model_sources(source, volume, init):
    spec = InferenceServiceSpec.model_validate({"model": {"source": source, "servedName": "m"}})
    dep = render.worker_deployment(spec, "s", "ns", "u", "prefill", 1)
    pod = dep["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    if volume is None:
        assert "model" not in vols
    else:
        assert volume in vols["model"]
    assert bool(pod.get("initContainers")) is init
    if "huggingFace" in source:
        env = pod["initContainers"][0]["env"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in env


def test_no_gpu_pool_requests_no_gpu():
    spec = InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, "prefill": {"resources": {"gpus": 0}}}
    )
    c = render.worker_deployment(spec, "s", "ns", "u", "prefill", 1)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "nvidia.com/gpu" not in str(c["resources"])
    c = render.worker_deployment(spec, "s", "ns", "u", "decode", 1)["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_worker_pods_drain_before_they_stop(gpu_spec):
    """preStop drains the worker; the grace period outlasts the drain timeout, which covers the longest
    generation the spec allows; the worker itself exits after the same timeout."""
    from tandem.launch import drain_timeout_seconds

    out = render.children(gpu_spec, "llama", "ml", "uid-1", {"prefill": 1, "decode": 2})
    for pool in ("prefill", "decode"):
        pod = _by(out, "Deployment", f"llama-{pool}")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:2] == ["tandem", "drain"] and "--wait" in command
        assert command[command.index("--address") + 1] == f"127.0.0.1:{names.GRPC_PORT}"
        drain_s = drain_timeout_seconds(gpu_spec)
        assert drain_s * 1000 >= 2 * gpu_spec.model.max_context_length * gpu_spec.slo.tpot_ms
        assert pod["terminationGracePeriodSeconds"] > drain_s
        args = container["args"]
        assert args[args.index("--drain-timeout") + 1] == str(drain_s)
    router = _by(out, "Deployment", "llama-router")["spec"]["template"]["spec"]
    assert "lifecycle" not in router["containers"][0]


def test_the_gpu_example_ships_the_claim_it_reads(gpu_spec):
    import yaml

    pvc = yaml.safe_load((ROOT / "examples/models-pvc.yaml").read_text())
    assert (pvc["kind"], pvc["metadata"]["name"]) == (
        "PersistentVolumeClaim",
        gpu_spec.model.source.pvc.claim_name,
    )
    assert "ReadOnlyMany" in pvc["spec"]["accessModes"]  # every worker pod mounts it, read-only


HF = {"huggingFace": {"repoId": "org/m", "revision": "refs/pr/1"}}


def test_hf_source_fetches_only_what_each_pod_needs_into_a_folder_per_revision():
    spec = InferenceServiceSpec.model_validate({"model": {"source": HF, "servedName": "m"}})
    (fetch,) = render.worker_deployment(spec, "s", "ns", "u", "prefill", 1)["spec"]["template"]["spec"][
        "initContainers"
    ]
    (router_fetch,) = render.router_deployment(spec, "s", "ns", "u")["spec"]["template"]["spec"][
        "initContainers"
    ]
    folder = "/models/org/m/refs--pr--1"
    assert fetch["command"] == [
        "tandem",
        "fetch-model",
        "org/m",
        "--revision",
        "refs/pr/1",
        "--dir",
        folder,
        "--part",
        "weights",
    ]
    assert router_fetch["command"][-2:] == ["--part", "tokenizer"]  # the router never downloads weights
    from tandem.worker.hf.fetch import parse_args  # the arguments parse with the real command's parser

    args = parse_args(fetch["command"][2:])
    assert (args.repo_id, args.revision, str(args.dir), args.part) == (
        "org/m",
        "refs/pr/1",
        folder,
        "weights",
    )
    assert (
        render.worker_args(spec, "s", "prefill")[
            render.worker_args(spec, "s", "prefill").index("--model-dir") + 1
        ]
        == folder
    )


@pytest.mark.parametrize(
    "cache,volume",
    [
        (None, {"name": "model", "emptyDir": {}}),
        (
            ModelCache(host_path="/var/lib/tandem/models/"),
            {"name": "model", "hostPath": {"path": "/var/lib/tandem/models/ns", "type": "DirectoryOrCreate"}},
        ),
        (
            ModelCache(claim_name="models"),
            {"name": "model", "persistentVolumeClaim": {"claimName": "models"}},
        ),
    ],
)
def test_hf_downloads_go_to_the_chart_cache_one_folder_per_namespace(cache, volume):
    spec = InferenceServiceSpec.model_validate({"model": {"source": HF, "servedName": "m"}})
    for dep in [
        render.worker_deployment(spec, "s", "ns", "u", "decode", 1, cache),
        render.router_deployment(spec, "s", "ns", "u", cache),
    ]:
        pod = dep["spec"]["template"]["spec"]
        assert {v["name"]: v for v in pod["volumes"]}["model"] == volume
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
        assert mount["readOnly"] is True  # only the init container writes
        init_mount = next(m for m in pod["initContainers"][0]["volumeMounts"] if m["name"] == "model")
        assert not init_mount.get("readOnly")


def test_the_cache_applies_to_hf_sources_only():
    spec = InferenceServiceSpec.model_validate(
        {"model": {"source": {"pvc": {"claimName": "w"}}, "servedName": "m"}}
    )
    pod = render.worker_deployment(spec, "s", "ns", "u", "decode", 1, ModelCache(host_path="/c"))["spec"][
        "template"
    ]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["model"]["persistentVolumeClaim"]["claimName"] == "w"


def test_model_cache_settings_are_checked():
    from tandem.operator.model.cache import ENV_CLAIM, ENV_HOST_PATH, from_env

    assert from_env({}) is None
    assert from_env({ENV_HOST_PATH: "/c"}) == ModelCache(host_path="/c")
    with pytest.raises(ValueError, match="not both"):
        from_env({ENV_HOST_PATH: "/c", ENV_CLAIM: "x"})
    with pytest.raises(ValueError, match="absolute"):
        from_env({ENV_HOST_PATH: "c"})


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_mode_auto_routes_both_phases_to_pods_relabelled_colocated():
    """A pod of either Deployment relabelled colocated is behind a headless Service the router resolves as its
    colocated pool, leaves the prefill and decode Services, and keeps its NetworkPolicy (by its pool label):
    the router, and either pool's pods, reach its gRPC port."""
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "m"},
            "mode": "auto",
            "roleFlip": True,
            "autoscaling": {"enabled": True},
        }
    )
    out = render.children(spec, "s", "ns", "u", {"prefill": 1, "decode": 1})
    services = {m["metadata"]["name"]: m for m in out if m["kind"] == "Service"}
    assert sorted(services) == ["s-colocated", "s-decode", "s-prefill", "s-router"]
    assert not any(m["kind"] == "Deployment" and m["metadata"]["name"] == "s-colocated" for m in out)
    colocated = services["s-colocated"]["spec"]
    assert colocated["clusterIP"] == "None"
    args = _by(out, "Deployment", "s-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    for pool in ("prefill", "decode", "colocated"):
        assert f"dns:///s-{pool}.ns.svc:{names.GRPC_PORT}" in args[args.index(f"--{pool}") + 1]
    assert args[args.index("--mode") + 1] == "auto"
    policies = [m for m in out if m["kind"] == "NetworkPolicy"]
    router_pod = {names.LABEL_SERVICE: "s", names.LABEL_POOL: "router"}
    for home in ("prefill", "decode"):
        template = _by(out, "Deployment", f"s-{home}")["spec"]["template"]
        assert names.LABEL_ROLE in template["metadata"]["labels"]  # the label a flip moves
        pod = {**template["metadata"]["labels"], names.LABEL_ROLE: "colocated"}
        assert _labels_match(colocated["selector"], pod)
        assert not _labels_match(services["s-prefill"]["spec"]["selector"], pod)
        assert not _labels_match(services["s-decode"]["spec"]["selector"], pod)
        (policy,) = [p for p in policies if _labels_match(p["spec"]["podSelector"]["matchLabels"], pod)]
        grpc = next(
            r
            for r in policy["spec"]["ingress"]
            if r["ports"] == [{"protocol": "TCP", "port": names.GRPC_PORT}]
        )
        senders = [f["podSelector"]["matchLabels"] for f in grpc["from"]]
        assert router_pod in senders  # both phases come from the router
        assert all({names.LABEL_SERVICE: "s", names.LABEL_POOL: h} in senders for h in ("prefill", "decode"))


def test_a_fixed_shape_renders_no_colocated_service_beside_its_pools(gpu_spec):
    out = render.children(gpu_spec, "llama", "ml", "uid-1", {"prefill": 1, "decode": 3})
    assert not any(m["kind"] == "Service" and m["metadata"]["name"] == "llama-colocated" for m in out)
