"""Where the request traces the benches and tests replay live: in the repository, beside the benches."""

from __future__ import annotations

from pathlib import Path

TRACES = Path(__file__).resolve().parent / "traces"
CONV = TRACES / "azure_llm_2023_conv.csv"
CODE = TRACES / "azure_llm_2023_code.csv"
