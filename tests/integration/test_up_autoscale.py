"""`tandem up` with `autoscaling.enabled`, run as users run it: the command's own autoscaler grows each pool
on its own SLO under load that breaches both, returns them to their minimum once the load stops, and no
request fails."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tandem.testing.local_up import routable
from tests.integration.stacks import spec
from tests.integration.test_drain_scaling import StreamingLoad
from tests.integration.test_supervisor import start_tandem_up, wait_for

pytestmark = pytest.mark.slow

# what `tandem up` prints for each applied decision: "autoscaler: decode 1->2: TPOT p90 ... [SLOBreach]"
DECISION = re.compile(r"autoscaler: (prefill|decode) (\d+)->(\d+): (.*) \[(\w+)\]$")


def autoscaled_spec(tiny_model_dir) -> dict:
    obj = spec("upscale", tiny_model_dir, prefillChunkTokens=32)
    for pool in ("prefill", "decode"):
        obj["spec"][pool].update(minReplicas=1, maxReplicas=2)
    obj["spec"]["slo"] = {
        "ttftMs": 1,
        "tpotMs": 1,
        "percentile": 90,
    }  # no CPU run meets these: load breaches both
    obj["spec"]["autoscaling"] = {
        "enabled": True,
        "intervalSeconds": 2,
        "windowSeconds": 8,
        "stabilizationSeconds": 4,
        "scaleUpCooldownSeconds": 0,
        "scaleDownCooldownSeconds": 2,
    }
    return obj


@pytest.mark.timeout(900)
def test_tandem_up_scales_both_pools_on_its_slo_and_back(tiny_model_dir, tmp_path: Path):
    up, url = start_tandem_up(tiny_model_dir, tmp_path, obj=autoscaled_spec(tiny_model_dir))
    log_path = tmp_path / "tandem-up.log"
    try:
        wait_for(
            "the autoscaler to start",
            lambda: "autoscaling upscale every 2s on its SLO" in log_path.read_text(),
            30,
        )
        with StreamingLoad(url, clients=3) as load:
            wait_for(
                "two routable workers in each pool",
                lambda: routable(url, "prefill") == 2 and routable(url, "decode") == 2,
                300,
            )
        wait_for(
            "each pool back to one",
            lambda: routable(url, "prefill") == 1 and routable(url, "decode") == 1,
            300,
        )
        said = [line for line in log_path.read_text().splitlines() if line.startswith("autoscaler: ")]
        moves = [m.groups() for m in map(DECISION.match, said) if m]
        ups = {
            pool: (why, code) for pool, current, desired, why, code in moves if int(desired) > int(current)
        }
        downs = {pool for pool, current, desired, _, _ in moves if int(desired) < int(current)}
        assert set(ups) == {"prefill", "decode"} and downs == {"prefill", "decode"}, said
        assert "TTFT" in ups["prefill"][0], said  # each pool grew on its own SLO
        assert "TPOT" in ups["decode"][0] or ups["decode"][1] == "RunningBatch", said
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert load.failures == [], (
        f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:5]}"
    )
    assert load.ok > 0
