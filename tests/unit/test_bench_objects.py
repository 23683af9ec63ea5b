"""The InferenceServices the benchmarks apply pass admission's rules, so a bench cannot rot unseen when the
spec tightens (bench.operator once asked for minReplicas 0 without the autoscaler, and no longer ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._stacks import service_object
from bench.operator import bench_object
from bench.wake_from_zero import stack_spec
from tandem.spec import parse_object

MODEL = Path("/models/m")


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(bench_object("bench-0"), id="operator"),
        pytest.param(stack_spec(MODEL), id="wake_from_zero"),
        pytest.param(
            service_object("split", MODEL, mode="disaggregated", prefill=2, decode=1), id="stacks-split"
        ),
        pytest.param(service_object("colocated", MODEL, mode="colocated", decode=2), id="stacks-colocated"),
        pytest.param(
            service_object(
                "conditional", MODEL, mode="disaggregated", router={"disaggregation": {"mode": "conditional"}}
            ),
            id="stacks-conditional",
        ),
    ],
)
def test_a_bench_object_is_one_admission_accepts(obj: dict) -> None:
    svc = parse_object(obj)
    assert svc.name == obj["metadata"]["name"]


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_the_serving_bench_asks_for_services_admission_accepts(tiny_model_dir: Path, mode: str) -> None:
    from bench.gpu_serving import parse_args, stack_object

    args = parse_args(["--tiny", "--trace", "unused.csv"])
    svc = parse_object(stack_object(mode, tiny_model_dir, args, max_context=1024))
    assert svc.spec.mode.value == mode
