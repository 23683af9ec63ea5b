"""bench.autoscale_dynamo's results as a table: each family's cost at the target, and their ratios."""

from __future__ import annotations

from typing import Any

from bench._anchor_replay import Case
from bench._anchor_search import Point, cost_at


def summarise(points: dict[Case, list[Point]], target: float) -> list[dict[str, Any]]:
    rows = []
    for case, ps in points.items():
        row: dict[str, Any] = {
            "trace": case.label,
            "slo_ttft_ms": case.slo_ttft_ms,
            "startup_s": case.startup_s,
        }
        for family in ("static", "dynamo", "hpa", "tandem", "auto"):
            mine = [p for p in ps if p.family == family]
            if not mine:
                continue
            cost, why = cost_at(mine, target)
            row[family] = cost
            row[f"{family}_how"] = why
            reaching = [p for p in mine if p.attainment >= target]
            cheapest = min(reaching, key=lambda p: p.gpu_hours) if reaching else None
            row[f"{family}_reversals_per_hour"] = cheapest.reversals_per_hour if cheapest else None
            row[f"{family}cheapest_fixed"] = cheapest.setting if cheapest else None
            if family == "auto":
                row["auto_shape_changes_per_hour"] = cheapest.shape_changes_per_hour if cheapest else None
        for mine in ("tandem", "auto"):
            if row.get(mine) and row.get("static"):
                row[f"{mine}_vs_static"] = row[mine] / row["static"]
        for other in ("dynamo", "hpa"):
            if row.get("tandem") and row.get(other):
                row[f"tandem_vs_{other}"] = row["tandem"] / row[other]
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], target: float) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"

    def cost(r: dict[str, Any], family: str) -> str:
        how = r.get(f"{family}_how", "")
        return how if r.get(family) is None else f"{r[family]:.2f} ({how})"

    head = (
        f"| trace | TTFT SLO ms | cold start s | cheapest fixed pool GPU-h at {target:.0%} | Dynamo planner "
        "| HPA | tandem | tandem / fixed | tandem / Dynamo | tandem reversals/h | auto | auto / fixed | auto "
        "shape changes/h |"
    )
    lines = [head, "| " + " | ".join(["---"] * 13) + " |"]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['slo_ttft_ms']:g} | {r['startup_s']:g} | {cost(r, 'static')} "
            f"| {cost(r, 'dynamo')} | {cost(r, 'hpa')} | {cost(r, 'tandem')} "
            f"| {fmt(r.get('tandem_vs_static'))} | {fmt(r.get('tandem_vs_dynamo'))} | "
            f"{fmt(r.get('tandem_reversals_per_hour'))} | {cost(r, 'auto')} | {fmt(r.get('auto_vs_static'))} "
            f"| {fmt(r.get('auto_shape_changes_per_hour'))} |"
        )
    return "\n".join(lines)
