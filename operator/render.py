"""Pure rendering: an InferenceService spec in, the Kubernetes manifests of its children out.

No I/O here. The handlers apply what these functions return; tests check them without a cluster.
Replica counts come from the TandemPool objects (see operator/pools.py for who writes them).
Pods receive everything they use through their template (arguments, environment, image, volumes), so a
pod-template change is exactly a change the pods consume: editing `autoscaling` or a pool's replica bounds
rewrites no template, and `slo` only the router's.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tandem import names
from tandem.identity import peer_name
from tandem.launch import (
    drain_timeout_seconds,
    router_argv,
    termination_grace_seconds,
    tls_argv,
    worker_argv,
    worker_pools,
)
from tandem.operator import gateway
from tandem.operator.pod_overlay import apply_overlay
from tandem.spec import API_GROUP, API_VERSION, KIND, InferenceServiceSpec

Manifest = dict[str, Any]

POOL_API_VERSION = f"{API_GROUP}/{API_VERSION}"
POOL_KIND = "TandemPool"
MANAGED_BY = "tandem-operator"
HASH_ANNOTATION = f"{API_GROUP}/rendered-hash"
MODEL_MOUNT = "/models"
API_KEYS_MOUNT = "/etc/tandem/api-keys"
TLS_MOUNT = "/etc/tandem/tls"  # tls.crt, tls.key, ca.crt of the pod's role


def child_name(service: str, pool: str) -> str:
    return f"{service}-{pool}"


def router_endpoint(service: str, namespace: str) -> str:
    return f"http://{child_name(service, names.POOL_ROUTER)}.{namespace}.svc:{names.HTTP_PORT}"


def pool_spec(spec: InferenceServiceSpec, pool: str):
    """The PoolSpec that sizes a pool; the colocated pool uses spec.decode."""
    return spec.prefill if pool == names.POOL_PREFILL else spec.decode


def labels(service: str, pool: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/instance": service,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        names.LABEL_SERVICE: service,
    }
    if pool:
        out[names.LABEL_POOL] = pool
        out[names.LABEL_COMPONENT] = pool
    return out


def selector(service: str, pool: str) -> dict[str, str]:
    return {names.LABEL_SERVICE: service, names.LABEL_POOL: pool}


def selector_string(service: str, pool: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(service, pool).items())


def owner_reference(service: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": KIND,
        "name": service,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, namespace: str, service: str, uid: str, pool: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(service, pool),
        "ownerReferences": [owner_reference(service, uid)],
    }


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# --- model source ---------------------------------------------------------------------------------

def model_path(spec: InferenceServiceSpec) -> str:
    """Where the weights are inside the worker container."""
    src = spec.model.source
    if src.path:
        return src.path
    if src.pvc:
        return f"{MODEL_MOUNT}/{src.pvc.path}".rstrip("/") if src.pvc.path else MODEL_MOUNT
    if src.hugging_face:
        return f"{MODEL_MOUNT}/{src.hugging_face.repo_id}"
    return MODEL_MOUNT  # hostPath and image are mounted or copied to MODEL_MOUNT


def model_volume(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    src = spec.model.source
    if src.pvc:
        return {"name": "model", "persistentVolumeClaim": {"claimName": src.pvc.claim_name, "readOnly": True}}
    if src.host_path:
        return {"name": "model", "hostPath": {"path": src.host_path, "type": "Directory"}}
    if src.image or src.hugging_face:
        return {"name": "model", "emptyDir": {}}
    return None


def model_init_containers(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """Init containers that fetch the weights: copied out of a model image, or downloaded from the Hub."""
    src = spec.model.source
    mount = [{"name": "model", "mountPath": MODEL_MOUNT}]
    if src.image:
        return [{
            "name": "fetch-model",
            "image": src.image,
            "command": ["sh", "-c", f"cp -a /model/. {MODEL_MOUNT}/"],
            "volumeMounts": mount,
        }]
    if src.hugging_face:
        hf = src.hugging_face
        env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
        if hf.token_secret_ref:
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": hf.token_secret_ref.name, "key": hf.token_secret_ref.key}}})
        return [{
            "name": "fetch-model",
            "image": spec.image,
            "command": ["huggingface-cli", "download", hf.repo_id, "--revision", hf.revision,
                        "--local-dir", model_path(spec)],
            "env": env,
            "volumeMounts": mount,
        }]
    return []


# --- containers -------------------------------------------------------------------------------------

def tls_secret_name(service: str) -> str:
    """The Secret the operator issues a service's CA and per-role certificates into."""
    return f"{service}-tls"


TLS_ROLES = (names.POOL_PREFILL, names.POOL_DECODE, names.POOL_COLOCATED, names.POOL_ROUTER)


