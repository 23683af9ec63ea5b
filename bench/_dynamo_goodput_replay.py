"""Runs fixed aggregated or disaggregated pools through Dynamo's own replay, for bench/goodput_dynamo.py.

    DYNAMO_PYTHON bench/_dynamo_goodput_replay.py --harness DIR  # a job per stdin line, a result per line out

Run by the Python that has ai-dynamo 1.6.1 (a script, not a module: it imports only the standard library,
Dynamo and the harness in DIR, whose README sets that Python up). Each job on stdin names a Mooncake JSONL
trace, an arrival speed-up and a pool: {"agg": N} (N aggregated workers, prefill and decode in one engine) or
{"prefill": P, "decode": D}. Every engine runs on NVIDIA's H200 profile of Llama-3.1-8B-Instruct-FP8, the
harness's conversion of it, or on the profiler result in `--profile-dir` (`tandem profile export-dynamo`). One
JSON line per job comes back, as soon as it ran: the job and, per request in trace order, [input tokens, TTFT
ms, TPOT ms] (TTFT null for a request that did not finish; TPOT 0 for one output token).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def per_request(records: list[dict]) -> list[list[float | None]]:
    """[input tokens, TTFT ms, TPOT ms] of each request (pure); unfinished: TTFT None."""
    rows: list[list[float | None]] = []
    for r in records:
        done = r["ttft_ms"] is not None and r["output_length"] >= r["requested_output_length"]
        n = r["output_length"]
        tpot = (r["last_token_ms"] - r["first_token_ms"]) / (n - 1) if done and n > 1 else 0.0
        rows.append([r["input_length"], round(r["ttft_ms"], 3) if done else None, round(tpot, 4)])
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--harness", required=True, help="the dynamo-replay harness folder (its replay.py)")
    p.add_argument(
        "--profile-dir", default=None, help="a profiler result in Dynamo's layout to time the engines with"
    )
    a = p.parse_args(argv)
    sys.path.insert(0, a.harness)
    import replay as harness  # the harness's H200 profile conversion and engine arguments

    harness.install_ais_import_stub()
    from dynamo._core import run_mocker_trace_replay

    with tempfile.TemporaryDirectory(prefix="tandem-dynamo-goodput-") as tmp:
        npz, max_kv = harness.h200_perf_npz(tmp, a.profile_dir)
        for line in sys.stdin:
            job = json.loads(line)
            common = dict(
                trace_block_size=harness.TRACE_BLOCK_SIZE,
                router_mode="round_robin",
                arrival_speedup_ratio=job["speedup"],
                capture_per_request=True,
            )
            pool = job["pool"]
            if "agg" in pool:
                res = run_mocker_trace_replay(
                    [job["trace"]],
                    extra_engine_args=harness.engine_args("aggregated", "h200", npz, max_kv, 0.0),
                    num_workers=pool["agg"],
                    **common,
                )
            else:
                res = run_mocker_trace_replay(
                    [job["trace"]],
                    prefill_engine_args=harness.engine_args("prefill", "h200", npz, max_kv, 0.0),
                    decode_engine_args=harness.engine_args("decode", "h200", npz, max_kv, 0.0),
                    num_prefill_workers=pool["prefill"],
                    num_decode_workers=pool["decode"],
                    **common,
                )
            print(json.dumps({"job": job, "requests": per_request(res.per_request)}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DYN_LOG", "error")
    sys.exit(main(sys.argv[1:]))
