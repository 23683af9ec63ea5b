"""Trace files to workloads: the shared trace reader (`tandem.trace`) made into load generator requests."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tandem import trace
from tandem.loadgen.workload import RequestSpec
from tandem.trace import AZURE_ATTRIBUTION, attribution_for

__all__ = ["AZURE_ATTRIBUTION", "attribution_for", "load_trace", "parse_azure_csv", "parse_jsonl"]


def _specs(requests: list[trace.TraceRequest]) -> list[RequestSpec]:
    return [RequestSpec(r.arrival_s, r.input_len, r.output_len) for r in requests]


def parse_azure_csv(lines: Iterable[str]) -> list[RequestSpec]:
    return _specs(trace.parse_azure_csv(lines))


def parse_jsonl(lines: Iterable[str]) -> list[RequestSpec]:
    return _specs(trace.parse_jsonl(lines))


def load_trace(path: str | Path) -> list[RequestSpec]:
    return _specs(trace.load_trace(path))