def tls_secret(service: str, namespace: str, uid: str, data: dict[str, str]) -> Manifest:
    """The Secret of a service's certificates (certs.secret_data), owned by the InferenceService."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(tls_secret_name(service), namespace, service, uid), "stringData": data}


def tls_dir(spec: InferenceServiceSpec, pool: str) -> str | None:
    """Where a pool's pods find their role's mutual-TLS files: the mounted Secret, else a per-role folder the
    image carries; None with `security.tls.mode: off`."""
    tls = spec.security.tls
    if not tls.enabled:
        return None
    return f"{tls.dir}/{pool}" if tls.dir else TLS_MOUNT


def tls_volumes(spec: InferenceServiceSpec, service: str, pool: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The role's certificate only: the pool's own Secret `<secretName>-<pool>`, or its keys of the
    operator's per-service Secret (a prefill pod never holds the router's key)."""
    tls = spec.security.tls
    if not tls.enabled or tls.dir:
        return [], []
    mount = {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}
    if tls.secret_name:
        source: dict[str, Any] = {"secretName": f"{tls.secret_name}-{pool}"}
    else:
        source = {"secretName": tls_secret_name(service), "items": [
            {"key": f"{pool}.crt", "path": "tls.crt"}, {"key": f"{pool}.key", "path": "tls.key"},
            {"key": "ca.crt", "path": "ca.crt"}]}  # fmt: skip
    return [mount], [{"name": "tls", "secret": {**source, "defaultMode": 0o440}}]


def worker_args(spec: InferenceServiceSpec, service: str, pool: str) -> list[str]:
    """`tandem worker` arguments for a pool's pods (the same builder `tandem up` uses)."""
    return worker_argv(
        spec, service, pool, model_path(spec), worker_id=None, tls_dir=tls_dir(spec, pool), health_port=names.HEALTH_PORT
    )  # fmt: skip


def router_args(spec: InferenceServiceSpec, service: str, namespace: str) -> list[str]:
    """`tandem router` arguments: each pool found through its headless Service, re-resolved as pods change."""
    pools = {
        pool: [f"dns:///{child_name(service, pool)}.{namespace}.svc:{names.GRPC_PORT}"] for pool in worker_pools(spec)
    }
    keys = spec.security.api_keys
    keys_file = None
    if keys is not None:  # the mounted Secret's key, else a file the image carries
        keys_file = f"{API_KEYS_MOUNT}/{keys.key}" if keys.secret_name else keys.file
    return router_argv(
        spec, service, model_path(spec), pools, metrics_port=names.METRICS_PORT, api_keys_file=keys_file,
        tls_dir=tls_dir(spec, names.POOL_ROUTER),
    )  # fmt: skip


def resources(gpus: int, cpu: str | None, memory: str | None) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
        limits["memory"] = memory
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _ports(main_name: str, main_port: int) -> list[dict[str, Any]]:
    return [
        {"name": main_name, "containerPort": main_port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": names.METRICS_PORT, "protocol": "TCP"},
    ]


PROBE_TIMEOUT_S = {"startup": 5, "readiness": 3, "liveness": 5}  # the health server answers in milliseconds


def worker_probes() -> dict[str, Any]:
    """gRPC health probes against the plaintext health-only port, served by its own server and threads, so
    that no load on the gRPC port (token streams, KV pushes) can delay them past their timeouts."""
    grpc = {"grpc": {"port": names.HEALTH_PORT}}
    t = PROBE_TIMEOUT_S
    return {
        "startupProbe": {**grpc, "periodSeconds": 10, "failureThreshold": 60, "timeoutSeconds": t["startup"]},
        "readinessProbe": {**grpc, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": t["readiness"]},
        # A draining worker is NOT_SERVING on the empty service name; liveness asks for the one that stays up,
        # so the kubelet never restarts a worker that is finishing its requests. It fails when the engine
        # loop itself is broken or stuck (serve/health.py).
        "livenessProbe": {"grpc": {**grpc["grpc"], "service": names.WORKER_LIVENESS_SERVICE},
                          "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": t["liveness"]},
    }  # fmt: skip


def worker_lifecycle(spec: InferenceServiceSpec, service: str, pool: str) -> dict[str, Any]:
    """preStop: drain the worker (no new work, finish what it holds) before the kubelet sends SIGTERM; over
    loopback with the pod's own certificate, the one caller besides the operator a worker drains for."""
    tls = tls_argv(spec, tls_dir(spec, pool))
    drain = ["tandem", "drain", "--address", f"127.0.0.1:{names.GRPC_PORT}", "--wait",
             "--timeout", str(drain_timeout_seconds(spec)), *tls,
             *(["--tls-server-name", peer_name(pool, service)] if tls else [])]
    return {"preStop": {"exec": {"command": drain}}}


def router_probes() -> dict[str, Any]:
    """Readiness follows the worker pools (no healthy worker: out of the Service); liveness only the process,
    so a pool outage or a first rollout never restarts the router."""
    ready = {"httpGet": {"path": names.READINESS_PATH, "port": names.HTTP_PORT}}
    alive = {"httpGet": {"path": names.LIVENESS_PATH, "port": names.HTTP_PORT}}
    return {
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**alive, "periodSeconds": 10, "failureThreshold": 6},
    }


# --- the restricted Pod Security Standard ----------------------------------------------------------

RUN_AS = 1000  # uid and gid of every tandem container; the image must not need root
SCRATCH = "/tmp"  # the only writable path besides /dev/shm and the volumes: HOME and caches go here
SCRATCH_SIZE = "1Gi"
# A decode worker lends 4 staging rings of 64 MiB (serve/main.py); torch and the KV transport share /dev/shm.
SHM_SIZE = {names.POOL_DECODE: "320Mi", names.POOL_COLOCATED: "64Mi", names.POOL_PREFILL: "64Mi"}
POD_SECURITY = {
    "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip


def restricted(container: dict[str, Any], shm: bool) -> dict[str, Any]:
    """A container that passes the restricted Pod Security Standard on a read-only root filesystem."""
    mounts = [*container.get("volumeMounts", []), {"name": "scratch", "mountPath": SCRATCH}]
    if shm:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return {**container, "volumeMounts": mounts, "securityContext": dict(CONTAINER_SECURITY)}


def scratch_volumes(pool: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}}]
    if pool in SHM_SIZE:
        out.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE[pool]}})
    return out


