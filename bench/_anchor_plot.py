"""The Pareto plot of the autoscaling comparison: GPU-hours against joint SLO attainment, one panel per case,
each policy family's settings and its front, the attainment target as a line (matplotlib, Agg)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from bench._anchor_search import Point, pareto

FAMILIES = {
    "static": ("fixed pools (hindsight)", "tab:gray", "s"),
    "dynamo": ("Dynamo planner", "tab:red", "^"),
    "tandem": ("tandem", "tab:blue", "o"),
    "hpa": ("HPA", "tab:green", "D"),
}


def front_series(points: Iterable[Point]) -> dict[str, tuple[list[float], list[float]]]:
    """Per family, its Pareto front as (GPU-hours, attainment in %), cheapest first: what each panel draws as
    a line over the family's settings."""
    by_family: dict[str, list[Point]] = {}
    for p in points:
        by_family.setdefault(p.family, []).append(p)
    return {
        fam: ([p.gpu_hours for p in front], [100 * p.attainment for p in front])
        for fam, ps in by_family.items()
        for front in [pareto(ps)]
    }


def write_pareto_plot(panels: Mapping[str, list[Point]], path: str | Path, target: float) -> Path:
    """One panel per case title: every setting as a marker, each family's front as a line, the target
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("nothing to plot: no case has any point")
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax, (title, points) in zip([a for row in axes for a in row], panels.items(), strict=False):
        for fam, (xs, ys) in front_series(points).items():
            name, colour, marker = FAMILIES.get(fam, (fam, "k", "x"))
            mine = [p for p in points if p.family == fam]
            ax.scatter(
                [p.gpu_hours for p in mine],
                [100 * p.attainment for p in mine],
                color=colour,
                marker=marker,
                alpha=0.45,
                s=22,
            )
            ax.step(xs, ys, where="post", color=colour, label=name)
        ax.axhline(100 * target, color="k", linestyle="--", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel("joint SLO attainment (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in [a for row in axes for a in row][len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


DAY_SERIES = {
    "auto": ("auto (colocated or split)", "tab:blue"),
    "tandem": ("tandem, split only", "tab:orange"),
}


def day_choice(points: Iterable[Point], family: str, target: float) -> Point | None:
    """A family's setting a day plot draws: its cheapest that reaches `target`, else its best attainment."""
    mine = [p for p in points if p.family == family]
    reaching = [p for p in mine if p.attainment >= target]
    if reaching:
        return min(reaching, key=lambda p: p.gpu_hours)
    return max(mine, key=lambda p: p.attainment, default=None)


def fixed_gpus(setting: str) -> int:
    """GPUs of a fixed pool setting: `static:P,D` or `colocated:N`."""
    kind, _, arg = setting.partition(":")
    return sum(int(x) for x in arg.split(",")) if kind == "static" else int(arg)


def write_day_plot(panels: Mapping[str, list[Point]], path: str | Path, target: float, hour_s: float) -> Path:
    """One panel per day: GPUs billed over the day's hours for `auto` and split-only tandem (the settings
    `day_choice` picks), and the cheapest fixed pool that reaches `target` as a flat line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("nothing to plot: no day was run")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 3.8), squeeze=False)
    for ax, (title, points) in zip(axes[0], panels.items(), strict=True):
        for fam, (name, colour) in DAY_SERIES.items():
            p = day_choice(points, fam, target)
            if p is None or not p.gpus_over_time:
                continue
            t, gpus = zip(*p.gpus_over_time, strict=True)
            label = f"{name}: {p.gpu_hours:.1f} GPU-h, {p.attainment:.1%}"
            ax.step([x / hour_s for x in t], gpus, where="post", color=colour, label=label)
        fixed = [p for p in points if p.family == "static" and p.attainment >= target]
        if fixed:
            f = min(fixed, key=lambda p: p.gpu_hours)
            name = f.setting.replace("static:", "fixed ").replace("colocated:", "fixed colocated ")
            ax.axhline(
                fixed_gpus(f.setting),
                color="tab:gray",
                linestyle="--",
                label=f"{name}: {f.gpu_hours:.1f} GPU-h, {f.attainment:.1%}",
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("hour of the day")
        ax.set_ylabel("GPUs")
        ax.set_xlim(0, 24)
        ax.set_xticks(range(0, 25, 4))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
