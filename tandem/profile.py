"""A worker's measured capacity (prefill time vs prompt length, decode step time vs batch and context).

`tandem profile` writes it from the real engine; the autoscaler's capacity model and the trace simulator
read it. The JSON format (all times in milliseconds):

    {
      "model": "tiny", "device": "cpu", "dtype": "float32",
      "prefill_chunk_tokens": 512,        # the chunk the prefill points were measured with
      "max_running_sequences": 64,        # the decode batch cap of the profiled engine
      "kv_capacity_tokens": 16384,        # KV blocks x block size of one decode replica
      "cold_start_ms": 1200,              # engine build + weight load + warm-up, one replica
      "kv_transfer_ms_per_token": 0.002,  # prefill -> decode KV push, per prompt token
      "prefill": [{"prompt_tokens": 128, "chunk_tokens": 512, "ms": 9.1}, ...],
      "decode":  [{"batch": 1, "context_tokens": 256, "step_ms": 4.2}, ...],
      "scale": {"prefill": 1.0, "decode": 1.0, "note": "as measured"},
      "provenance": {                     # optional: how `tandem profile` made it
        "command": "tandem profile --model ...", "date": "2026-12-05T03:00:00Z", "commit": "2520fe0...",
        "torch": "2.9.0", "device_name": "NVIDIA H200",
        "engine": {"attention": "triton", "decode_step": "cudaGraphs", "quantization": "none", ...},
        "startup_s": {"load": 4.1, "kv_plan": 0.9, "warmup": 21.0, "decode_graphs": 18.2}
      }
    }

`cold_start_ms` of a measured profile is load + kv_plan + warmup of `startup_s` (the worker's own startup
phases, `tandem_worker_startup_seconds`; warmup includes the decode graphs): the engine's part of a replica's
start, without the pod's scheduling, image pull and interpreter start.

Prefill time between measured prompt lengths is interpolated linearly (and extrapolated from the last two
points); decode step time is the least-squares fit (in relative error) `a + b*batch + c*batch*context`, the
shape of a step that reads the weights once and every running sequence's KV.
"""

from __future__ import annotations

import bisect
import json
from functools import cached_property
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class PrefillPoint(BaseModel):
    prompt_tokens: int = Field(gt=0)
    chunk_tokens: int = Field(gt=0)
    ms: float = Field(gt=0)


class DecodePoint(BaseModel):
    batch: int = Field(gt=0)
    context_tokens: int = Field(gt=0)
    step_ms: float = Field(gt=0)


class ProfileScale(BaseModel):
    """How far the measured times were divided for a what-if (1.0 = as measured)."""

    prefill: float = Field(default=1.0, gt=0)
    decode: float = Field(default=1.0, gt=0)
    note: str = "as measured"


