"""What the workers' and the router's pods share: the resources each requests, and the podTemplate overlay a
user adds to the pods the operator renders (Kubernetes only)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from tandem.spec_base import Spec, cel, rules
from tandem.spec_k8s import DNS_SUBDOMAIN, OVERLAY_ENV, QUANTITY, VOLUME


class Resources(Spec):
    gpus: int = Field(default=1, ge=0)
    cpu: str | None = Field(default=None, json_schema_extra=rules(QUANTITY))
    """CPU each pod requests, as a quantity (500m, 2)."""
    memory: str | None = Field(default=None, json_schema_extra=rules(QUANTITY))
    """Memory each pod requests and is limited to, as a quantity (8Gi)."""


TENSOR_PARALLEL_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
GPUS_POWER_OF_TWO = (
    "resources.gpus must be 0, 1 or a power of two up to 64: a worker splits the model across its "
    "GPUs (tensor parallel) by powers of two"
)


class WorkerResources(Resources):
    """A worker's GPUs: above one, the model is split across them (tensor parallel), by powers of two."""

    gpus: int = Field(
        default=1,
        ge=0,
        le=64,
        json_schema_extra=rules(cel(f"self in {list(TENSOR_PARALLEL_SIZES)}", GPUS_POWER_OF_TWO)),
    )
    """nvidia.com/gpu per worker pod (0: a CPU worker); above 1 the model is split across them (tensor
    parallel), so a power of two that divides the model's attention and KV heads."""

    @field_validator("gpus")
    @classmethod
    def _splits(cls, gpus: int) -> int:
        if gpus not in TENSOR_PARALLEL_SIZES:
            raise ValueError(f"{GPUS_POWER_OF_TWO}; got {gpus}")
        return gpus


class RouterResources(Resources):
    """The router needs no GPU unless asked: `router.resources: {cpu: "1"}` must not request one."""

    gpus: int = Field(default=0, ge=0)
    """nvidia.com/gpu per router pod; the router needs none."""


class LocalObjectRef(Spec):
    name: str = Field(min_length=1)
    """A docker-registry Secret's name."""


class VolumeMount(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(self.mountPath in ['/models', '/tmp', '/dev/shm']) && "
                "!self.mountPath.startsWith('/models/') && !self.mountPath.startsWith('/etc/tandem/')",
                "podTemplate mount paths /models, /tmp, /dev/shm and /etc/tandem/ are the operator's",
            )
        )
    )

    name: str = Field(min_length=1)
    """A podTemplate volume's name."""
    mount_path: str = Field(pattern="^/")
    """Where in the container (absolute)."""
    read_only: bool | None = None
    """Mount read-only."""
    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""


OVERLAY = (
    "Merged onto the pod template the operator renders for this pool: labels, annotations, image pull "
    "secrets, service account, priority class, extra volumes mounted into the main container, extra "
    "environment. Refused here where it would break the restricted Pod Security Standard or touch what the "
    "operator owns (its labels and annotations, volume names and mount paths, TANDEM_ variables)."
)


def no_key_prefix(field: str, prefixes: tuple[str, ...], why: str) -> dict[str, str]:
    """The CEL rule that keeps podTemplate.`field`'s keys off the `prefixes` the operator owns."""
    rule = " && ".join(f"!k.startsWith('{p}')" for p in prefixes)
    return cel(
        f"self.all(k, {rule})", f"podTemplate.{field} may not set {' or '.join(prefixes)} {field}: {why}"
    )


class PodTemplateOverlay(Spec):
    """What a user adds to a pool's pods (Kubernetes only); the CRD refuses what would break the restricted
    Pod Security Standard or the operator's own fields."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                "self.volumes.exists(v, v.name == m.name))",
                "podTemplate.volumeMounts must each name a volume of podTemplate.volumes",
                ".volumeMounts",
            )
        )
    )

    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=rules(
            no_key_prefix(
                "labels", ("serving.tandem.dev/", "app.kubernetes.io/"), "the operator's selectors use them"
            ),
            additionalProperties={"type": "string", "maxLength": 63},
        ),
    )
    """Extra pod labels."""
    annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=rules(
            no_key_prefix("annotations", ("serving.tandem.dev/", "prometheus.io/"), "the operator sets them")
        ),
    )
    """Extra pod annotations."""
    image_pull_secrets: list[LocalObjectRef] = Field(default_factory=list, max_length=16)
    """Secrets (in the InferenceService's namespace) to pull the images with."""
    service_account_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=253)
    """The pods' ServiceAccount (its token stays unmounted: automountServiceAccountToken is false; mount a
    projected token volume if the pod needs one)."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """The pods' PriorityClass."""
    volumes: list[dict[str, Any]] = Field(
        default_factory=list, max_length=32, json_schema_extra=rules(items=VOLUME)
    )
    """Extra volumes, of the kinds the restricted Pod Security Standard allows: configMap, secret, emptyDir,
    persistentVolumeClaim, projected, downwardAPI, csi or ephemeral (hostPath and the rest are refused)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=32)
    """Mounts of podTemplate.volumes into the pool's main container."""
    env: list[dict[str, Any]] = Field(
        default_factory=list, max_length=256, json_schema_extra=rules(items=OVERLAY_ENV)
    )
    """Extra environment variables of the pool's main container (TANDEM_ ones are the operator's)."""
