"""The goodput report's tables carry every mode a run had (the SLO-aware conditional stack is optional) and
judge each conditional mode against colocated."""

from bench._goodput_report import modes_of, report

RATES = [1.0, 2.0, 4.0]


def _requests(tpot_s: float, n: int = 10) -> list[dict]:
    return [{"ok": True, "ttft_s": 0.1, "tpot_s": tpot_s, "input_len": 100} for _ in range(n)]


def _result(modes: dict[str, list[float]]) -> dict:
    """mode -> TPOT at each probed rate (TTFT always at idle): goodput follows where TPOT crosses the SLO."""
    probes = [
        {"mode": mode, "repeat": 0, "rate": rate, "requests": _requests(tpot)}
        for mode, tpots in modes.items()
        for rate, tpot in zip(RATES, tpots, strict=True)
    ]
    trace = {
        "trace": "t.csv",
        "trace_rows": 10,
        "median_input_len": 100,
        "median_output_len": 10,
        "idle": {m: {"ttft_s": 0.1, "tpot_s": 0.01} for m in modes},
        "rates": RATES,
        "slo_base": {"ttft_s": 0.1, "tpot_s": 0.01},
        "probes": probes,
    }
    config = {
        "repeats": 1,
        "length_scale": 4,
        "max_input_len": 512,
        "max_output_len": 64,
        "hidden": 64,
        "layers": 2,
        "threads": 1,
        "local_prefill_max_tokens": 32,
        "prefill_queue_tokens": 512,
        "slo_aware_tpot_ms": 30.0 if "conditional-slo" in modes else None,
        "slo_aware_fraction": 0.8,
    }
    return {
        "attainment_target": 0.9,
        "scales": [3.0],
        "traces": [trace],
        "config": config,
        "wall_s": 1.0,
        "trace_attribution": "test",
    }


def test_three_mode_runs_report_as_before_and_a_fourth_mode_gets_its_columns_and_verdict():
    three = {
        "colocated": [0.02, 0.05, 0.09],
        "disaggregated": [0.02, 0.02, 0.05],
        "conditional": [0.02, 0.05, 0.09],
    }
    text = report(_result(three))
    assert "conditional-slo" not in text
    assert (
        "| s | TTFT SLO ms | TPOT SLO ms | colocated | disaggregated | conditional | disaggregated / "
        "colocated" in text
    )
    four = {**three, "conditional-slo": [0.02, 0.02, 0.05]}
    assert modes_of(_result(four)["traces"][0]) == list(four)
    text = report(_result(four))
    assert "| conditional-slo / colocated |" in text
    assert "TPOT SLO of 30 ms" in text
    verdicts = [line for line in text.splitlines() if "lowest where TPOT SLO" in line]
    assert len(verdicts) == 2
    # at 3x idle TPOT (30 ms) colocated holds to rate 1 only, the SLO-aware stack like disaggregated to 2
    assert "MISSED" in verdicts[0] and "met" in verdicts[1].split("lowest where")[1]
    # each sweep judged on its own line part: conditional tied colocated (1.00x) in both
    assert (
        "both SLOs at s x idle: 1.00x (met); TTFT at 5x idle, TPOT at s x idle: 1.00x (met);" in verdicts[0]
    )


