"""`tandem top -f SPEC.yaml`: for a local `tandem up` stack, the desired replicas per pool and the SLO come
from the spec it runs (the routers' /metrics give what is ready and how it performs)."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.launch import pool_replicas, worker_pools
from tandem.operator.top.view import PoolState, ServiceState
from tandem.spec import InferenceService, load_file


def spec_state(svc: InferenceService) -> ServiceState:
    """Pure: what an InferenceService spec says the view should see (namespace unknown: a local stack)."""
    spec = svc.spec
    return ServiceState(
        svc.name,
        None,
        {pool: PoolState(desired=pool_replicas(spec, pool)) for pool in worker_pools(spec)},
        slo_ttft_s=spec.slo.ttft_ms / 1000,
        slo_tpot_s=spec.slo.tpot_ms / 1000,
        objective=spec.slo.percentile / 100,
    )


class SpecSource:
    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)

    def poll(self) -> list[ServiceState]:
        return [spec_state(load_file(p)) for p in self.paths]  # read each time: the file may be edited

    def close(self) -> None:
        pass
