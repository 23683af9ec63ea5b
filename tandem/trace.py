"""Request traces (the Azure LLM inference CSVs, or JSONL with a timestamp and token counts), read the same
way by the load generator and the autoscaler's simulator."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (Microsoft AzurePublicDataset, CC BY 4.0). Patel et al., "
    '"Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.'
)

# Field names recognised in JSONL traces, first match wins.
TIME_FIELDS = ("timestamp", "time", "arrival_time", "arrival_s", "ts", "TIMESTAMP")
INPUT_FIELDS = ("input_length", "input_len", "input_tokens", "prompt_tokens", "prompt_len", "ContextTokens")
OUTPUT_FIELDS = ("output_length", "output_len", "output_tokens", "completion_tokens", "GeneratedTokens")
MS_THRESHOLD = 1e11  # a numeric timestamp above this is epoch milliseconds (1e11 s is year 5138)


class TraceRequest(NamedTuple):
    """One request of a trace: seconds after the first, prompt tokens, generated tokens."""

    arrival_s: float
    input_len: int
    output_len: int


def parse_timestamp(value: Any, unit: str = "auto") -> float:
    """Seconds as a float: a number (s, or ms when `unit` says so or it is epoch ms), or a wall-clock time
    like '2023-11-16 18:17:03.9799600' (naive times read as UTC)."""
    if isinstance(value, int | float) or _is_number(str(value)):
        number = float(value)
        if unit == "ms" or (unit == "auto" and number > MS_THRESHOLD):
            return number / 1000
        return number
    text = str(value).strip()
    if "." in text:  # fromisoformat takes up to 6 fractional digits reliably: trim longer fractions
        head, frac = text.rsplit(".", 1)
        digits = "".join(ch for ch in frac if ch.isdigit())
        text = f"{head}.{digits[:6]}{frac[len(digits) :]}"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # naive: read as UTC so no DST shift lands between rows
    return parsed.timestamp()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _relative(rows: list[tuple[float, int, int]]) -> list[TraceRequest]:
    if not rows:
        return []
    t0 = rows[0][0]
    return [TraceRequest(t - t0, n_in, n_out) for t, n_in, n_out in rows]


def parse_azure_csv(lines: Iterable[str]) -> list[TraceRequest]:
    """Rows `TIMESTAMP,ContextTokens,GeneratedTokens` -> requests, timestamps relative to the first row."""
    rows = list(csv.DictReader(lines))
    if not rows:
        return []
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(rows[0])
    if missing:
        raise ValueError(f"trace CSV lacks columns {sorted(missing)}")
    return _relative(
        [(parse_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows]
    )


def _field(record: dict[str, Any], names: tuple[str, ...], what: str) -> Any:
    for name in names:
        if name in record:
            return record[name]
    raise ValueError(f"trace record has no {what} field (looked for {', '.join(names)}): {sorted(record)}")


def parse_jsonl(lines: Iterable[str], time_unit: str = "auto") -> list[TraceRequest]:
    """Lines of {"timestamp": s, "input_length": n, "output_length": m} (or the other recognised names).
    Mooncake traces (records with `hash_ids`, Dynamo's replay format) count time in milliseconds."""
    records = [json.loads(line) for line in lines if line.strip()]
    if time_unit == "auto" and records and "hash_ids" in records[0]:
        time_unit = "ms"
    return _relative(
        [
            (
                parse_timestamp(_field(r, TIME_FIELDS, "timestamp"), time_unit),
                int(_field(r, INPUT_FIELDS, "input length")),
                int(_field(r, OUTPUT_FIELDS, "output length")),
            )
            for r in records
        ]
    )


def load_trace(path: str | Path, time_unit: str = "auto") -> list[TraceRequest]:
    """Read a trace file, choosing the parser by extension (.jsonl/.json -> JSONL, otherwise CSV)."""
    path = Path(path)
    with path.open(newline="") as f:
        if path.suffix in (".jsonl", ".json"):
            return parse_jsonl(f, time_unit)
        return parse_azure_csv(f)


def attribution_for(path: str | Path | None) -> str | None:
    """The attribution to publish with results from this trace, if it is one of the Azure traces."""
    if path is None:
        return None
    return AZURE_ATTRIBUTION if "azure" in Path(path).name.lower() else None


def scale_rate(requests: list[TraceRequest], factor: float, spread_s: float = 10.0) -> list[TraceRequest]:
    """The trace at `factor` x its arrival rate, with its rate curve kept above `spread_s`: whole copies
    shifted by fractions of `spread_s`, plus every n-th request once more for a fractional part."""
    if factor <= 0:
        raise ValueError(f"rate factor must be positive, got {factor}")
    whole, part = int(factor), factor - int(factor)
    copies = [(i * spread_s / factor, requests) for i in range(whole)]
    if part > 1e-9:
        step = 1 / part
        extra = [r for i, r in enumerate(requests) if int(i / step) != int((i + 1) / step)]
        copies.append((whole * spread_s / factor, extra))
    merged = [
        TraceRequest(r.arrival_s + shift, r.input_len, r.output_len) for shift, rs in copies for r in rs
    ]
    return sorted(merged, key=lambda r: r.arrival_s)


def to_mooncake_jsonl(requests: Iterable[TraceRequest], block_tokens: int = 512) -> Iterable[str]:
    """Mooncake JSONL lines (Dynamo's replay format): timestamp in ms, lengths, and hash ids of the prompt's
    `block_tokens`-token blocks. The Azure traces carry no prompt text, so no two requests share a block."""
    next_id = 0
    for r in requests:
        blocks = max(1, -(-r.input_len // block_tokens))
        ids = list(range(next_id, next_id + blocks))
        next_id += blocks
        line = {
            "timestamp": round(r.arrival_s * 1000, 3),
            "input_length": r.input_len,
            "output_length": max(r.output_len, 1),
            "hash_ids": ids,
        }
        yield json.dumps(line)


def diurnal(
    requests: list[TraceRequest], hours: int = 24, low: float = 1.0, high: float = 8.0, hour_s: float = 3600.0
) -> list[TraceRequest]:
    """A day from a shorter trace: hour h replays the next `hour_s` of the trace (wrapping) at a rate factor
    on a cosine from `low` at 04:00 to `high` at 16:00. `hour_s` below 3600 compresses the day's curve (not
    the requests' own timing): 900 makes the 24 hours of the curve last 6."""
    if not requests:
        return []
    span = max(r.arrival_s for r in requests) + 1e-9
    day: list[TraceRequest] = []
    for h in range(hours):
        factor = low + (high - low) * (1 - math.cos(2 * math.pi * (h - 4) / 24)) / 2
        start = (h * hour_s) % span
        window = [r for r in requests if start <= r.arrival_s < start + hour_s]
        if start + hour_s > span:  # wrap around the end of the trace
            window += [
                TraceRequest(r.arrival_s + span, r.input_len, r.output_len)
                for r in requests
                if r.arrival_s < start + hour_s - span
            ]
        shifted = [TraceRequest(r.arrival_s - start + h * hour_s, r.input_len, r.output_len) for r in window]
        day += scale_rate(shifted, factor)
    return sorted(day, key=lambda r: r.arrival_s)


def windows(requests: list[TraceRequest], count: int) -> list[tuple[float, list[TraceRequest]]]:
    """The trace cut into `count` consecutive windows of equal length, each as (its start in the trace, its
    requests with times from the window's start): every request in exactly one window."""
    if count < 1:
        raise ValueError(f"window count must be at least 1, got {count}")
    if not requests:
        return []
    span = max(r.arrival_s for r in requests) + 1e-9
    length = span / count
    cut: list[list[TraceRequest]] = [[] for _ in range(count)]
    for r in requests:
        cut[min(int(r.arrival_s / length), count - 1)].append(r)
    return [
        (i * length, [TraceRequest(r.arrival_s - i * length, r.input_len, r.output_len) for r in rs])
        for i, rs in enumerate(cut)
    ]
