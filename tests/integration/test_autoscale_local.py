"""The closed loop on the local stack, driven in-process so a test reads every tick: a TPOT breach with a
prefill worker to spare is answered by flipping it to decode, with no request failing. Growing each pool on
its own SLO and returning to the minimum runs through `tandem up` itself (test_up_autoscale.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tandem.operator.autoscale.backends.local.loop import LocalAutoscaleThread, local_autoscaler
from tandem.operator.autoscale.core.shape import Shape
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.local.scale import LocalPools
from tandem.operator.local.stack import free_port_block, serving
from tandem.profile import save_profile, shipped_profile
from tandem.spec import parse_object
from tests.integration.stacks import spec
from tests.integration.test_drain_scaling import StreamingLoad

pytestmark = pytest.mark.slow


@contextmanager
def autoscaled(obj: dict, tmp_path: Path):
    """The spec's local stack with its autoscaler ticking every 2 s: (the pools, the loop, the router's
    URL)."""
    svc = parse_object(obj)
    base = free_port_block(8)
    with serving(svc, tmp_path, port=base, worker_port=base + 2) as (stack, url):
        pools = LocalPools(stack, svc, Path.cwd(), tmp_path / "workers.json")
        loop = LocalAutoscaleThread(local_autoscaler(pools, svc, Path.cwd()), 2, echo=False).start()
        try:
            yield pools, loop, url
        finally:
            loop.stop()
            pools.close()


def _wait(what: str, ok, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s: {what}"
        time.sleep(0.5)


@pytest.mark.timeout(900)
def test_a_tpot_breach_is_answered_by_flipping_a_spare_prefill_worker(tiny_model_dir, tmp_path: Path):
    obj = spec("flipping", tiny_model_dir, prefill=2, decode=1, prefillChunkTokens=32)
    obj["spec"]["roleFlip"] = True
    obj["spec"]["prefill"].update(minReplicas=1, maxReplicas=2)
    obj["spec"]["decode"].update(minReplicas=1, maxReplicas=2)
    # a TPOT no CPU run meets, a TTFT every one does: decode breaches, prefill has a worker to spare
    obj["spec"]["slo"] = {"ttftMs": 60000, "tpotMs": 1, "percentile": 90}
    # a profile whose prefill is 20x the shipped CPU one: whatever rate this host's speed gives one client,
    # the prefill pool's own capacity model needs well under one of its two workers, so one is spare
    profile = tmp_path / "cheap-prefill.json"
    save_profile(shipped_profile().scaled(prefill=20, note="prefill never the bottleneck"), profile)
    obj["spec"]["autoscaling"] = {
        "enabled": True,
        "intervalSeconds": 2,
        "windowSeconds": 8,
        "stabilizationSeconds": 600,
        "scaleUpCooldownSeconds": 0,
        "flip": {"enabled": True, "flipSeconds": 2},
        "profile": str(profile),
    }
    with autoscaled(obj, tmp_path) as (pools, loop, url), StreamingLoad(url, clients=1) as load:
        try:
            _wait(
                "a prefill worker serving decode",
                lambda: any(p.name.startswith("prefill-") for p in pools.members("decode")),
                300,
            )
        except AssertionError as e:
            last = [(d.reason_code, d.reason) for t in loop.ticks[-2:] for d in t.decisions.values()]
            raise AssertionError(f"{e}; the last decisions: {last}") from None
        _wait("requests served after the flip", lambda: load.ok >= 10, 120)
    assert load.failures == [], (
        f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:5]}"
    )
    flips = [f for t in loop.ticks for f in t.flips]
    assert flips and flips[0].reason_code == "FlippedToDecode", flips
    assert flips[0].reason.startswith("FlippedToDecode: TPOT p90 ") and "prefill has " in flips[0].reason
    ups = [d for t in loop.ticks for d in t.applied if d.pool == Pool.decode and d.desired > d.current]
    assert ups, "decode's own new worker starts beside the flip"


@pytest.mark.timeout(900)
def test_mode_auto_collapses_when_idle_and_splits_under_load_with_no_failed_request(
    tiny_model_dir, tmp_path: Path
):
    """`mode: auto` from a 1P+1D start: idle, the shape rule collapses it to one colocated worker (the prefill
    worker flips, the decode one drains); under a steady client it splits again (a decode worker starts, then
    the colocated one flips to prefill), and not one request fails on the way."""
    obj = spec("shaping", tiny_model_dir, mode="auto", prefill=1, decode=1, prefillChunkTokens=32)
    obj["spec"]["roleFlip"] = True
    obj["spec"]["router"] = {"disaggregation": {"mode": "conditional"}}
    obj["spec"]["prefill"].update(minReplicas=1, maxReplicas=1)
    obj["spec"]["decode"].update(minReplicas=1, maxReplicas=1)
    # a TPOT one colocated worker meets idle (the profile's idle step is under 0.8 x 40 ms) and a prefill 500x
    # the shipped CPU one: whatever rate this host gives one client (0.05 req/s is enough), its prompts
    # stretch a colocated step past the TPOT, which the split does not (prefill runs beside decode there). The
    # prompts are held near 90 tokens: the shipped profile's decode step at a 500-token context misses 0.8 x
    # 40 ms, and a 500x prefill of it the TTFT, so with longer prompts no shape meets the SLO and the rule
    # keeps the one it has
    obj["spec"]["slo"] = {"ttftMs": 600000, "tpotMs": 40, "percentile": 90}
    profile = tmp_path / "dear-prefill.json"
    save_profile(shipped_profile().scaled(prefill=0.002, note="prefill 500x dearer"), profile)
    obj["spec"]["autoscaling"] = {
        "enabled": True,
        "intervalSeconds": 2,
        "windowSeconds": 6,
        "profile": str(profile),
        "shape": {"dwellSeconds": 0},
    }
    with autoscaled(obj, tmp_path) as (pools, loop, url):
        _wait(
            "collapsed to one colocated worker",
            lambda: len(pools.members("colocated")) == 1 and not pools.members("decode"),
            300,
        )
        assert not pools.members("prefill") and pools.members("colocated")[0].name == "prefill-0"
        with StreamingLoad(url, clients=1, words=40) as load:
            try:
                _wait(
                    "split under load",
                    lambda: (
                        pools.members("prefill")
                        and pools.members("decode")
                        and not pools.members("colocated")
                    ),
                    300,
                )
            except AssertionError as e:
                last = [t.shape.reason if t.shape else t.unavailable for t in loop.ticks[-3:]]
                raise AssertionError(f"{e}; the last ticks: {last}; {load.ok} served") from None
            ok = load.ok
            _wait("requests served after the split", lambda: load.ok >= ok + 5, 120)
    assert load.failures == [], (
        f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:5]}"
    )
    changes = [t.shape for t in loop.ticks if t.shape is not None and t.shape.target != t.shape.current]
    assert [c.action.value for c in changes[:2]] == ["collapse", "split"], [c.reason for c in changes]
    assert changes[0].reason.startswith("Collapsed: 0 req/s fits 1 colocated worker at TPOT p90")
    assert changes[1].reason.startswith("Split: ") and changes[1].target == Shape(
        prefill=1, decode=1
    )  # maxReplicas
