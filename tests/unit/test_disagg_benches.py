"""The idle-parity and Dynamo-goodput benchmarks' decisions: ratios, verdicts withheld on a busy host, pools
of equal GPU count, the replay's rows read as latencies, and the best split."""

import importlib.util
from pathlib import Path

from bench._goodput_dynamo_grid import AGGREGATED, best_split, cell, latencies, pools, rate_of, share_local
from bench._goodput_sweep import Goodput
from bench._host import busy_reason, busy_ticks, foreign_share, process_ticks, quietly, stat_column
from bench.disagg_idle import COLOCATED, DISAGGREGATED, cpu_per_token, run_summary, verdict
from bench.goodput_dynamo import main
from tandem.trace import TraceRequest


def _replay_driver():
    """bench/_dynamo_goodput_replay.py runs as a script under another Python: load it by path, as it runs."""
    path = Path(__file__).resolve().parents[2] / "bench" / "_dynamo_goodput_replay.py"
    spec = importlib.util.spec_from_file_location("_dynamo_goodput_replay", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tpot_colo: float, tpot_disagg: float, loads: list[float]) -> dict:
    ttft = {COLOCATED: [0.10, 0.12, 0.11], DISAGGREGATED: [0.13, 0.15, 0.14]}
    tpot = {COLOCATED: [tpot_colo] * 3, DISAGGREGATED: [tpot_disagg] * 3}
    return run_summary(ttft, tpot, loads)


def test_a_run_reports_medians_the_ttft_overhead_and_the_tpot_ratio():
    r = _run(0.010, 0.0104, [0.2, 0.3])
    assert r["ttft_ms"] == {COLOCATED: 110.0, DISAGGREGATED: 140.0}
    assert round(r["ttft_overhead_ms"], 6) == 30.0
    assert round(r["tpot_ratio"], 6) == 1.04


def test_the_verdict_uses_the_worst_run_and_is_withheld_when_the_host_was_busy():
    quiet = [_run(0.010, 0.0104, [0.2, 0.3]), _run(0.010, 0.0103, [0.1, 0.4])]
    assert verdict(quiet, quiet_load=1.0).endswith("met (worst 1.040)")
    slow = [*quiet, _run(0.010, 0.0112, [0.3, 0.3])]
    assert "MISSED (worst 1.120)" in verdict(slow, quiet_load=1.0)
    busy = [*quiet, _run(0.010, 0.0100, [0.3, 2.5])]  # no CPU shares measured: the load average decides
    assert verdict(busy, quiet_load=1.0).startswith("no verdict: load average reached 2.50")
    measured = [{**r, "foreign_cpu_share": 0.02} for r in busy]  # the load was the bench's own
    assert verdict(measured, quiet_load=1.0).startswith("TPOT disaggregated / colocated <= 1.05")
    measured[1]["foreign_cpu_share"] = 0.4
    assert (
        verdict(measured, quiet_load=1.0)
        == "no verdict: other processes used 40% of the CPUs (> 10%); rerun on a quiet host"
    )


def test_host_cpu_accounting():
    assert busy_ticks("cpu  100 5 50 1000 20 3 2 7 0 0") == 100 + 5 + 50 + 3 + 2 + 7
    assert stat_column("cpu  100 5 50 1000 20 3 2 7 0 0", "steal") == 7
    assert (
        stat_column("cpu  100 5 50 1000 20 3 2 7 0 0", "softirq") == 2
        and stat_column("cpu  100 5 50 1000", "steal") == 0
    )
    line = "4242 (python -m tandem) S 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 9"
    assert process_ticks(line) == 290
    assert foreign_share(busy_ticks=500, our_ticks=300, capacity_ticks=2000) == 0.1
    assert foreign_share(busy_ticks=200, our_ticks=300, capacity_ticks=2000) == 0.0
    assert busy_reason([9.0], [0.05], quiet_load=2.0) is None
    assert busy_reason([9.0], [None], quiet_load=2.0) == "load average reached 9.00 (> 2)"


class ScriptedMeter:
    """A host meter whose attempts report the other-process CPU shares given, in order (`quietly`'s meter
    protocol; the real CpuMeter reads /proc in tests/integration/test_host_meter.py). Logs when it is
    started and read."""

    def __init__(self, foreign: list[float | None], events: list[str]):
        self.foreign, self.events = foreign, events

    def start(self) -> "ScriptedMeter":
        self.events.append("start")
        return self

    def shares(self) -> dict[str, float | None]:
        self.events.append("read")
        return {"foreign_cpu_share": self.foreign.pop(0), "steal_cpu_share": 0.0, "interrupt_cpu_share": 0.01}


