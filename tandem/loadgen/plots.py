"""PNG plots of a run: latency CDFs (TTFT, TPOT, ITL, e2e) and throughput over time (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tandem.loadgen.report import throughput_timeseries  # noqa: E402
from tandem.loadgen.result import RequestResult  # noqa: E402


def _cdf(ax, values_s: Sequence[float], title: str, slo_ms: float | None) -> None:
    ax.set_title(title)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests" if "ITL" not in title else "fraction of gaps")
    ax.grid(True, alpha=0.3)
    if not values_s:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    xs = sorted(1000 * v for v in values_s)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post")
    if slo_ms is not None:
        ax.axvline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
        ax.legend(loc="lower right")
    ax.set_ylim(0, 1.02)


def plot_latency_cdfs(
    results: Sequence[RequestResult],
    path: Path,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> Path:
    ok = [r for r in results if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    _cdf(axes[0][0], [r.ttft_s for r in ok if r.ttft_s is not None], "TTFT", slo_ttft_ms)
    _cdf(axes[0][1], [t for r in ok if (t := r.tpot_s) is not None], "TPOT", slo_tpot_ms)
    _cdf(axes[1][0], [g for r in ok for g in r.itls_s], "ITL (inter-token latency)", None)
    _cdf(axes[1][1], [r.e2e_s for r in ok if r.e2e_s is not None], "end-to-end latency", None)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput(results: Sequence[RequestResult], path: Path, bin_s: float = 1.0) -> Path:
    series = throughput_timeseries(results, bin_s)
    fig, ax_tok = plt.subplots(figsize=(11, 4.5))
    ax_tok.set_title(f"throughput over time ({bin_s:.3g} s bins)")
    ax_tok.set_xlabel("time since start (s)")
    ax_tok.set_ylabel("output tokens/s", color="tab:blue")
    ax_req = ax_tok.twinx()
    ax_req.set_ylabel("completed requests/s", color="tab:orange")
    if series:
        # step "post" draws bin i over [t_i, t_i + bin_s): repeat the last value so the last bin shows
        ts = [t for t, _, _ in series] + [series[-1][0] + bin_s]
        toks = [tok for _, tok, _ in series]
        reqs = [req for _, _, req in series]
        ax_req.step(
            ts, reqs + reqs[-1:], where="post", color="tab:orange", linestyle="--", label="requests/s"
        )
        ax_tok.step(ts, toks + toks[-1:], where="post", color="tab:blue", label="output tokens/s")
        ax_tok.set_ylim(bottom=0)
        ax_req.set_ylim(bottom=0)
        lines = ax_tok.get_lines() + ax_req.get_lines()
        ax_tok.legend(lines, [str(line.get_label()) for line in lines], loc="upper left")
    ax_tok.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