class Provenance(BaseModel):
    """How a measured profile was made: the command to make it again, and what it ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str
    date: str  # ISO 8601, UTC
    commit: str | None = None  # the source tree's git commit, where there was one
    torch: str
    device_name: str  # torch.cuda.get_device_name, or the CPU's model name
    engine: dict[str, str] = Field(default_factory=dict)  # the serving knobs, as the worker's flags name them
    startup_s: dict[str, float] = Field(default_factory=dict)  # the worker's startup phases (STARTUP_PHASES)


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ignored_types=(cached_property,))

    model: str
    device: str
    dtype: str
    prefill_chunk_tokens: int = Field(gt=0)
    max_running_sequences: int = Field(gt=0)
    kv_capacity_tokens: int = Field(gt=0)
    cold_start_ms: float = Field(ge=0)
    kv_transfer_ms_per_token: float = Field(default=0.0, ge=0)
    prefill: list[PrefillPoint]
    decode: list[DecodePoint]
    scale: ProfileScale = Field(default_factory=ProfileScale)
    provenance: Provenance | None = None  # None: a profile converted or written by hand

    @model_validator(mode="after")
    def _enough_points(self) -> Profile:
        if len({p.prompt_tokens for p in self._prefill_points()}) < 2:
            raise ValueError(f"prefill needs >= 2 prompt lengths at chunk {self.prefill_chunk_tokens}")
        if len({(p.batch, p.context_tokens) for p in self.decode}) < 3:
            raise ValueError("decode needs >= 3 distinct (batch, context) points")
        return self

    def _prefill_points(self) -> list[PrefillPoint]:
        return sorted(
            (p for p in self.prefill if p.chunk_tokens == self.prefill_chunk_tokens),
            key=lambda p: p.prompt_tokens,
        )

    @cached_property
    def _prefill_curve(self) -> tuple[list[float], list[float]]:
        # Several measurements of one length: keep their mean.
        by_len: dict[int, list[float]] = {}
        for p in self._prefill_points():
            by_len.setdefault(p.prompt_tokens, []).append(p.ms)
        xs = sorted(by_len)
        return [float(x) for x in xs], [sum(by_len[x]) / len(by_len[x]) for x in xs]

    @cached_property
    def _decode_fit(self) -> tuple[float, float, float]:
        rows = np.array([[1.0, p.batch, p.batch * p.context_tokens] for p in self.decode])
        ys = np.array([p.step_ms for p in self.decode])
        # Relative error: a 15 ms step and a 500 ms step count alike, so small batches are not fitted away.
        coef, *_ = np.linalg.lstsq(rows / ys[:, None], np.ones_like(ys), rcond=None)
        a, b, c = (max(float(v), 0.0) for v in coef)  # a step never gets faster with more work
        return a, b, c

    def prefill_ms(self, prompt_tokens: float) -> float:
        """Service time of one prompt of this length on an idle replica (chunked at the profiled chunk)."""
        xs, ys = self._prefill_curve
        x = max(float(prompt_tokens), 1.0)
        i = bisect.bisect_left(xs, x)
        lo = min(max(i - 1, 0), len(xs) - 2)
        x0, x1, y0, y1 = xs[lo], xs[lo + 1], ys[lo], ys[lo + 1]
        value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return max(value, ys[0] * x / xs[0] if x < xs[0] else 0.0, 1e-3)

    def decode_step_ms(self, batch: float, context_tokens: float) -> float:
        """One decode step with `batch` running sequences of mean context `context_tokens`."""
        a, b, c = self._decode_fit
        batch = max(batch, 1.0)
        return max(a + b * batch + c * batch * context_tokens, 1e-3)

    def scaled(self, prefill: float = 1.0, decode: float = 1.0, note: str = "") -> Profile:
        """A what-if: prefill `prefill` times and decode `decode` times faster than measured."""
        data = self.model_dump()  # a fresh model, so no cached fit of this one carries over
        data["prefill"] = [{**p, "ms": p["ms"] / prefill} for p in data["prefill"]]
        data["decode"] = [{**p, "step_ms": p["step_ms"] / decode} for p in data["decode"]]
        data["kv_transfer_ms_per_token"] = self.kv_transfer_ms_per_token / prefill
        data["scale"] = {
            "prefill": self.scale.prefill * prefill,
            "decode": self.scale.decode * decode,
            "note": note or f"prefill x{prefill:g}, decode x{decode:g} faster than measured",
        }
        return Profile.model_validate(data)


def load_profile(path: str | Path) -> Profile:
    return Profile.model_validate(json.loads(Path(path).read_text()))


def save_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(profile.model_dump_json(indent=2) + "\n")


SHIPPED_DIR = Path(__file__).resolve().parent / "profiles"


DEFAULT_GPU_PROFILE = (
    "h200-llama-3.1-8b-fp8"  # Dynamo's measured H200 profile, converted (profiles/README.md)
)


def shipped_profile(name: str = "tiny-cpu") -> Profile:
    """A profile that ships with tandem (`tandem/profiles/NAME.json`)."""
    return load_profile(SHIPPED_DIR / f"{name}.json")


def profile_named(name_or_path: str | None) -> Profile:
    """A profile file, or a shipped profile's name; None: the shipped GPU profile."""
    if not name_or_path:
        return shipped_profile(DEFAULT_GPU_PROFILE)
    if (SHIPPED_DIR / f"{name_or_path}.json").is_file():
        return shipped_profile(name_or_path)
    return load_profile(name_or_path)
