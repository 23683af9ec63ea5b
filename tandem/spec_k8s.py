"""What the CRD checks of the Kubernetes objects a spec passes through as dicts (volumes, env, tolerations):
their schemas, in Kubernetes' spelling, for the spec's fields that carry them."""

from __future__ import annotations

from typing import Any

from tandem.spec_base import cel

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# an optional DNS-subdomain prefix and a slash, then the name
LABEL_KEY = (
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
ENV_NAME = "^[ -<>-~]+$"  # printable ASCII but '='
QUANTITY = cel("isQuantity(self)", "must be a quantity such as 500m, 2 or 8Gi")


def passthrough(description: str) -> dict[str, Any]:
    """An object kept as written (a Kubernetes type the operator hands on)."""
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description}


def _string(description: str, **constraints: Any) -> dict[str, Any]:
    return {"type": "string", **constraints, "description": description}


_VOLUME_SOURCES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)
_SOURCE_TYPES = (
    "ConfigMap",
    "Secret",
    "EmptyDir",
    "PersistentVolumeClaim",
    "Projected",
    "DownwardAPI",
    "CSI",
    "Ephemeral",
)

VOLUME: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "x-kubernetes-validations": [
        cel(
            f"[{', '.join(f'has(self.{s})' for s in _VOLUME_SOURCES)}].filter(x, x).size() == 1",
            "a podTemplate volume is exactly one of configMap, secret, emptyDir, persistentVolumeClaim, "
            "projected, downwardAPI, csi or ephemeral (the restricted Pod Security Standard allows no other)",
        ),
        cel(
            "!(self.name in ['model', 'tls', 'api-keys', 'scratch', 'dshm'])",
            "podTemplate volume names model, tls, api-keys, scratch and dshm are the operator's",
        ),
    ],
    "properties": {
        "name": _string("The volume's name.", minLength=1, maxLength=63),
        **{
            s: passthrough(f"Kubernetes {t}VolumeSource.")
            for s, t in zip(_VOLUME_SOURCES, _SOURCE_TYPES, strict=True)
        },
    },
}

_ONE_VALUE = cel(
    "!(has(self.value) && has(self.valueFrom))", "an env entry sets value or valueFrom, not both"
)

ENV: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "x-kubernetes-validations": [_ONE_VALUE],
    "properties": {
        "name": _string("Variable name (printable ASCII, no '=').", minLength=1, pattern=ENV_NAME),
        "value": _string('Always a string; quote numbers and booleans ("8", "true").'),
        "valueFrom": passthrough(
            "Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."
        ),
    },
}

OVERLAY_ENV: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "x-kubernetes-validations": [
        _ONE_VALUE,
        cel("!self.name.startsWith('TANDEM_')", "podTemplate env names starting TANDEM_ are the operator's"),
    ],
    "properties": {
        "name": _string("Variable name (printable ASCII, no '=').", minLength=1, pattern=ENV_NAME),
        "value": _string("The value (a string)."),
        "valueFrom": passthrough("Kubernetes EnvVarSource."),
    },
}

TOLERATION: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-validations": [
        cel(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists matches any value: leave value out",
        ),
        cel(
            "has(self.key) && self.key != '' || has(self.operator) && self.operator == 'Exists'",
            "a toleration without a key must have operator Exists",
        ),
        cel(
            "!has(self.tolerationSeconds) || has(self.effect) && self.effect == 'NoExecute'",
            "tolerationSeconds needs effect NoExecute",
        ),
    ],
    "properties": {
        "key": _string(
            "Taint key to match; empty with operator Exists matches every taint.", pattern=f"^({LABEL_KEY})?$"
        ),
        "operator": _string(
            "Exists (any value) or Equal (the value below); default Equal.", enum=["Exists", "Equal"]
        ),
        "value": _string("Taint value to match with operator Equal.", maxLength=63),
        "effect": _string(
            "Taint effect to match (NoSchedule, PreferNoSchedule, NoExecute); empty: all.",
            enum=["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
        ),
        "tolerationSeconds": {
            "type": "integer",
            "format": "int64",
            "description": "With effect NoExecute: how long a pod stays on a node after the taint appears.",
        },
    },
}

LABEL_VALUE: dict[str, Any] = {
    "type": "string",
    "maxLength": 63,
    "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
# CEL string literals take backslash escapes, so the regex's `\.` is written `\\.` inside the rule.
LABEL_KEYS = cel(
    f"self.all(k, k.matches('^{LABEL_KEY.replace(chr(92), chr(92) * 2)}$'))",
    "nodeSelector keys must be label keys such as nvidia.com/gpu.present",
)
