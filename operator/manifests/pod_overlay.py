"""Pure merge of a pool's `podTemplate` overlay onto the pod template the operator renders: what a user adds
(labels, annotations, pull secrets, service account, priority class, volumes and their mounts, env) goes
beside the operator's own, never over it (the CRD refuses overlaps; here the operator's keys win anyway)."""

from __future__ import annotations

from typing import Any

from tandem.spec_pods import PodTemplateOverlay


def apply_overlay(template: dict[str, Any], overlay: PodTemplateOverlay | None) -> dict[str, Any]:
    """The pod template with `overlay` merged in; the first container is the pool's main one."""
    if overlay is None:
        return template
    meta = dict(template["metadata"])
    meta["labels"] = {**overlay.labels, **meta.get("labels", {})}
    meta["annotations"] = {**overlay.annotations, **meta.get("annotations", {})}
    spec = dict(template["spec"])
    if overlay.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s.name} for s in overlay.image_pull_secrets]
    if overlay.service_account_name:
        spec["serviceAccountName"] = overlay.service_account_name
    if overlay.priority_class_name:
        spec["priorityClassName"] = overlay.priority_class_name
    ours = {v["name"] for v in spec.get("volumes", [])}
    spec["volumes"] = [*spec.get("volumes", []), *(v for v in overlay.volumes if v["name"] not in ours)]
    main, *rest = spec["containers"]
    main = dict(main)
    paths = {m["mountPath"] for m in main.get("volumeMounts", [])}
    mounts = [
        m.model_dump(by_alias=True, exclude_none=True)
        for m in overlay.volume_mounts
        if m.mount_path not in paths
    ]
    if mounts:
        main["volumeMounts"] = [*main.get("volumeMounts", []), *mounts]
    names = {e["name"] for e in main.get("env", [])}
    env = [e for e in overlay.env if e["name"] not in names]
    if env:
        main["env"] = [*main.get("env", []), *env]
    spec["containers"] = [main, *rest]
    return {**template, "metadata": meta, "spec": spec}