def test_a_busy_host_gets_its_load_printed_and_no_verdict():
    modes = {
        "colocated": [0.02, 0.05, 0.09],
        "disaggregated": [0.02, 0.02, 0.05],
        "conditional": [0.02, 0.05, 0.09],
    }
    quiet = {**_result(modes), "load_average": [1.3, 2.8, 1.5], "foreign_cpu_share": [0.01, 0.04, None]}
    quiet["config"]["quiet_load"] = 2.0
    text = report(quiet)
    assert "median 1.50, max 2.80" in text
    assert (
        "CPU share other processes used during each probe: median 2%, max 4% (a verdict needs <= 10%)" in text
    )
    assert "lowest where TPOT SLO" in text and "No verdict" not in text  # the load is the bench's own
    # every request has a 100-token prompt and TTFT 0.1 s: none is short at the threshold of 32
    assert "t.csv: no completed prompt of <= 32 tokens at 4 req/s to compare" in text
    busy = {
        **quiet,
        "foreign_cpu_share": [0.01, 0.35],
        "steal_cpu_share": [0.0, 0.30],
        "interrupt_cpu_share": [None],
    }
    text = report(busy)
    assert "No verdict: the host was busy (other processes used 35% of the CPUs (> 10%))" in text
    assert "of which the hypervisor gave to other machines (steal): median 15%, max 30%" in text
    assert "interrupt work" not in text  # not measured: not printed
    assert "lowest where TPOT SLO" not in text
    rerun = {
        **quiet,
        "rerun": [{"what": "colocated at 1 req/s", "foreign_cpu_share": 0.31}, {"foreign_cpu_share": 0.12}],
    }
    text = report(rerun)
    assert "2 attempts thrown away and run again (other work took up to 31% of the CPUs)" in text
    assert "lowest where TPOT SLO" in text  # the kept attempts were quiet: the verdict stands
    unmeasured = {**quiet, "foreign_cpu_share": [None], "load_average": [1.0, 4.2]}
    assert "No verdict: the host was busy (load average reached 4.20 (> 2))" in report(unmeasured)


def test_the_short_prompt_verdict_compares_ttft_p90_at_the_top_rate():
    from bench._goodput_report import short_prompt_verdict

    result = _result({"colocated": [0.02, 0.05, 0.09], "conditional": [0.02, 0.05, 0.09]})
    trace = result["traces"][0]
    for probe in trace["probes"]:
        ttft = 0.05 if probe["mode"] == "colocated" else 0.07
        probe["requests"] = [{"ok": True, "ttft_s": ttft, "tpot_s": 0.02, "input_len": 20} for _ in range(10)]
    assert short_prompt_verdict(trace, 32).endswith("conditional 70 ms vs colocated 50 ms (MISSED)")
    assert short_prompt_verdict(trace, 10).startswith("t.csv: no completed prompt")
    assert "TTFT p90 (ms) of prompts of at most 32 tokens" in report(
        result
    )  # older runs: the rule's threshold
    result["config"].update(local_prefill_max_tokens=512, short_prompt_tokens=24)
    text = report(result)
    assert "TTFT p90 (ms) of prompts of at most 24 tokens" in text and "localPrefillMaxTokens 512" in text


def test_a_ratio_is_judged_as_printed():
    from bench._goodput_report import _judged

    assert _judged(0.998, 1.0) == "1.00x (met)"  # a tie to two decimals is not a miss
    assert _judged(0.994, 1.0) == "0.99x (MISSED)"
    assert _judged(None, 1.0) == "-"


def test_with_an_a_a_control_a_point_misses_only_below_both_one_and_the_control():
    from bench._goodput_report import CONTROL, within_control

    # TPOT SLO 30 ms: colocated holds to rate 2 (goodput 2.2), conditional to rate 1 (1.1): 0.5x colocated
    modes = {
        "colocated": [0.02, 0.02, 0.05],
        "disaggregated": [0.02, 0.02, 0.05],
        "conditional": [0.02, 0.05, 0.09],
    }
    noisy = _result({**modes, CONTROL: [0.05, 0.05, 0.09]})  # the identical stack missed even rate 1 once
    trace = noisy["traces"][0]
    assert within_control(trace, [3.0], 0.9).endswith("at 0 of 2 points (met)")
    steady = _result({**modes, CONTROL: [0.02, 0.02, 0.05]})["traces"][0]
    line = within_control(steady, [3.0], 0.9)
    assert "at 2 of 2 points" in line and "0.50x, control 1.00x" in line and line.endswith("(MISSED)")
    lucky = _result({**modes, CONTROL: [0.02, 0.02, 0.02]})["traces"][
        0
    ]  # the control beat colocated: 4 / 2.2
    assert "0.50x, control 0.55x" in within_control(
        lucky, [3.0], 0.9
    )  # read both ways: colocated at 0.55x of it
    assert within_control(_result(modes)["traces"][0], [3.0], 0.9) is None  # no control, no such line
    text = report(noisy)
    assert f"| {CONTROL} / colocated |" in text and "A/A control" in text
