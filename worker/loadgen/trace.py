"""Trace files to workloads: the Azure LLM inference CSVs and a JSONL of timestamp/input_len/output_len."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from tandem.worker.loadgen.workload import RequestSpec

AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (Microsoft AzurePublicDataset, CC BY 4.0). Patel et al., "
    '"Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.'
)


def _parse_timestamp(value: str) -> float:
    """Seconds as a float: a plain number, or a wall-clock time like '2023-11-16 18:17:03.9799600'."""
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    # fromisoformat in 3.11 accepts up to 6 fractional digits reliably; trim longer fractions.
    if "." in value:
        head, frac = value.rsplit(".", 1)
        digits = "".join(ch for ch in frac if ch.isdigit())
        rest = frac[len(digits) :]
        value = f"{head}.{digits[:6]}{rest}"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # naive: read as UTC so no DST shift lands between rows
    return parsed.timestamp()


def parse_azure_csv(lines: Iterable[str]) -> list[RequestSpec]:
    """Rows `TIMESTAMP,ContextTokens,GeneratedTokens` -> specs, timestamps relative to the first row."""
    rows = list(csv.DictReader(lines))
    if not rows:
        return []
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(rows[0])
    if missing:
        raise ValueError(f"trace CSV lacks columns {sorted(missing)}")
    times = [_parse_timestamp(r["TIMESTAMP"]) for r in rows]
    t0 = times[0]
    return [
        RequestSpec(t - t0, int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for t, r in zip(times, rows, strict=True)
    ]


def parse_jsonl(lines: Iterable[str]) -> list[RequestSpec]:
    """Lines of {"timestamp": s, "input_len": n, "output_len": m} -> specs relative to the first line."""
    records = [json.loads(line) for line in lines if line.strip()]
    if not records:
        return []
    times = [_parse_timestamp(str(r["timestamp"])) for r in records]
    t0 = times[0]
    return [
        RequestSpec(t - t0, int(r["input_len"]), int(r["output_len"]))
        for t, r in zip(times, records, strict=True)
    ]


def load_trace(path: str | Path) -> list[RequestSpec]:
    """Read a trace file, choosing the parser by extension (.jsonl/.json -> JSONL, otherwise CSV)."""
    path = Path(path)
    with path.open(newline="") as f:
        if path.suffix in (".jsonl", ".json"):
            return parse_jsonl(f)
        return parse_azure_csv(f)


def attribution_for(path: str | Path | None) -> str | None:
    """The attribution to publish with results from this trace, if it is one of the Azure traces."""
    if path is None:
        return None
    return AZURE_ATTRIBUTION if "azure" in Path(path).name.lower() else None
