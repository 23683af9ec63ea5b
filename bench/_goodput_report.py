"""The goodput sweep's tables (markdown) and curves (PNG) from the recorded probes of bench/goodput.py."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

from bench._goodput_sweep import (
    Goodput,
    Latency,
    Probe,
    goodput_per_repeat,
    ratios,
    short_prompt_ttft_p90,
    spread,
)
from bench._host import QUIET_FOREIGN_SHARE, busy_reason
from tandem.slo import Slo

CONTROL = "colocated-control"  # a second colocated stack, identical to the first: the A/A control
MODES = (
    "colocated",
    "disaggregated",
    "conditional",
    "conditional-slo",
    CONTROL,
)  # table order; the last two optional
CONDITIONAL_MODES = ("conditional", "conditional-slo")
FIXED_TTFT_SCALE = 5.0  # the second sweep: TTFT at 5x idle, the TPOT scale moves
TIGHT_TPOT_SCALE = 3.0  # the target's "tight TPOT": 3x idle or less


def probes_of(trace: dict) -> list[Probe]:
    return [
        Probe(p["mode"], p["repeat"], p["rate"], tuple(Latency(**r) for r in p["requests"]))
        for p in trace["probes"]
    ]


def modes_of(trace: dict) -> list[str]:
    """The modes this trace's probes ran, in table order."""
    ran = {p["mode"] for p in trace["probes"]}
    return [m for m in MODES if m in ran]


def sweeps(scales: list[float]) -> dict[str, list[tuple[float, float]]]:
    """(TTFT scale, TPOT scale) pairs of each sweep."""
    return {
        "both SLOs at s x idle": [(s, s) for s in scales],
        f"TTFT at {FIXED_TTFT_SCALE:g}x idle, TPOT at s x idle": [(FIXED_TTFT_SCALE, s) for s in scales],
    }


def goodputs(
    probes: list[Probe], base: Slo, point: tuple[float, float], target: float
) -> dict[str, list[Goodput]]:
    slo = base.scaled(*point)
    return {mode: goodput_per_repeat(probes, mode, slo, target) for mode in {p.mode for p in probes}}


def _cell(values: list[Goodput]) -> str:
    censored = any(g.bound for g in values)
    return f"{spread([g.rate for g in values])}{' *' if censored else ''}"


def _ratio_cell(values: list[float]) -> str:
    return str(spread(values)) if values else "-"


def trace_tables(trace: dict, scales: list[float], target: float, threshold: int) -> Iterator[str]:
    probes, base, modes = probes_of(trace), Slo.from_seconds(**trace["slo_base"]), modes_of(trace)
    others = [m for m in modes if m != "colocated"]
    yield (
        f"#### {trace['trace']} ({trace['trace_rows']} rows; shaped median {trace['median_input_len']} "
        f"prompt / {trace['median_output_len']} output tokens)"
    )
    yield ""
    yield (
        "Idle (median request, one at a time): "
        + "; ".join(
            f"{m} TTFT {1000 * s['ttft_s']:.0f} ms, TPOT {1000 * s['tpot_s']:.1f} ms"
            for m, s in trace["idle"].items()
        )
        + f". Probed rates: {', '.join(f'{r:g}' for r in trace['rates'])} req/s."
    )
    for title, points in sweeps(scales).items():
        yield ""
        yield f"Goodput (req/s at >= {target:.0%} joint SLO attainment), {title}:"
        yield ""
        columns = ["s", "TTFT SLO ms", "TPOT SLO ms", *modes, *(f"{m} / colocated" for m in others)]
        yield "| " + " | ".join(columns) + " |"
        yield "|" + " --- |" * len(columns)
        for (ts, ps), s in zip(points, scales, strict=True):
            g = goodputs(probes, base, (ts, ps), target)
            cells = [f"{s:g}", f"{1000 * ts * base.ttft_s:.0f}", f"{1000 * ps * base.tpot_s:.0f}"]
            cells += [_cell(g[m]) for m in modes] + [
                _ratio_cell(ratios(g[m], g["colocated"])) for m in others
            ]
            yield "| " + " | ".join(cells) + " |"
    yield ""
    yield f"TTFT p90 (ms) of prompts of at most {threshold} tokens, pooled over repeats, by probed rate:"
    yield ""
    yield "| mode | " + " | ".join(f"{r:g} req/s" for r in trace["rates"]) + " |"
    yield "| --- |" + " --- |" * len(trace["rates"])
    for mode in modes:
        cells = [short_prompt_ttft_p90(probes, mode, r, threshold) for r in trace["rates"]]
        yield f"| {mode} | " + " | ".join("-" if c is None else f"{1000 * c:.0f}" for c in cells) + " |"


