"""Pure rendering: an InferenceService spec in, the Kubernetes manifests of its children out.

No I/O here. The handlers apply what these functions return; tests check them without a cluster.
Replica counts come from the TandemPool objects (see operator/pools.py for who writes them).
Pods receive everything they use through their template (arguments, environment, image, volumes), so a
pod-template change is exactly a change the pods consume: editing `autoscaling` or a pool's replica bounds
rewrites no template, and `slo` only the router's.
This module assembles the workloads; each concern they carry has its own module: names, labels and hashes
(manifest.py), the model's volume and fetch (model/source.py), certificates (pod_tls.py), the restricted
security profile (pod_security.py), probes and preStop (probes.py), NetworkPolicies (network_policy.py), the
Gateway API objects (gateway.py) and the user's pod overlay (pod_overlay.py).
"""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.launch import router_argv, termination_grace_seconds, worker_argv, worker_pools
from tandem.operator.manifests import gateway
from tandem.operator.manifests.manifest import (
    POOL_API_VERSION,
    POOL_KIND,
    Manifest,
    child_name,
    labels,
    object_metadata,
    selector,
)
from tandem.operator.manifests.network_policy import network_policy
from tandem.operator.manifests.pod_overlay import apply_overlay
from tandem.operator.manifests.pod_role import (
    follows_label,
    role_file_args,
    role_label_volumes,
    role_labels,
    role_selector,
)
from tandem.operator.manifests.pod_security import (
    POD_SECURITY,
    SCRATCH,
    restricted,
    scratch_volumes,
    shm_size,
)
from tandem.operator.manifests.pod_tls import tls_dir, tls_volumes
from tandem.operator.manifests.probes import router_probes, worker_lifecycle, worker_probes
from tandem.operator.model.cache import ModelCache
from tandem.operator.model.source import model_init_containers, model_path, model_volumes
from tandem.spec import InferenceServiceSpec, Mode

API_KEYS_MOUNT = "/etc/tandem/api-keys"


def router_endpoint(service: str, namespace: str) -> str:
    return f"http://{child_name(service, names.POOL_ROUTER)}.{namespace}.svc:{names.HTTP_PORT}"


def pool_spec(spec: InferenceServiceSpec, pool: str):
    """The PoolSpec that sizes a pool; the colocated pool uses spec.decode."""
    return spec.prefill if pool == names.POOL_PREFILL else spec.decode


# --- workloads: arguments, containers, pod templates, Deployments and Services ---------------------


def worker_args(spec: InferenceServiceSpec, service: str, pool: str) -> list[str]:
    """`tandem worker` arguments for a pool's pods (the same builder `tandem up` uses)."""
    return worker_argv(
        spec,
        service,
        pool,
        model_path(spec),
        worker_id=None,
        tls_dir=tls_dir(spec, pool),
        health_port=names.HEALTH_PORT,
    ) + role_file_args(spec, pool)


def routed_pools(spec: InferenceServiceSpec) -> list[str]:
    """The roles the router finds workers of, each through its headless Service: the pools, and in mode auto
    the colocated role too (pods of either Deployment relabelled colocated; it has no Deployment of its
    own)."""
    return [*worker_pools(spec), names.POOL_COLOCATED] if spec.mode is Mode.auto else worker_pools(spec)


def router_args(spec: InferenceServiceSpec, service: str, namespace: str) -> list[str]:
    """`tandem router` arguments: each pool found through its headless Service, re-resolved as pods change."""
    pools = {
        pool: [f"dns:///{child_name(service, pool)}.{namespace}.svc:{names.GRPC_PORT}"]
        for pool in routed_pools(spec)
    }
    keys = spec.security.api_keys
    keys_file = None
    if keys is not None:  # the mounted Secret's key, else a file the image carries
        keys_file = f"{API_KEYS_MOUNT}/{keys.key}" if keys.secret_name else keys.file
    return router_argv(
        spec,
        service,
        model_path(spec),
        pools,
        metrics_port=names.METRICS_PORT,
        api_keys_file=keys_file,
        tls_dir=tls_dir(spec, names.POOL_ROUTER),
    )


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


def _pod_template(
    service: str,
    pool: str,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    init_containers: list[dict[str, Any]],
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
    affinity: dict[str, Any] | None,
    shm: str | None = None,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "securityContext": dict(POD_SECURITY),
        "automountServiceAccountToken": False,  # no tandem process talks to the API server from a pod
        "containers": [restricted(container, shm is not None)],
        "volumes": [*volumes, *scratch_volumes(shm)],
    }
    if init_containers:
        home = [
            {"name": "HOME", "value": SCRATCH},
            {"name": "HF_HOME", "value": f"{SCRATCH}/hf"},
        ]  # downloads
        pod_spec["initContainers"] = [
            restricted({**c, "env": [*c.get("env", []), *home]}, shm=False) for c in init_containers
        ]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = list(tolerations)
    if affinity:
        pod_spec["affinity"] = dict(affinity)
    return {
        "metadata": {
            "labels": {**labels(service, pool), **role_labels(pool)},  # the starting role; a flip moves it
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(names.METRICS_PORT),
            },
        },
        "spec": pod_spec,
    }


