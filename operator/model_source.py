"""Where a pod finds the model weights (`spec.model.source`): the path inside the container, the volume that
holds them and the init container that fetches them from a model image or the Hugging Face Hub."""

from __future__ import annotations

from typing import Any

from tandem.spec import InferenceServiceSpec

MODEL_MOUNT = "/models"


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