def _pod_template(
    service: str, pool: str, container: dict[str, Any],
    volumes: list[dict[str, Any]], init_containers: list[dict[str, Any]],
    node_selector: dict[str, str], tolerations: list[dict[str, Any]], affinity: dict[str, Any] | None,
) -> dict[str, Any]:
    shm = pool in SHM_SIZE
    pod_spec: dict[str, Any] = {
        "securityContext": dict(POD_SECURITY),
        "automountServiceAccountToken": False,  # no tandem process talks to the API server from a pod
        "containers": [restricted(container, shm)],
        "volumes": [*volumes, *scratch_volumes(pool)],
    }
    if init_containers:
        home = [{"name": "HOME", "value": SCRATCH}, {"name": "HF_HOME", "value": f"{SCRATCH}/hf"}]  # downloads
        pod_spec["initContainers"] = [restricted({**c, "env": [*c.get("env", []), *home]}, shm=False)
                                      for c in init_containers]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = list(tolerations)
    if affinity:
        pod_spec["affinity"] = dict(affinity)
    return {
        "metadata": {
            "labels": labels(service, pool),
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(names.METRICS_PORT),
            },
        },
        "spec": pod_spec,
    }


def _deployment(name: str, namespace: str, service: str, uid: str, pool: str, replicas: int,
                template: dict[str, Any]) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, namespace, service, uid, pool),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(service, pool)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": template,
        },
    }


def worker_deployment(spec: InferenceServiceSpec, service: str, namespace: str, uid: str,
                      pool: str, replicas: int) -> Manifest:
    ps = pool_spec(spec, pool)
    mounts, volumes = model_volumes(spec)
    tls_mounts, tls_vols = tls_volumes(spec, service, pool)
    mounts, volumes = mounts + tls_mounts, volumes + tls_vols
    container = {
        "name": "worker",
        "image": spec.image,
        "command": ["tandem"],
        "args": worker_args(spec, service, pool),
        "ports": _ports("grpc", names.GRPC_PORT),
        **({"env": list(ps.env)} if ps.env else {}),  # pool and service travel in the arguments
        "resources": resources(ps.resources.gpus, ps.resources.cpu, ps.resources.memory),
        **({"volumeMounts": mounts} if mounts else {}),
        "lifecycle": worker_lifecycle(spec, service, pool),
        **worker_probes(),
    }
    template = apply_overlay(_pod_template(service, pool, container, volumes, model_init_containers(spec),
                                           ps.node_selector, ps.tolerations, ps.affinity), ps.pod_template)
    # the longest generation the spec allows must finish inside the grace period
    template["spec"]["terminationGracePeriodSeconds"] = termination_grace_seconds(spec)
    return _deployment(child_name(service, pool), namespace, service, uid, pool, replicas, template)


def model_volumes(spec: InferenceServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volume mounts and volumes for the model weights (none when they are baked into the image)."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mv = model_volume(spec)
    if mv:
        volumes.append(mv)
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT,
                       "readOnly": bool(spec.model.source.pvc or spec.model.source.host_path)})
    return mounts, volumes


