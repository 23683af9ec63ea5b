def test_rebase_keeps_own_conditions_and_takes_the_others_from_the_fresher_read():
    from tandem.operator.status.service import rebase

    built = {
        "observedGeneration": 3,
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "SLOMet", "status": "False"}],
    }
    fresh = {"conditions": [{"type": "Ready", "status": "False"}, {"type": "SLOMet", "status": "True"}]}
    out = rebase(built, fresh)
    assert out["observedGeneration"] == 3
    assert {c["type"]: c["status"] for c in out["conditions"]} == {"Ready": "True", "SLOMet": "True"}
    assert [c["type"] for c in rebase(built, {})["conditions"]] == [
        "Ready"
    ]  # SLOMet gone from the fresh read
