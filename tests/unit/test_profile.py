"""The profile format: interpolation, the decode fit, scaling, and the shipped tiny-model profile."""

import pytest

from tandem.profile import PrefillPoint, Profile, load_profile, save_profile
from tests.unit.autoscale_fixtures import linear_profile


def test_prefill_interpolates_and_extrapolates_linearly():
    p = linear_profile()
    assert p.prefill_ms(100) == pytest.approx(10.0)
    assert p.prefill_ms(550) == pytest.approx(55.0)
    assert p.prefill_ms(8000) == pytest.approx(800.0)  # beyond the last point: the last segment's slope
    assert p.prefill_ms(50) == pytest.approx(5.0)


def test_decode_fit_recovers_the_step_model():
    p = linear_profile()
    assert p.decode_step_ms(16, 512) == pytest.approx(18.0, rel=1e-6)
    assert p.decode_step_ms(0, 512) == pytest.approx(10.5)  # a step runs at least one sequence


def test_scaled_profile_divides_times_and_records_it(tmp_path):
    p = linear_profile().scaled(prefill=4.0, decode=2.0)
    assert p.prefill_ms(1000) == pytest.approx(25.0)
    assert p.decode_step_ms(16, 512) == pytest.approx(9.0, rel=1e-6)
    assert (p.scale.prefill, p.scale.decode) == (4.0, 2.0)
    save_profile(p, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again.prefill_ms(1000) == pytest.approx(25.0)


def test_a_profile_needs_two_prompt_lengths_at_its_chunk():
    data = linear_profile().model_dump()
    data["prefill"] = [PrefillPoint(prompt_tokens=100, chunk_tokens=512, ms=1.0).model_dump()]
    with pytest.raises(ValueError, match="prefill needs"):
        Profile.model_validate(data)


def test_shipped_tiny_profile_loads_and_is_monotone():
    from tandem.profile import shipped_profile

    p = shipped_profile()
    assert p.prefill_ms(2048) > p.prefill_ms(128) > 0
    assert p.decode_step_ms(32, 1024) >= p.decode_step_ms(1, 1024) > 0
