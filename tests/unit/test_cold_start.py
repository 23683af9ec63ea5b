"""Cold starts read phase by phase from pods, the ModelCached condition from the fetch-model init containers,
both in status, and the autoscaler's figures for a cache hit and a miss learned apart."""

from __future__ import annotations

import json

import pytest

from tandem.operator.autoscale.core.cold_start import ColdStartFigures, learn, observed
from tandem.operator.status.cold_start import merge, pod_cold_start, pool_summary
from tandem.operator.status.model_cached import condition, pod_fetch_state, pool_fetches
from tandem.operator.status.start_status import with_pod_starts


def t(s: int) -> str:
    return f"2026-01-01T00:{s // 60:02d}:{s % 60:02d}Z"


def pod(
    name="p",
    scheduled=2,
    init_start=12,
    init_end=None,
    report=None,
    main_start=None,
    ready=None,
    exit_code=0,
    init_running=False,
    restarted_error=None,
):
    """A pod as the scheduler and kubelet report it; times in seconds after creation at t(0)."""
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": t(scheduled)}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": t(ready)})
    init: dict = {"name": "fetch-model"}
    if init_running:
        init["state"] = {"running": {"startedAt": t(init_start)}}
    elif init_end is not None:
        init["state"] = {
            "terminated": {
                "exitCode": exit_code,
                "startedAt": t(init_start),
                "finishedAt": t(init_end),
                "message": json.dumps(report) if report else "",
            }
        }
    else:
        init["state"] = {"waiting": {"reason": "PodInitializing"}}
    if restarted_error:
        init["lastState"] = {"terminated": {"exitCode": 1, "message": json.dumps({"error": restarted_error})}}
        if not init_running:
            init["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    status = {"conditions": conditions, "initContainerStatuses": [init]}
    if main_start is not None:
        status["containerStatuses"] = [{"name": "worker", "state": {"running": {"startedAt": t(main_start)}}}]
    return {"metadata": {"name": name, "creationTimestamp": t(0)}, "status": status}


MISS = {"cache": "miss", "bytes": 3 << 30, "seconds": 80.0}
HIT = {"cache": "hit", "bytes": 0, "seconds": 1.0}


def test_a_ready_pods_start_is_split_into_phases():
    start = pod(init_end=92, report=MISS, main_start=93, ready=120)
    assert pod_cold_start(start) == {
        "pod": "p",
        "readyAt": t(120),
        "cache": "miss",
        "scheduledSeconds": 2.0,
        "pulledSeconds": 10.0,
        "fetchedSeconds": 80.0,
        "loadedSeconds": 27.0,
        "totalSeconds": 120.0,
    }
    assert pod_cold_start(pod(init_end=92, report=MISS, main_start=93)) is None  # not Ready yet


def test_a_pod_without_a_download_starts_in_fewer_phases():
    no_fetch = pod(main_start=20, ready=50)
    no_fetch["status"].pop("initContainerStatuses")
    assert pod_cold_start(no_fetch) == {
        "pod": "p",
        "readyAt": t(50),
        "cache": "none",
        "scheduledSeconds": 2.0,
        "pulledSeconds": 18.0,
        "loadedSeconds": 30.0,
        "totalSeconds": 50.0,
    }


def test_samples_are_one_per_pod_newest_kept_with_medians_per_kind():
    pods = [pod(f"m{i}", init_end=90 + i, report=MISS, main_start=91 + i, ready=120 + i) for i in range(3)]
    pods += [pod("h", init_end=14, report=HIT, main_start=15, ready=40), pod("starting", init_running=True)]
    samples = merge([], pods)
    assert [s["pod"] for s in samples] == ["h", "m0", "m1", "m2"]
    assert merge(samples, pods) == samples  # a pod read again is not a second sample
    assert [
        s["pod"]
        for s in merge(samples, [pod("new", init_end=14, report=HIT, main_start=15, ready=200)], keep=2)
    ] == ["m2", "new"]
    summary = pool_summary(samples)
    assert summary["last"]["pod"] == "m2"
    assert summary["medians"]["miss"] == {
        "count": 3,
        "scheduledSeconds": 2.0,
        "pulledSeconds": 10.0,
        "fetchedSeconds": 79.0,
        "loadedSeconds": 29.0,
        "totalSeconds": 121.0,
    }
    assert summary["medians"]["hit"]["totalSeconds"] == 40.0 and summary["medians"]["hit"]["count"] == 1


@pytest.mark.parametrize(
    "kwargs,state",
    [
        ({}, "waiting"),
        ({"init_running": True}, "fetching"),
        ({"init_end": 30, "report": HIT}, "cached"),
        ({"init_end": 30, "exit_code": 1, "report": {"error": "HTTPError: 401 gated repo"}}, "failed"),
        ({"restarted_error": "ConnectError: hub down"}, "failed"),
        (
            {"restarted_error": "ConnectError: hub down", "init_running": True},
            "fetching",
        ),  # the kubelet's retry runs
    ],
)
def test_fetch_states(kwargs, state):
    assert pod_fetch_state(pod(**kwargs))[0] == state


def test_model_cached_condition_says_how_many_pods_have_the_model_and_why_not():
    fetching = {
        "prefill": pool_fetches([pod("a", init_end=100, report=MISS), pod("b", init_running=True)]),
        "router": pool_fetches([pod("r", init_end=3, report=HIT)]),
    }
    ok, reason, message = condition(fetching, t(72))
    assert (ok, reason) == (False, "Fetching")
    assert message.startswith("2/3 pods have the model; 1 fetching, the longest for 60 s, 0 not started")
    assert "1 found it cached, 1 downloaded 3072.0 MiB" in message
    done = {
        "prefill": pool_fetches([pod("a", init_end=100, report=MISS), pod("b", init_end=101, report=HIT)])
    }
    assert condition(done, t(200))[:2] == (True, "Cached")
    failed = {"decode": pool_fetches([pod("d", restarted_error="HTTPError: 401 gated repo")])}
    ok, reason, message = condition(failed, t(200))
    assert (ok, reason) == (False, "FetchFailed") and "decode: pod d: HTTPError: 401 gated repo" in message


def _status(pools=("prefill", "router")):
    return {
        "pools": {p: {"readyReplicas": 1} for p in pools},
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": ""}],
    }


def test_status_keeps_the_pools_not_read_and_drops_model_cached_for_other_sources():
    previous = {
        "coldStart": {
            "router": pool_summary(merge([], [pod("r", init_end=3, report=HIT, main_start=4, ready=9)]))
        },
        "modelCache": {"router": pool_fetches([pod("r", init_end=3, report=HIT)])},
    }
    read = {"prefill": [pod("a", init_end=92, report=MISS, main_start=93, ready=120)]}
    out = with_pod_starts(_status(), previous, read, True, 3, t(130))
    assert (
        set(out["coldStart"]) == {"router", "prefill"}
        and out["coldStart"]["prefill"]["last"]["cache"] == "miss"
    )
    cached = next(c for c in out["conditions"] if c["type"] == "ModelCached")
    assert (cached["status"], cached["reason"], cached["observedGeneration"]) == ("True", "Cached", 3)
    again = with_pod_starts(_status(), out, {}, True, 3, t(400))
    assert next(c for c in again["conditions"] if c["type"] == "ModelCached")["lastTransitionTime"] == t(130)
    other_source = with_pod_starts(_status(), out, {}, False, 4, t(500))
    assert [c["type"] for c in other_source["conditions"]] == ["Ready"]


def test_hit_and_miss_cold_starts_are_learned_apart():
    samples = [
        {"pod": f"m{i}", "cache": "miss", "totalSeconds": s} for i, s in enumerate([110, 120, 300])
    ] + [
        {"pod": "h0", "cache": "hit", "totalSeconds": 30},
        {"pod": "h1", "cache": "none", "totalSeconds": 40},
        {"pod": "h0", "cache": "hit", "totalSeconds": 999},
    ]  # one sample per pod: the first seen
    figures = learn(samples)
    assert figures == ColdStartFigures(hit_s=35.0, miss_s=120.0, hits=2, misses=3)
    assert figures.expected_s() == pytest.approx(0.4 * 35 + 0.6 * 120)
    assert (
        learn([{"pod": "u", "cache": "unknown", "totalSeconds": 90}]).miss_s == 90
    )  # no report: the costlier guess
    assert learn([]).expected_s() is None  # nothing seen: the profile's figure stands
    assert learn(samples[:3]).expected_s() == 120.0


def test_observed_starts_come_from_status_and_from_the_pods_now_ready():
    status = {
        "coldStart": {
            "decode": {"samples": [{"pod": "old", "cache": "miss", "totalSeconds": 100}]},
            "router": {"samples": [{"pod": "r", "cache": "hit", "totalSeconds": 5}]},
        }
    }
    seen = observed(
        status, ["prefill", "decode"], [pod("new", init_end=14, report=HIT, main_start=15, ready=40)]
    )
    assert [s["pod"] for s in seen] == ["old", "new"]  # the router's start is not a worker's
    assert learn(seen) == ColdStartFigures(hit_s=40.0, miss_s=100.0, hits=1, misses=1)
