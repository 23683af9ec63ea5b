"""Which Services and Gateways put a router outside the cluster, and when the keyless warning is sent."""

from __future__ import annotations

from tandem.operator.manifests.exposure import ExposureWatch, external_services, selects, warning
from tandem.spec import InferenceServiceSpec

ROUTER = {
    "serving.tandem.dev/service": "m",
    "serving.tandem.dev/pool": "router",
    "app.kubernetes.io/name": "tandem",
}


def _svc(name: str, selector: dict | None, type_: str = "ClusterIP", **spec) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"type": type_, **({"selector": selector} if selector else {}), **spec},
    }


def _spec(**extra) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, **extra}
    )


GATEWAY = {
    "gateway": {"parentRefs": [{"name": "public", "namespace": "edge"}], "endpointPickerRef": {"name": "epp"}}
}


def test_a_service_selects_the_router_only_with_a_selector_that_its_labels_satisfy():
    assert selects(
        _svc("a", {"app.kubernetes.io/name": "tandem"}), ROUTER
    )  # every tandem pod, the router too
    assert not selects(_svc("b", {"serving.tandem.dev/pool": "decode"}), ROUTER)
    assert not selects(_svc("c", None), ROUTER)  # no selector: endpoints by hand, none of ours


def test_only_load_balancers_node_ports_and_external_ips_that_select_the_router_count():
    services = [
        _svc(
            "m-router", {"serving.tandem.dev/service": "m", "serving.tandem.dev/pool": "router"}
        ),  # ours: ClusterIP
        _svc("public", {"serving.tandem.dev/pool": "router"}, "LoadBalancer"),
        _svc("debug", {"app.kubernetes.io/name": "tandem"}, "NodePort"),
        _svc("ips", {"serving.tandem.dev/service": "m"}, externalIPs=["203.0.113.7"]),
        _svc("other-lb", {"app": "web"}, "LoadBalancer"),
        _svc("headless", {"serving.tandem.dev/pool": "router"}, clusterIP="None"),
    ]
    assert external_services(services, ROUTER) == (
        "Service debug (NodePort)",
        "Service ips (externalIPs)",
        "Service public (LoadBalancer)",
    )


def test_the_warning_names_each_way_in_and_api_keys_silence_it():
    assert warning(_spec(), "ns", ()) is None
    msg = warning(_spec(**GATEWAY), "ns", ("Service public (LoadBalancer)",))
    assert msg is not None and "Service public (LoadBalancer), Gateway edge/public (spec.gateway)" in msg
    assert "spec.security.apiKeys" in msg
    keyed = _spec(**GATEWAY, security={"apiKeys": {"secretName": "m-keys"}})
    assert warning(keyed, "ns", ("Service public (LoadBalancer)",)) is None


def test_the_event_is_sent_when_the_exposure_starts_or_changes_not_at_every_resync():
    watch, key = ExposureWatch(), ("ns", "m", "uid-1")
    assert watch.needs_listing(key, fresh=False)  # never looked
    assert watch.to_send(key, (), None) is None
    assert not watch.needs_listing(key, fresh=False) and watch.needs_listing(key, fresh=True)
    assert (
        watch.to_send(key, ("Service public (LoadBalancer)",), "exposed via public") == "exposed via public"
    )
    assert watch.to_send(key, None, "exposed via public") is None  # same again: already said
    assert (
        watch.to_send(
            key, ("Service public (LoadBalancer)", "Service debug (NodePort)"), "exposed via public, debug"
        )
        == "exposed via public, debug"
    )  # a new way in
    assert watch.to_send(key, (), None) is None  # closed
    assert (
        watch.to_send(key, ("Service public (LoadBalancer)",), "exposed via public") == "exposed via public"
    )  # reopened


def test_a_deleted_service_is_forgotten_whatever_its_uid():
    watch = ExposureWatch()
    for key in (("ns", "m", "uid-1"), ("ns", "m", "uid-2"), ("ns", "other", "uid-3")):
        watch.to_send(key, ("Service public (LoadBalancer)",), "exposed")
    watch.forget("ns", "m")
    assert set(watch.services) == set(watch.warned) == {("ns", "other", "uid-3")}