def router_deployment(spec: InferenceServiceSpec, service: str, namespace: str, uid: str) -> Manifest:
    pool = names.POOL_ROUTER
    r = spec.router
    mounts, volumes = model_volumes(spec)  # the router reads the tokenizer
    tls_mounts, tls_vols = tls_volumes(spec, service, pool)
    mounts, volumes = mounts + tls_mounts, volumes + tls_vols
    keys = spec.security.api_keys
    if keys is not None and keys.secret_name:
        volumes = [*volumes, {"name": "api-keys", "secret": {"secretName": keys.secret_name}}]
        mounts = [*mounts, {"name": "api-keys", "mountPath": API_KEYS_MOUNT, "readOnly": True}]
    container = {
        "name": "router",
        "image": spec.image,
        "command": ["tandem"],
        "args": router_args(spec, service, namespace),
        "ports": _ports("http", names.HTTP_PORT),
        "resources": resources(r.resources.gpus, r.resources.cpu, r.resources.memory),
        **({"volumeMounts": mounts} if mounts else {}),
        **router_probes(),
    }
    template = apply_overlay(_pod_template(service, pool, container, volumes, model_init_containers(spec), {}, [],
                                           None), r.pod_template)
    return _deployment(child_name(service, pool), namespace, service, uid, pool, r.replicas, template)


def worker_service(service: str, namespace: str, uid: str, pool: str) -> Manifest:
    """Headless, so the router sees every worker pod through DNS."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {
            "clusterIP": "None",
            "selector": selector(service, pool),
            "ports": [
                {"name": "grpc", "port": names.GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": names.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def router_service(service: str, namespace: str, uid: str) -> Manifest:
    pool = names.POOL_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(service, pool),
            "ports": [
                {"name": "http", "port": names.HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": names.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def pod_disruption_budget(service: str, namespace: str, uid: str, pool: str) -> Manifest:
    """At most one worker of a pool down for voluntary disruptions (drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(service, pool)}},
    }


def inference_pool(service: str, namespace: str, uid: str, pool: str, replicas: int) -> Manifest:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": _metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {"service": service, "pool": pool, "replicas": replicas},
    }


def network_policy(spec: InferenceServiceSpec, service: str, namespace: str, uid: str, pool: str) -> Manifest:
    """What may reach a pool's pods: clients the router's HTTP port, the router (and, for decode, the
    prefill pool) the workers' gRPC port, `metricsFrom` the metrics port. Nothing else."""
    def port(n: int) -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": n}]

    def pods(p: str) -> dict[str, Any]:
        return {"podSelector": {"matchLabels": selector(service, p)}}

    ingress: list[dict[str, Any]]
    if pool == names.POOL_ROUTER:
        ingress = [{"ports": port(names.HTTP_PORT)}]  # the API, from anywhere (API keys guard it)
    else:
        senders = [names.POOL_ROUTER] + ([names.POOL_PREFILL] if pool == names.POOL_DECODE else [])
        ingress = [{"from": [pods(p) for p in senders], "ports": port(names.GRPC_PORT)}]
    metrics_from = spec.security.network_policy.metrics_from
    ingress.append({"from": [dict(peer) for peer in metrics_from], "ports": port(names.METRICS_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {"podSelector": {"matchLabels": selector(service, pool)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }


def children(spec: InferenceServiceSpec, service: str, namespace: str, uid: str,
             pool_replicas: dict[str, int]) -> list[Manifest]:
    """Every child but the TandemPools, in apply order. pool_replicas: pool -> desired workers."""
    out: list[Manifest] = []
    for pool in worker_pools(spec):
        out.append(worker_deployment(spec, service, namespace, uid, pool, pool_replicas[pool]))
        out.append(worker_service(service, namespace, uid, pool))
        out.append(pod_disruption_budget(service, namespace, uid, pool))
    out.append(router_deployment(spec, service, namespace, uid))
    out.append(router_service(service, namespace, uid))
    if spec.security.network_policy.enabled:
        out += [network_policy(spec, service, namespace, uid, p) for p in [*worker_pools(spec), names.POOL_ROUTER]]
    if spec.gateway is not None:
        meta = _metadata(child_name(service, names.POOL_ROUTER), namespace, service, uid, names.POOL_ROUTER)
        out.append(gateway.inference_pool(spec.gateway, meta, selector(service, names.POOL_ROUTER)))
        out.append(gateway.http_route(spec.gateway, meta, spec.model.served_name))
    return out


def with_hash(manifest: Manifest) -> Manifest:
    """The manifest with a hash of itself in an annotation, so a changed render is seen without a deep diff."""
    digest = content_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), HASH_ANNOTATION: digest}
    return {**manifest, "metadata": meta}
