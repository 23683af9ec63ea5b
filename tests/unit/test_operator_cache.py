"""The watch cache never goes backwards and never revives a deleted object from a stale event."""

from tandem.operator.runtime.cache import ObjectCache


def _body(name, rv, uid="u1", **extra):
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": str(rv),
            "uid": uid,
            "managedFields": [{"big": 1}],
        },
        **extra,
    }


def test_newer_wins_and_managed_fields_dropped():
    c = ObjectCache()
    c.put(_body("a", 5, spec={"replicas": 2}))
    c.put(_body("a", 4, spec={"replicas": 1}))  # stale event after our own write
    got = c.get("Deployment", "ns", "a")
    assert got["spec"] == {"replicas": 2} and "managedFields" not in got["metadata"]


def test_deleted_object_is_not_revived_by_older_event():
    c = ObjectCache()
    c.put(_body("a", 5))
    c.forget(_body("a", 6))
    c.put(_body("a", 5))
    assert c.get("Deployment", "ns", "a") is None
    c.put(_body("a", 9, uid="u2"))  # recreated
    assert c.get("Deployment", "ns", "a")["metadata"]["uid"] == "u2"


def test_kind_can_be_given_for_listed_items_without_kind():
    c = ObjectCache()
    body = _body("a", 1)
    del body["kind"]
    c.put(body, "Service")
    assert c.get("Service", "ns", "a") is not None