def _quietly(foreign: list[float | None], reruns: int):
    """`quietly` over a measurement that numbers its attempts, the meter scripted with `foreign`."""
    events: list[str] = []
    meter = ScriptedMeter(list(foreign), events)

    def measure() -> int:
        events.append("measure")
        return events.count("measure")

    result, shares, discarded = quietly(
        measure, lambda: meter, reruns, quiet=0.1, before=lambda: events.append("before")
    )
    return result, shares["foreign_cpu_share"], [d["foreign_cpu_share"] for d in discarded], events


def test_a_measurement_disturbed_by_other_work_is_run_again_and_the_quiet_one_kept():
    result, kept, discarded, events = _quietly([0.4, 0.25, 0.05, 0.0], reruns=5)
    assert (result, kept, discarded) == (3, 0.05, [0.4, 0.25])  # the third attempt was quiet: no fourth
    assert (
        events == ["before", "start", "measure", "read"] * 3
    )  # each attempt metered alone, `before` outside
    assert _quietly([0.4, 0.3], reruns=1)[:3] == (2, 0.3, [0.4])  # no rerun left: the last one is kept
    assert _quietly([0.4], reruns=0)[:3] == (1, 0.4, [])
    assert _quietly([0.1], reruns=3)[:3] == (1, 0.1, [])  # at the bound is quiet
    assert _quietly([None], reruns=3)[:3] == (1, None, [])  # no /proc to read: nothing to rerun for


def test_cpu_per_token_is_the_difference_over_the_tokens_of_each_stack():
    before = {COLOCATED: {"colocated-0": 1.0, "router": 0.5}, DISAGGREGATED: {"decode-0": 2.0}}
    after = {
        COLOCATED: {"colocated-0": 1.5, "router": 0.6},
        DISAGGREGATED: {"decode-0": 2.4, "prefill-0": 0.1},
    }
    got = cpu_per_token(before, after, {COLOCATED: 100, DISAGGREGATED: 100})
    assert got == {
        COLOCATED: {"colocated-0": 5.0, "router": 1.0},
        DISAGGREGATED: {"decode-0": 4.0, "prefill-0": 1.0},
    }


def test_pools_are_the_aggregated_one_and_every_split_of_the_same_gpus():
    assert pools(3) == {
        AGGREGATED: {"agg": 3},
        "1P+2D": {"prefill": 1, "decode": 2},
        "2P+1D": {"prefill": 2, "decode": 1},
    }


def test_replay_rows_become_latencies_and_unfinished_requests_fail():
    got = latencies([[100, 20.0, 5.0], [300, None, 0.0]])
    assert got[0].ok and got[0].ttft_s == 0.02 and got[0].tpot_s == 0.005 and got[0].input_len == 100
    assert not got[1].ok and got[1].ttft_s is None


def test_the_replay_driver_reads_tpot_over_the_tokens_after_the_first():
    records = [
        {
            "input_length": 10,
            "ttft_ms": 5.0,
            "first_token_ms": 5.0,
            "last_token_ms": 25.0,
            "output_length": 5,
            "requested_output_length": 5,
        },
        {
            "input_length": 20,
            "ttft_ms": 7.0,
            "first_token_ms": 7.0,
            "last_token_ms": 7.0,
            "output_length": 1,
            "requested_output_length": 1,
        },
        {
            "input_length": 30,
            "ttft_ms": 9.0,
            "first_token_ms": 9.0,
            "last_token_ms": 19.0,
            "output_length": 3,
            "requested_output_length": 8,
        },
    ]
    assert _replay_driver().per_request(records) == [[10, 5.0, 5.0], [20, 7.0, 0.0], [30, None, 0.0]]


def test_best_split_and_cells():
    per_pool = {
        AGGREGATED: Goodput(9.0),
        "1P+3D": Goodput(4.0),
        "2P+2D": Goodput(7.5),
        "3P+1D": Goodput(0.0, "<"),
    }
    assert best_split(per_pool) == ("2P+2D", Goodput(7.5))
    assert cell(Goodput(0.0, "<"), [0.5, 1.0]) == "< 0.5"
    assert cell(Goodput(32.0, ">="), [0.5, 32.0]) == ">=32.00"


def test_share_local_counts_prompts_at_or_under_the_threshold():
    trace = [TraceRequest(0.0, n, 10) for n in (100, 512, 513, 2000)]
    assert share_local(trace, 512) == 0.5


def test_goodput_curves_are_drawn_from_a_runs_tables_without_a_replay(tmp_path):
    """--plot-from reads the traces' tables (the committed rows the disaggregation page reports here) and
    draws the curves; docs/img/goodput-split.png is this command's output."""
    assert (rate_of("6.35"), rate_of(">=32.00"), rate_of("< 0.5")) == (6.35, 32.0, None)
    recorded = Path(__file__).resolve().parents[2] / "bench/results/goodput_dynamo_tables.json"
    assert main(["--plot-from", str(recorded), "--plot", str(tmp_path / "g.png")]) == 0
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
