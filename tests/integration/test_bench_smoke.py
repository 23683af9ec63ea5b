"""Every bench runs: each one's smoke mode (tiny sizes on a CPU) goes end to end as `python -m bench.X` from
the repository root, so a bench that stops running fails CI; and every module in bench/ is accounted for here,
so a new bench comes with a smoke mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.testing.cluster import find_binaries

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

SMOKE = {  # module -> the arguments of its smoke run
    "attention_backends": ["--dry-run"],  # a GPU bench: its dry run is the CPU path
    "autoscale": ["--smoke"],
    "autoscale_hindsight": ["--smoke"],
    "continuous_batching": ["--smoke"],
    "disagg_idle": ["--smoke"],
    "disagg_overhead": ["--smoke"],
    "engine": ["--smoke"],
    "faults": ["--smoke"],
    "first_request": ["--smoke"],
    "flip": ["--smoke"],
    "goodput": ["--smoke"],
    "goodput_dynamo": ["--smoke"],  # on tandem's simulator: Dynamo's replay is not in CI
    "gpu_engine": ["--dry-run"],  # a GPU bench: its dry run is the CPU path
    "gpu_profile": ["--dry-run"],  # a GPU bench: its dry run is the CPU path
    "grammar_mask": ["--smoke"],
    "kv_transfer": ["--smoke"],
    "load": ["--smoke"],
    "model_fetch": ["--smoke"],
    "operator": ["--smoke"],  # the control plane of tests/k8s
    "quantization": ["--smoke"],
    "security": ["--smoke"],
    "speculative": ["--smoke"],
    "wake_from_zero": ["--smoke"],
}
# over a minute on a busy two-core host: real stacks of processes, a control plane, or many engine rows
SLOW = {
    "attention_backends",
    "disagg_idle",
    "disagg_overhead",
    "faults",
    "first_request",
    "flip",
    "goodput",
    "gpu_engine",
    "gpu_profile",
    "load",
    "operator",
    "security",
    "wake_from_zero",
    "grammar_mask",
    "engine",
    "continuous_batching",
    "speculative",
}
# a bench that no longer runs: fixing it turns its xfail into a failure (strict), which asks for it to leave
# this table
BROKEN: dict[str, str] = {}
ELSEWHERE = {  # module -> the test that runs its smoke mode and checks more of its output
    "gpu_serving": "tests/integration/test_gpu_serving_dry_run.py",
}
NEEDS_DYNAMO = (
    "runs inside Dynamo's replay harness (tools/dynamo-replay, the ai-dynamo package), which CI lacks"
)
CANNOT = {"autoscale_dynamo": NEEDS_DYNAMO}
LIBRARIES = {
    "engine_floor",
    "engine_timing",
    "fp8_rows",
    "step_cpu",
}  # parts of other benches, with no entry point of their own


def _runnable(module: str) -> bool:
    return 'if __name__ == "__main__":' in (BENCH / f"{module}.py").read_text()


def _cases() -> list:
    cases = []
    for module, argv in sorted(SMOKE.items()):
        marks = [pytest.mark.slow] if module in SLOW else []
        if module in BROKEN:
            marks.append(pytest.mark.xfail(strict=True, reason=BROKEN[module]))
        cases.append(pytest.param(module, argv, marks=marks, id=module))
    for module, reason in sorted(CANNOT.items()):
        cases.append(pytest.param(module, [], marks=pytest.mark.skip(reason=reason), id=module))
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("module", "argv"), _cases())
def test_the_bench_runs_end_to_end(module: str, argv: list[str]):
    env = dict(os.environ)
    if module == "operator":
        try:
            env["TANDEM_CONTROLPLANE_BIN"] = str(find_binaries())
        except RuntimeError as e:
            pytest.skip(f"the control plane cannot be built here: {e}")
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, (
        f"python -m bench.{module} {' '.join(argv)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), "a bench prints its figures"


def test_every_bench_has_a_smoke_run():
    modules = {p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_")}
    accounted = {*SMOKE, *ELSEWHERE, *CANNOT, *LIBRARIES}
    assert modules - accounted == set(), "a bench without a smoke run: give it --smoke and list it in SMOKE"
    assert accounted - modules == set(), "listed here but not in bench/"
    assert {m for m in modules if _runnable(m)} == {*SMOKE, *ELSEWHERE, *CANNOT}
    assert SLOW | set(BROKEN) <= set(SMOKE)
    for module, test in ELSEWHERE.items():
        assert f"bench.{module}" in (ROOT / test).read_text()
