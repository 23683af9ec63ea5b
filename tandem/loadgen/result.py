"""The record one request leaves behind, and the latencies derived from it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestResult:
    """What one request measured. Times are seconds; `start_s` and `token_times_s` are relative to the
    start of the run, so results from many requests share one clock."""

    input_len: int
    output_len: int  # requested
    start_s: float = 0.0
    end_s: float = 0.0  # when the request finished, successfully or not
    ok: bool = False
    status: str = ""  # HTTP status code as text, or the exception class for transport errors
    error: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0  # from usage when the server reports it, else the number of content chunks
    usage_reported: bool = False
    token_times_s: list[float] = field(default_factory=list)  # arrival of each content chunk

    @property
    def itls_s(self) -> list[float]:
        """Gaps between consecutive content chunks."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (tokens - 1); undefined for a failed request or a single token."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
