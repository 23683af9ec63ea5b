"""engine.speculative from the spec to the decode worker: the rendered Deployment and `tandem up` carry the
same flags (one builder), the worker parses them into the engine's config, and its metrics count drafts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem import names
from tandem.operator.local.plan import plan
from tandem.operator.manifests import render
from tandem.spec import InferenceService, InferenceServiceSpec
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.serve.main import main, parse_args
from tandem.worker.serve.metrics import WorkerMetrics
from tandem.worker.serve.prepare import speculative_config

FLAG = ["--speculative", "ngram", "--speculative-tokens", "6"]


def _spec(mode: str = "disaggregated", **engine) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/models/x"}, "servedName": "x"},
            "mode": mode,
            "engine": engine,
        }
    )


def _carries(argv: list[str]) -> bool:
    return any(argv[i : i + len(FLAG)] == FLAG for i in range(len(argv)))


def _worker_args(spec: InferenceServiceSpec) -> dict[str, list[str]]:
    pools = render.worker_pools(spec)
    out = render.children(spec, "s", "ns", "u", dict.fromkeys(pools, 1))
    deps = {m["metadata"]["name"]: m for m in out if m["kind"] == "Deployment"}
    return {p: deps[f"s-{p}"]["spec"]["template"]["spec"]["containers"][0]["args"] for p in pools}


def test_rendered_decode_deployment_carries_the_flag_and_prefill_does_not():
    args = _worker_args(_spec(speculative={"method": "ngram", "numTokens": 6}))
    assert _carries(args["decode"]) and "--speculative" not in args["prefill"]
    assert speculative_config(parse_args(args["decode"][1:])) == SpeculativeConfig("ngram", 6)
    plain = _worker_args(_spec())
    assert "--speculative" not in plain["decode"]
    assert speculative_config(parse_args(plain["decode"][1:])) is None
    assert _carries(_worker_args(_spec("colocated", speculative={"numTokens": 6}))["colocated"])


def test_tandem_up_runs_the_decode_worker_with_the_flag():
    svc = InferenceService(name="s", spec=_spec(speculative={"numTokens": 6}))
    procs = {p.role: p.argv for p in plan(svc, Path("/"), cpus=4)}
    assert _carries(procs["decode"]) and "--speculative" not in procs["prefill"]


def test_the_draft_method_carries_its_layers_to_the_decode_worker():
    draft = {"method": "draft", "numTokens": 3, "draftModel": {"layers": 2}}
    want = ["--speculative", "draft", "--speculative-tokens", "3", "--speculative-draft-layers", "2"]
    args = _worker_args(_spec(speculative=draft))
    assert " ".join(want) in " ".join(args["decode"]) and "--speculative" not in " ".join(args["prefill"])
    assert speculative_config(parse_args(args["decode"][1:])) == SpeculativeConfig("draft", 3, draft_layers=2)
    procs = {
        p.role: p.argv
        for p in plan(InferenceService(name="s", spec=_spec(speculative=draft)), Path("/"), cpus=4)
    }
    assert " ".join(want) in " ".join(procs["decode"])
    assert "--speculative-draft-layers" not in _worker_args(_spec(speculative={"numTokens": 3}))["decode"]


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"numTokens": 0}, "numTokens"),
        ({"numTokens": 17}, "numTokens"),
        ({"method": "magic"}, "method"),
        ({"method": "draft"}, "draftModel is required by method draft"),
        (
            {"method": "ngram", "draftModel": {"layers": 2}},
            "draftModel is required by method draft and only by it",
        ),
        ({"draftModel": {"layers": 2}}, "only by it"),
        ({"method": "draft", "draftModel": {"layers": 0}}, "layers"),
        ({"method": "draft", "draftModel": {}}, "layers"),
    ],
)
def test_spec_refuses_bad_values(bad, message):
    with pytest.raises(ValueError, match=message):
        _spec(speculative=bad)


def test_the_worker_refuses_a_draft_with_as_many_layers_as_the_model(tiny_model_dir, capsys):
    argv = ["--role", "decode", "--model-dir", str(tiny_model_dir), "--speculative", "draft"]
    assert main([*argv, "--speculative-draft-layers", "4", "--num-kv-blocks", "16"]) == 2
    assert "draftModel.layers is 4, but the model has 4 layers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the model has 4 layers"):
        spec = speculative_config(parse_args([*argv, "--speculative-draft-layers", "5"]))
        Engine(load_model(tiny_model_dir), EngineConfig(block_size=4, num_kv_blocks=16, speculative=spec))


def test_metrics_count_proposed_and_accepted_drafts(tiny_model_dir):
    engine = Engine(
        load_model(tiny_model_dir),
        EngineConfig(block_size=4, num_kv_blocks=64, speculative=SpeculativeConfig()),
    )
    metrics = WorkerMetrics("svc", "decode").watch(engine)
    labels = {"service": "svc", "pool": "decode"}
    engine.add_request([5, 6, 7] * 6, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), "r")
    while engine.has_work():
        engine.step()
        metrics.on_step(engine)
    spec = engine.speculator
    assert spec is not None and spec.accepted_tokens > 0
    got = [
        metrics.registry.get_sample_value(n, labels)
        for n in (
            names.SPEC_PROPOSED_TOKENS_TOTAL,
            names.SPEC_ACCEPTED_TOKENS_TOTAL,
            names.SPEC_VERIFY_STEPS_TOTAL,
        )
    ]
    assert got == [spec.proposed_tokens, spec.accepted_tokens, spec.verifies]
    assert 0 < got[1] <= got[0]
    assert (
        metrics.registry.get_sample_value(names.PREFILL_TOKENS_TOTAL, labels) == 18
    )  # verifies are not prompt
