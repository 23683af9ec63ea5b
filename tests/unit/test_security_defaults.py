"""Cluster-wide security defaults: applied where an InferenceService leaves a part unset, never over it."""

from __future__ import annotations

import pytest

from tandem.operator.manifests import render
from tandem.operator.manifests.security_defaults import ENV, from_env, parse, with_defaults
from tandem.spec import InferenceServiceSpec

DEFAULTS = parse('{"tls": {"secretName": "tandem-tls"}, "apiKeys": {"secretName": "tandem-keys"}}')


def _spec(**security) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, "security": security}
    )


def test_unset_parts_take_the_defaults_and_reach_the_pods():
    spec = with_defaults(_spec(), DEFAULTS)
    assert (
        spec.security.tls.secret_name == "tandem-tls" and spec.security.api_keys.secret_name == "tandem-keys"
    )
    args = render.router_deployment(spec, "s", "ns", "u")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-dir" in args and "--api-keys-file" in args


def test_what_a_service_sets_wins_and_null_opts_out():
    spec = with_defaults(_spec(tls={"secretName": "mine"}, apiKeys=None), DEFAULTS)
    assert spec.security.tls.secret_name == "mine" and spec.security.api_keys is None
    assert with_defaults(_spec(), None) == _spec()


def test_defaults_from_the_environment():
    assert from_env({}) is None and from_env({ENV: " "}) is None
    assert from_env({ENV: '{"tls": {"dir": "/certs"}}'}).tls.dir == "/certs"
    with pytest.raises(ValueError):
        from_env({ENV: '{"tls": {"mode": "off", "secretName": "x"}}'})  # plaintext has no certificates
