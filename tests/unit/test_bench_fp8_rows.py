"""The FP8 bench rows stand beside the figures of the shipped vLLM FP8 profile (NVIDIA's H200 measurement)."""

from __future__ import annotations

import json

import pytest

from bench.fp8_rows import PROFILE, vllm_figures


def test_the_vllm_figures_are_the_profiles_batch_1_batch_49_at_3k_and_2134_token_prefill():
    figures = vllm_figures(json.loads(PROFILE.read_text()))
    assert figures["batch 1"] == pytest.approx(4.38, abs=0.01)
    assert figures["batch 49"] == pytest.approx(9.94, abs=0.01)
    assert figures["prefill"] == pytest.approx(49.97, abs=0.01)
