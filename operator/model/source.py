"""Where a pod finds the model weights (`spec.model.source`): the path inside the container, the volume that
holds them (for a Hugging Face source, the chart's shared cache when there is one) and the init container that
fetches them from a model image or the Hugging Face Hub."""

from __future__ import annotations

from typing import Any

from tandem.operator.model.cache import ModelCache
from tandem.spec import InferenceServiceSpec

MODEL_MOUNT = "/models"


def model_path(spec: InferenceServiceSpec) -> str:
    """Where the weights are inside the worker container."""
    src = spec.model.source
    if src.path:
        return src.path
    if src.pvc:
        return f"{MODEL_MOUNT}/{src.pvc.path}".rstrip("/") if src.pvc.path else MODEL_MOUNT
    if src.hugging_face:  # one folder per revision: a shared cache may hold several
        hf = src.hugging_face
        return f"{MODEL_MOUNT}/{hf.repo_id}/{hf.revision.replace('/', '--')}"
    return MODEL_MOUNT  # hostPath and image are mounted or copied to MODEL_MOUNT


def model_volume(
    spec: InferenceServiceSpec, cache: ModelCache | None = None, namespace: str = ""
) -> dict[str, Any] | None:
    """The `model` volume; a Hugging Face source downloads into the chart's shared cache when there is one."""
    src = spec.model.source
    if src.hugging_face and cache is not None:
        return cache.volume(namespace)
    if src.pvc:
        return {"name": "model", "persistentVolumeClaim": {"claimName": src.pvc.claim_name, "readOnly": True}}
    if src.host_path:
        return {"name": "model", "hostPath": {"path": src.host_path, "type": "Directory"}}
    if src.image or src.hugging_face:
        return {"name": "model", "emptyDir": {}}
    return None


def model_volumes(
    spec: InferenceServiceSpec, cache: ModelCache | None = None, namespace: str = ""
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volume mounts and volumes for the model weights (none when they are baked into the image); only an
    init container writes them."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mv = model_volume(spec, cache, namespace)
    if mv:
        volumes.append(mv)
        src = spec.model.source
        mounts.append(
            {
                "name": "model",
                "mountPath": MODEL_MOUNT,
                "readOnly": bool(src.pvc or src.host_path or src.hugging_face),
            }
        )
    return mounts, volumes


def model_init_containers(spec: InferenceServiceSpec, part: str = "weights") -> list[dict[str, Any]]:
    """Init containers that fetch the weights: copied out of a model image, or downloaded from the Hub
    (`tandem fetch-model`: only the files `part` needs, once per shared folder; the router's part is the
    config and the tokenizer). Its termination message is the outcome the operator reads (model_cached.py)."""
    src = spec.model.source
    mount = [{"name": "model", "mountPath": MODEL_MOUNT}]
    if src.image:
        return [
            {
                "name": "fetch-model",
                "image": src.image,
                "command": ["sh", "-c", f"cp -a /model/. {MODEL_MOUNT}/"],
                "volumeMounts": mount,
            }
        ]
    if src.hugging_face:
        hf = src.hugging_face
        env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
        if hf.token_secret_ref:
            env.append(
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {
                        "secretKeyRef": {"name": hf.token_secret_ref.name, "key": hf.token_secret_ref.key}
                    },
                }
            )
        return [
            {
                "name": "fetch-model",
                "image": spec.image,
                "command": [
                    "tandem",
                    "fetch-model",
                    hf.repo_id,
                    "--revision",
                    hf.revision,
                    "--dir",
                    model_path(spec),
                    "--part",
                    part,
                ],
                "env": env,
                "volumeMounts": mount,
            }
        ]
    return []