def short_prompt_tokens(cfg: dict) -> int:
    """The longest prompt the short-prompt table counts (runs recorded before it was its own option used the
    conditional rule's threshold)."""
    return int(cfg.get("short_prompt_tokens", cfg["local_prefill_max_tokens"]))


def short_prompt_verdict(trace: dict, threshold: int, mode: str = "conditional") -> str:
    """The short-prompt target: `mode`'s TTFT p90 of prompts of at most `threshold` tokens, at the top probed
    rate, no worse than colocated's."""
    probes, top = probes_of(trace), max(trace["rates"])
    ours = short_prompt_ttft_p90(probes, mode, top, threshold)
    colocated = short_prompt_ttft_p90(probes, "colocated", top, threshold)
    if ours is None or colocated is None:
        return f"{trace['trace']}: no completed prompt of <= {threshold} tokens at {top:g} req/s to compare"
    return (
        f"{trace['trace']}: TTFT p90 of prompts of <= {threshold} tokens at {top:g} req/s, {mode} "
        f"{1000 * ours:.0f} ms vs colocated {1000 * colocated:.0f} ms "
        f"({'met' if ours <= colocated else 'MISSED'})"
    )


def _judged(ratio: float | None, bar: float) -> str:
    """The ratio against its bar, judged at the two decimals printed (0.998 reads 1.00x and meets 1)."""
    return "-" if ratio is None else f"{ratio:.2f}x ({'met' if round(ratio, 2) >= bar else 'MISSED'})"


def _sweep_ratios(
    trace: dict, scales: list[float], target: float
) -> Iterator[tuple[str, tuple[float, float], float, dict[str, list[float]]]]:
    """Each sweep point as (sweep title, (TTFT scale, TPOT scale), s, every other mode's per-repeat ratios to
    colocated); a mode whose ratio is undefined there (colocated had no goodput) has an empty list."""
    probes, base = probes_of(trace), Slo.from_seconds(**trace["slo_base"])
    for title, points in sweeps(scales).items():
        for point, s in zip(points, scales, strict=True):
            g = goodputs(probes, base, point, target)
            yield title, point, s, {m: ratios(g[m], g["colocated"]) for m in g if m != "colocated"}


def verdict(trace: dict, scales: list[float], target: float, mode: str = "conditional") -> str:
    """The targets: a conditional mode never below colocated (median over repeats, every point; each sweep
    judged on its own), and >= 1.5x colocated where the TPOT SLO is at most 3x idle."""
    medians: dict[str, list[float]] = {title: [] for title in sweeps(scales)}
    tight = []
    for title, point, _, r in _sweep_ratios(trace, scales, target):
        if r[mode]:
            medians[title].append(spread(r[mode]).median)
            if point[1] <= TIGHT_TPOT_SCALE:
                tight.append(medians[title][-1])
    per_sweep = "; ".join(f"{title}: {_judged(min(m, default=None), 1.0)}" for title, m in medians.items())
    return (
        f"{trace['trace']}: lowest {mode} / colocated median ratio, {per_sweep}; "
        f"lowest where TPOT SLO <= {TIGHT_TPOT_SCALE:g}x idle: {_judged(min(tight, default=None), 1.5)}"
    )


def within_control(trace: dict, scales: list[float], target: float, mode: str = "conditional") -> str | None:
    """The same target, read against the A/A control where the run has one: a point misses only when `mode`'s
    median ratio is below both 1 and what this host's noise alone did to a ratio there, the lowest repeat
    ratio of two identical colocated stacks read both ways (which of them is "colocated" is arbitrary: a
    control at 1.25x is colocated at 0.80x of the control). None without a control."""
    if CONTROL not in modes_of(trace):
        return None
    judged, below = 0, []
    for title, _, s, r in _sweep_ratios(trace, scales, target):
        ours, control = r[mode], r[CONTROL]
        if not ours or not control:
            continue
        judged += 1
        worst = min(min(control), 1 / max(control)) if max(control) > 0 else 0.0
        med, floor = round(spread(ours).median, 2), round(worst, 2)
        if med < min(1.0, floor):
            below.append(f"{title} at s = {s:g}: {med:.2f}x, control {floor:.2f}x")
    return (
        f"{trace['trace']}: {mode} / colocated below both 1 and the A/A control's lowest repeat "
        f"({CONTROL} / colocated) at {len(below)} of {judged} "
        f"points{': ' if below else ''}{'; '.join(below)} ({'MISSED' if below else 'met'})"
    )


