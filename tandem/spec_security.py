"""`spec.security`: router API keys, mutual TLS between the processes, and the pools' NetworkPolicies."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from tandem.spec_base import Spec, cel, rules

API_KEYS_NEED_A_SOURCE = "security.apiKeys needs secretName (Kubernetes) or file (local)"
TLS_OFF_TAKES_NO_SOURCE = "security.tls: mode off takes no secretName or dir"


class ApiKeysSpec(Spec):
    """Router API keys (`Authorization: Bearer`), one per line: the `key` of Secret `secretName` on
    Kubernetes, or the file `file` locally. Probes stay open; /metrics too unless `protectMetrics`."""

    model_config = ConfigDict(
        json_schema_extra=rules(cel("has(self.secretName) || has(self.file)", API_KEYS_NEED_A_SOURCE))
    )

    secret_name: str | None = Field(default=None, min_length=1)
    """Secret holding the keys, one per line, mounted into the router pods."""
    key: str = Field(default="api-keys", min_length=1)
    """Key of the keys file in the Secret."""
    file: str | None = Field(default=None, min_length=1)
    """A local keys file (tandem up only)."""
    protect_metrics: bool = False
    """Require a key on /metrics too."""

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeysSpec:
        if not (self.secret_name or self.file):
            raise ValueError(API_KEYS_NEED_A_SOURCE)
        return self


class TlsMode(StrEnum):
    auto = "auto"  # mutual TLS with per-role certificates: issued by the operator or `tandem up` unless given
    off = "off"  # plaintext gRPC: any pod that reaches a worker port may call it (a Warning says so)


class TlsSpec(Spec):
    """Mutual TLS on every gRPC hop (router to workers, prefill to decode), on unless `mode: off`. Each
    process has its role's certificate (tandem.identity): the operator issues them into a Secret per service
    and `tandem up` under its run directory, unless `secretName` names cert-manager-style Secrets
    `<secretName>-<role>` (tls.crt, tls.key, ca.crt) or, locally, `dir` holds folders `<dir>/<role>/`.
    `tls: off` is short for `tls: {mode: off}`."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.mode != 'off' || (!has(self.secretName) && !has(self.dir))",
                TLS_OFF_TAKES_NO_SOURCE,
                ".mode",
            )
        )
    )

    mode: TlsMode = TlsMode.auto
    """auto: mutual TLS, certificates issued by the operator unless secretName names them; off: plaintext gRPC
    (a Warning Event says so)."""
    secret_name: str | None = Field(default=None, min_length=1)
    """Prefix of cert-manager-style Secrets <secretName>-<role> (tls.crt, tls.key, ca.crt; role router,
    prefill, decode or colocated) used instead of the operator's own."""
    dir: str | None = Field(default=None, min_length=1)
    """A local folder with one folder per role holding tls.crt, tls.key and ca.crt (tandem up only)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if value is False or value == "off":  # YAML reads an unquoted `off` as false
            return {"mode": "off"}
        if value is None or value is True or value == "on":  # null: the default, on
            return {}
        return value

    @model_validator(mode="after")
    def _sources_need_tls(self) -> TlsSpec:
        if self.mode is TlsMode.off and (self.secret_name or self.dir):
            raise ValueError(TLS_OFF_TAKES_NO_SOURCE)
        return self

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.off


PROMETHEUS_PEER: dict[str, Any] = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


class NetworkPolicySpec(Spec):
    """One NetworkPolicy per pool: clients to the router, the router to the workers, prefill to decode,
    `metricsFrom` (NetworkPolicyPeers; default: Prometheus pods in any namespace) to the metrics ports."""

    enabled: bool = True
    """Render the NetworkPolicies."""
    metrics_from: list[dict[str, Any]] = Field(default_factory=lambda: [dict(PROMETHEUS_PEER)])
    """NetworkPolicyPeers allowed to scrape the metrics ports (default: Prometheus pods in any namespace)."""


class SecuritySpec(Spec):
    api_keys: ApiKeysSpec | None = None
    """Require Authorization: Bearer API keys at the router (probes stay open)."""
    tls: TlsSpec = Field(default_factory=TlsSpec)
    """Mutual TLS on every gRPC hop (router to workers, prefill to decode), with per-role certificates the
    operator issues; on unless mode is off."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """One NetworkPolicy per pool: clients to the router, the router to the workers, prefill to decode."""
