"""The model's own context limit against spec.model.maxContextLength: one rule (tandem.context_limit), read
from the model's config.json by the fetch, shown as Degraded with both numbers on the InferenceService, and
held by the engine, which never takes a context beyond the model's positions."""

from __future__ import annotations

import json

import pytest

from tandem.context_limit import REASON, beyond_model
from tandem.operator.plan import model_limit
from tandem.operator.status.model_cached import model_positions, pool_fetches
from tandem.operator.status.service import with_degraded
from tandem.operator.status.start_status import with_pod_starts
from tandem.spec import InferenceServiceSpec
from tests.unit.test_cold_start import HIT, pod, t


@pytest.mark.parametrize(
    ("asked", "positions", "why"),
    [
        (
            1_000_000,
            131072,
            "maxContextLength 1000000 exceeds the model's max_position_embeddings 131072: contexts are "
            "served up to 131072 tokens",
        ),
        (131072, 131072, None),  # exactly the model's: served as asked
        (4096, 131072, None),
        (
            4097,
            4096,
            "maxContextLength 4097 exceeds the model's max_position_embeddings 4096: contexts are served up "
            "to 4096 tokens",
        ),
        (1_000_000, None, None),  # the model's limit not read yet: nothing to say
        (1_000_000, 0, None),
    ],
)
def test_a_context_beyond_the_models_positions_is_named_with_both_numbers(asked, positions, why):
    assert beyond_model(asked, positions) == why


def test_the_fetch_reads_the_models_positions_from_its_config(tmp_path):
    from tandem.worker.hf.fetch import _positions

    assert _positions(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    assert _positions(tmp_path) == 131072
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": "lots"}))
    assert _positions(tmp_path) is None
    (tmp_path / "config.json").write_text("[]")
    assert _positions(tmp_path) is None


def _spec(max_context: int) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {
                "source": {"huggingFace": {"repoId": "o/m"}},
                "servedName": "m",
                "maxContextLength": max_context,
            },
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
        }
    )


def _serving(degraded=("False", "AsExpected")) -> dict:
    conds = [
        {"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "all pools ready"},
        {"type": "Degraded", "status": degraded[0], "reason": degraded[1], "message": "..."},
    ]
    return {"conditions": conds, "pools": {"prefill": {}, "decode": {}, "router": {}}}


def test_the_pods_fetch_reports_give_the_limit_and_the_status_keeps_it():
    fetched = pod("a", init_end=100, ready=120, report={**HIT, "max_position_embeddings": 131072})
    cache = {"decode": pool_fetches([fetched]), "router": pool_fetches([pod("r")])}  # r: not fetched yet
    assert (
        cache["decode"]["maxPositionEmbeddings"] == 131072 and "maxPositionEmbeddings" not in cache["router"]
    )
    assert model_positions(cache) == 131072
    assert model_positions({}) is None
    status = with_pod_starts(_serving(), {}, {"decode": [fetched]}, True, 1, t(130))
    # a later read of the same pool while a new pod has not fetched yet keeps the number it had
    again = with_pod_starts(_serving(), status, {"decode": [pod("b")]}, True, 1, t(200))
    assert model_positions(again["modelCache"]) == 131072


def test_a_spec_above_the_models_limit_is_degraded_with_both_numbers_and_stays_ready():
    status = {**_serving(), "modelCache": {"decode": {"maxPositionEmbeddings": 131072}}}
    cause = model_limit(_spec(1_000_000), status)
    assert cause is not None and cause[0] == REASON
    assert "1000000" in cause[1] and "131072" in cause[1]
    assert model_limit(_spec(131072), status) is None
    assert model_limit(_spec(1_000_000), _serving()) is None  # no fetch has read the config yet
    out = with_degraded(status, {}, cause, 3, t(10))
    conds = {c["type"]: c for c in out["conditions"]}
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", REASON)
    assert conds["Degraded"]["message"] == cause[1] and conds["Degraded"]["observedGeneration"] == 3
    assert conds["Ready"]["status"] == "True"  # it serves, up to the model's limit
    assert (
        with_degraded(out, out, cause, 3, t(20))["conditions"] == out["conditions"]
    )  # same time when unchanged
    failing = _serving(("True", "CrashLoopBackOff"))
    assert with_degraded(failing, {}, cause, 3, t(10)) == failing  # a failure keeps Degraded's cause
    assert with_degraded(status, {}, None, 3, t(10)) == status


def test_the_engine_never_takes_a_context_beyond_the_models_positions(tiny_model_dir):
    from tandem.worker.api.params import InvalidRequest, SamplingParams
    from tandem.worker.engine.loading import load_model
    from tandem.worker.engine.runner.engine import Engine, EngineConfig

    model = load_model(tiny_model_dir)
    positions = model.config.max_position_embeddings
    engine = Engine(model, EngineConfig(block_size=16, num_kv_blocks=260, max_model_len=1_000_000))
    assert engine.max_model_len == positions
    engine.validate([1] * (positions - 1), SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequest, match=f"context is {positions} tokens"):
        engine.validate([1] * positions, SamplingParams(max_tokens=1))