def report(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"Goodput sweep: {cfg['repeats']} repeats of {len(result['traces'][0]['rates'])} rates x "
        f"{len(modes_of(result['traces'][0]))} modes per trace; "
        f"lengths / {cfg['length_scale']:g}, capped at {cfg['max_input_len']} in / {cfg['max_output_len']} "
        f"out; model hidden {cfg['hidden']}, {cfg['layers']} layers, float32, {cfg['threads']} torch thread "
        f"per worker; conditional: localPrefillMaxTokens {cfg['local_prefill_max_tokens']}, "
        f"prefillQueueTokens {cfg['prefill_queue_tokens']}, mixedDecodeRatio "
        f"{cfg.get('mixed_decode_ratio', 0):g}"
        + (
            f"; conditional-slo: the same, its router told a TPOT SLO of {cfg['slo_aware_tpot_ms']:g} ms "
            f"with localPrefillMaxTpotFraction {cfg['slo_aware_fraction']:g}"
            if cfg.get("slo_aware_tpot_ms")
            else ""
        )
        + ". Cells: median [min-max] over repeats; * = some repeat outside the grid.",
        "",
    ]
    for trace in result["traces"]:
        lines += list(
            trace_tables(trace, result["scales"], result["attainment_target"], short_prompt_tokens(cfg))
        )
        lines.append("")
    loads = result.get("load_average") or []
    foreign = [f for f in result.get("foreign_cpu_share") or [] if f is not None]
    if loads:
        lines.append(
            f"Load average (1 min), sampled before every probe: median {statistics.median(loads):.2f}, max "
            f"{max(loads):.2f}"
        )
    if foreign:
        lines.append(
            f"CPU share other processes used during each probe: median {statistics.median(foreign):.0%}, "
            f"max {max(foreign):.0%} (a verdict needs <= {QUIET_FOREIGN_SHARE:.0%})"
        )
    for key, what in (
        ("steal_cpu_share", "the hypervisor gave to other machines (steal)"),
        ("interrupt_cpu_share", "interrupt work (irq, softirq: mostly the bench's own loopback traffic)"),
    ):
        part = [f for f in result.get(key) or [] if f is not None]
        if part:
            lines.append(f"  of which {what}: median {statistics.median(part):.0%}, max {max(part):.0%}")
    reruns = result.get("rerun") or []
    if reruns:
        worst = max(r["foreign_cpu_share"] for r in reruns)
        lines.append(
            f"  {len(reruns)} attempt{'s' * (len(reruns) != 1)} thrown away and run again (other work took "
            f"up to {worst:.0%} of the CPUs); "
            "the shares above are the kept attempts'"
        )
    busy = busy_reason(loads, foreign, cfg.get("quiet_load", float("inf"))) if loads or foreign else None
    if busy:
        lines.append(f"No verdict: the host was busy ({busy}); rerun on a quiet host.")
    else:
        judged = [(t, mode) for t in result["traces"] for mode in CONDITIONAL_MODES if mode in modes_of(t)]
        scales, target = result["scales"], result["attainment_target"]
        lines += [verdict(t, scales, target, mode) for t, mode in judged]
        lines += [line for t, mode in judged if (line := within_control(t, scales, target, mode)) is not None]
        lines += [short_prompt_verdict(t, short_prompt_tokens(cfg), mode) for t, mode in judged]
    lines += [f"wall time {result['wall_s']:.0f} s", f"Trace: {result['trace_attribution']}"]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """One row per trace, one panel per sweep: goodput against the SLO scale, median and min-max per mode."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales, target = result["scales"], result["attainment_target"]
    rows = result["traces"]
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 4 * len(rows)), squeeze=False)
    for row, trace in zip(axes, rows, strict=True):
        probes, base = probes_of(trace), Slo.from_seconds(**trace["slo_base"])
        for ax, (title, points) in zip(row, sweeps(scales).items(), strict=True):
            for mode in modes_of(trace):
                per_point = [goodputs(probes, base, p, target)[mode] for p in points]
                spreads = [spread([g.rate for g in gs]) for gs in per_point]
                med = [s.median for s in spreads]
                err = [
                    [m - s.low for m, s in zip(med, spreads, strict=True)],
                    [s.high - m for m, s in zip(med, spreads, strict=True)],
                ]
                ax.errorbar(scales, med, yerr=err, marker="o", capsize=3, label=mode)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xticks(scales, [f"{s:g}" for s in scales])
            ax.set_xlabel("s (SLO = s x idle latency)")
            ax.set_ylabel(f"goodput, req/s at {target:.0%}")
            ax.set_title(f"{trace['trace']}: {title}", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