def _deployment(
    name: str, namespace: str, service: str, uid: str, pool: str, replicas: int, template: dict[str, Any]
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(name, namespace, service, uid, pool),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(service, pool)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": template,
        },
    }


def worker_deployment(
    spec: InferenceServiceSpec,
    service: str,
    namespace: str,
    uid: str,
    pool: str,
    replicas: int,
    model_cache: ModelCache | None = None,
) -> Manifest:
    ps = pool_spec(spec, pool)
    mounts, volumes = model_volumes(spec, model_cache, namespace)
    tls_mounts, tls_vols = tls_volumes(spec, service, pool)
    role_mounts, role_vols = role_label_volumes(spec, pool)
    mounts, volumes = mounts + tls_mounts + role_mounts, volumes + tls_vols + role_vols
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
    template = apply_overlay(
        _pod_template(
            service,
            pool,
            container,
            volumes,
            model_init_containers(spec),
            ps.node_selector,
            ps.tolerations,
            ps.affinity,
            shm_size(pool, flips=follows_label(spec, pool)),
        ),
        ps.pod_template,
    )
    # the longest generation the spec allows must finish inside the grace period
    template["spec"]["terminationGracePeriodSeconds"] = termination_grace_seconds(spec)
    return _deployment(child_name(service, pool), namespace, service, uid, pool, replicas, template)


def router_deployment(
    spec: InferenceServiceSpec, service: str, namespace: str, uid: str, model_cache: ModelCache | None = None
) -> Manifest:
    pool = names.POOL_ROUTER
    r = spec.router
    mounts, volumes = model_volumes(spec, model_cache, namespace)  # the router reads the tokenizer
    tls_mounts, tls_vols = tls_volumes(spec, service, pool)
    role_mounts, role_vols = role_label_volumes(spec, pool)
    mounts, volumes = mounts + tls_mounts + role_mounts, volumes + tls_vols + role_vols
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
    template = apply_overlay(
        _pod_template(
            service, pool, container, volumes, model_init_containers(spec, "tokenizer"), {}, [], None
        ),
        r.pod_template,
    )
    return _deployment(child_name(service, pool), namespace, service, uid, pool, r.replicas, template)


def worker_service(service: str, namespace: str, uid: str, pool: str, by_role: bool = False) -> Manifest:
    """Headless, so the router sees every worker pod through DNS; `by_role` (spec.roleFlip): the pods whose
    current role is the pool's, from either Deployment."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {
            "clusterIP": "None",
            "selector": role_selector(service, pool) if by_role else selector(service, pool),
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
        "metadata": object_metadata(child_name(service, pool), namespace, service, uid, pool),
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
        "metadata": object_metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(service, pool)}},
    }


def inference_pool(service: str, namespace: str, uid: str, pool: str, replicas: int) -> Manifest:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": object_metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {"service": service, "pool": pool, "replicas": replicas},
    }


def children(
    spec: InferenceServiceSpec,
    service: str,
    namespace: str,
    uid: str,
    pool_replicas: dict[str, int],
    model_cache: ModelCache | None = None,
    operator_peer: dict[str, Any] | None = None,
) -> list[Manifest]:
    """Every child but the TandemPools, in apply order. pool_replicas: pool -> desired workers;
    operator_peer: the operator's pods, admitted to the metrics ports."""
    out: list[Manifest] = []
    for pool in worker_pools(spec):
        out.append(worker_deployment(spec, service, namespace, uid, pool, pool_replicas[pool], model_cache))
        out.append(worker_service(service, namespace, uid, pool, by_role=follows_label(spec, pool)))
        out.append(pod_disruption_budget(service, namespace, uid, pool))
    for pool in routed_pools(spec)[len(worker_pools(spec)) :]:  # mode auto: the colocated role, by label only
        out.append(worker_service(service, namespace, uid, pool, by_role=True))
    out.append(router_deployment(spec, service, namespace, uid, model_cache))
    out.append(router_service(service, namespace, uid))
    if spec.security.network_policy.enabled:
        out += [
            network_policy(spec, service, namespace, uid, p, operator_peer)
            for p in [*worker_pools(spec), names.POOL_ROUTER]
        ]
    if spec.gateway is not None:
        meta = object_metadata(
            child_name(service, names.POOL_ROUTER), namespace, service, uid, names.POOL_ROUTER
        )
        out.append(gateway.inference_pool(spec.gateway, meta, selector(service, names.POOL_ROUTER)))
        out.append(gateway.http_route(spec.gateway, meta, spec.model.served_name))
    return out
