"""bench.goodput_dynamo's results as a reader sees them: the markdown tables and the goodput curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench._goodput_dynamo_grid import ATTAINMENT, FIXED_TTFT_SCALE, rate_of
from tandem.profile_compare import profile_caption


def write_plot(traces: list[dict[str, Any]], path: Path) -> Path:
    """The goodput curves: per trace, goodput per GPU against the TPOT SLO (TTFT at 5x idle), aggregated and
    the best disaggregated split, each point of the split named (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = f"TTFT at {FIXED_TTFT_SCALE:g}x idle, TPOT at s x idle"
    fig, axes = plt.subplots(1, len(traces), figsize=(5.2 * len(traces), 3.8), squeeze=False)
    for ax, t in zip(axes[0], traces, strict=True):
        rows = t["tables"][sweep]
        xs = [r["tpot_scale"] for r in rows]
        for key, label, colour in (
            ("aggregated", "aggregated", "tab:gray"),
            ("disaggregated", "disaggregated (best split)", "tab:blue"),
        ):
            ax.plot(xs, [rate_of(r[key]) for r in rows], marker="o", color=colour, label=label)
        for x, r in zip(xs, rows, strict=True):
            if rate_of(r["disaggregated"]) is not None:
                ax.annotate(
                    r["split"],
                    (x, rate_of(r["disaggregated"])),
                    textcoords="offset points",
                    xytext=(0, -12),
                    ha="center",
                    fontsize=7,
                    color="tab:blue",
                )
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(xs, [f"{x:g}x" for x in xs])
        ax.set_title(f"{t['trace']}, TTFT SLO {FIXED_TTFT_SCALE:g}x idle", fontsize=9)
        ax.set_xlabel("TPOT SLO (x idle TPOT)")
        ax.set_ylabel("goodput per GPU (req/s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(result: dict[str, Any]) -> str:
    cfg = result["config"]
    referee = "tandem's simulator" if cfg.get("referee") == "simulate" else "Dynamo's replay"
    lines = [
        f"Goodput per GPU (req/s/GPU with >= {ATTAINMENT:.0%} of requests meeting TTFT and TPOT) in "
        f"{referee}, engine profile {result.get('profile') or profile_caption('')}, {cfg['gpus']} GPUs: "
        f"aggregated ({cfg['gpus']} workers) vs disaggregated (best P+D split); '<' below the lowest probed "
        f"rate, '>=' at least the highest; {result['replays']} replays.",
    ]
    for t in result["traces"]:
        idle = "; ".join(
            f"{k} TTFT {v['ttft_ms']:.1f} ms, TPOT {v['tpot_ms']:.2f} ms" for k, v in t["idle"].items()
        )
        lines += [
            "",
            f"#### {t['trace']} (first {t['rows']} rows, {t['native_rate']:.2f} req/s; median request "
            f"{t['median_request']['input_len']} in / {t['median_request']['output_len']} out)",
            "",
            f"Idle: {idle}. Prompts of <= {cfg['local_prefill_max_tokens']} tokens (tandem's conditional "
            f"rule prefills them on the decode worker): {t['share_local']:.0%}.",
        ]
        for title, rows in t["tables"].items():
            lines += [
                "",
                f"{title}:",
                "",
                "| s | TTFT / TPOT SLO, ms | aggregated | disaggregated (split) | disaggregated / aggregated "
                "|",
                "| --- | --- | --- | --- | --- |",
            ]
            for r in rows:
                ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
                lines.append(
                    f"| {r['tpot_scale']:g} | {r['slo_ttft_ms']:.0f} / {r['slo_tpot_ms']:.1f} | "
                    f"{r['aggregated']} | {r['disaggregated']} ({r['split']}) | {ratio} |"
                )
        if all("auto" in r for rows in t["tables"].values() for r in rows):  # runs before auto have none
            lines += ["", *auto_table(t["tables"])]
    return "\n".join(lines)


def auto_table(tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """`auto` beside the fixed pools, TTFT at 5x idle: its shape at its goodput, and the ratios."""
    rows = tables[f"TTFT at {FIXED_TTFT_SCALE:g}x idle, TPOT at s x idle"]
    lines = [
        f"`auto` on the same GPUs (TTFT at {FIXED_TTFT_SCALE:g}x idle): the rule's shape at its goodput (as "
        "sized for the load / its pool on the budget); its goodput with its choice of kind (a split read as "
        "the best split) and with the rule's own split:",
        "",
        "| TPOT s | auto chose | auto (kind) | auto (its split) | aggregated | disaggregated (split) | "
        "auto (kind) / aggregated | auto (kind) / disaggregated | live auto (GPUs held, shape changes) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    def live(v: dict[str, Any] | None) -> str:
        if v is None:
            return "-"
        held = "-" if v["gpus_held"] is None else f"{v['gpus_held']:.1f}, {v['shape_changes']}"
        return f"{v['goodput']} ({held})"

    for r in rows:
        a = r["auto"]
        lines.append(
            f"| {r['tpot_scale']:g} | {a['shape']} / {a['pool']} | {a['kind_goodput']} | {a['goodput']} | "
            f"{r['aggregated']} | {r['disaggregated']} ({r['split']}) | {ratio(a['kind_vs_aggregated'])} | "
            f"{ratio(a['kind_vs_disaggregated'])} | {live(r.get('live_auto'))} |"
        )
    return lines
