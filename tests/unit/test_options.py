"""The process options: every field survives to_argv -> from_argv, the spec's engine knobs reach the worker's
options by name, and the parsers take their defaults from the options (and so from the spec)."""

import dataclasses
from enum import Enum, StrEnum
from typing import get_type_hints

import pytest
from pydantic import Field

from tandem import options
from tandem.flags import kind_of
from tandem.options import RouterOptions, WorkerOptions
from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.spec import InferenceServiceSpec
from tandem.spec_engine import EngineSpec


def _other_than_default(cls, f: dataclasses.Field):
    """A value of the field's type that differs from its default."""
    kind = kind_of(get_type_hints(cls)[f.name])
    default = f.default if f.default is not dataclasses.MISSING else None
    if kind is bool:
        return not default
    if kind is list:
        return ["a:1", "b:2"]
    if issubclass(kind, Enum):
        return next(m for m in kind if m != default)
    if f.metadata.get("choices"):
        return next(c for c in f.metadata["choices"] if c != default)
    if kind is int:
        return (default or 0) + 7
    if kind is float:
        return (default or 0.0) + 0.25
    return f"value-of-{f.name}"


@pytest.mark.parametrize("cls", [WorkerOptions, RouterOptions])
def test_every_field_round_trips(cls):
    required = {
        f.name: _other_than_default(cls, f)
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    plain = cls(**required)
    assert cls.from_argv(plain.to_argv()) == plain  # all defaults: only the required flags travel
    for f in dataclasses.fields(cls):
        if f.name == "engine_knobs":  # the spec's undeclared knobs: test_a_new_spec_knob_needs_no_edit_here
            continue
        changed = dataclasses.replace(plain, **{f.name: _other_than_default(cls, f)})
        back = cls.from_argv(changed.to_argv())
        assert back == changed, f.name
        assert type(getattr(back, f.name)) is type(getattr(changed, f.name)), (
            f.name
        )  # enums come back as enums


def test_spec_engine_knobs_reach_the_worker_options_by_name():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "tiny"},
            "engine": {
                "blockSize": 32,
                "maxRunningSequences": 9,
                "prefillChunkTokens": 128,
                "kvCacheMemoryPercent": 40,
                "maxPrefillTokensWithDecodes": 64,
                "decodeStep": "compiled",
                "threads": 2,
                "speculative": {"method": "draft", "numTokens": 3, "draftModel": {"layers": 2}},
            },
        }
    )
    decode = WorkerOptions.from_spec(spec, "decode", model_dir="/m")
    shared = [
        n
        for n in EngineSpec.model_fields
        if n in {f.name for f in dataclasses.fields(WorkerOptions)} - {"speculative"}
    ]
    assert {"block_size", "max_running_sequences", "prefill_chunk_tokens", "decode_step"} <= set(shared)
    assert all(getattr(decode, n) == getattr(spec.engine, n) for n in shared)
    assert (decode.speculative, decode.speculative_tokens, decode.speculative_draft_layers) == ("draft", 3, 2)
    prefill = WorkerOptions.from_spec(spec, "prefill", model_dir="/m")  # a prefill worker never decodes
    assert (prefill.decode_step, prefill.speculative, prefill.max_prefill_tokens_with_decodes) == (
        "eager",
        None,
        None,
    )
    assert WorkerOptions.from_argv(decode.to_argv()) == decode


def test_defaults_live_once():
    worker = WorkerOptions.parser().parse_args(["--role", "decode", "--model-dir", "/m"])
    assert (worker.block_size, worker.max_running_sequences) == (
        EngineSpec().block_size,
        EngineSpec().max_running_sequences,
    )
    router = RouterOptions.parser().parse_args(["--model-dir", "/m", "--served-name", "t"])
    assert (router.slo_ttft_ms, router.slo_tpot_ms, router.slo_percentile) == (
        DEFAULT_SLO.ttft_ms,
        DEFAULT_SLO.tpot_ms,
        DEFAULT_SLO.percentile,
    )


def test_a_bad_value_is_refused_with_the_flag_named(capsys):
    with pytest.raises(SystemExit):
        WorkerOptions.from_argv(["--role", "decode", "--model-dir", "/m", "--attention", "fast"])
    assert "--attention" in capsys.readouterr().err


class Pace(StrEnum):
    steady = "steady"
    eager = "eager"


class EngineSpecWithNewKnobs(EngineSpec):
    """EngineSpec as it reads once someone adds knobs to it: an enum, a bounded int, a switch, an optional."""

    pace: Pace = Pace.steady
    lookahead: int = Field(default=8, gt=0)
    prefetch: bool = True
    cap: int | None = Field(default=None, gt=0)


def test_a_new_spec_knob_needs_no_edit_here(monkeypatch, capsys):
    """A knob added to EngineSpec (and to EngineConfig) reaches the engine's config through from_spec,
    to_argv, from_argv and the worker, typed, defaulted and checked by the spec, with no edit to this
    module."""
    from tandem.worker.engine.runner.engine import EngineConfig
    from tandem.worker.serve import prepare as worker_prepare

    @dataclasses.dataclass
    class EngineConfigWithNewKnobs(EngineConfig):
        pace: str = "steady"
        lookahead: int = 8
        prefetch: bool = True
        cap: int | None = None

    monkeypatch.setattr(options, "EngineSpec", EngineSpecWithNewKnobs)
    monkeypatch.setattr(worker_prepare, "EngineConfig", EngineConfigWithNewKnobs)
    base = InferenceServiceSpec.model_validate({"model": {"source": {"path": "/m"}, "servedName": "tiny"}})
    engine = EngineSpecWithNewKnobs(pace="eager", lookahead=3, prefetch=False, cap=5, block_size=32)
    spec = base.model_copy(update={"engine": engine})

    new = ("pace", "lookahead", "prefetch", "cap")
    opts = WorkerOptions.from_spec(spec, "decode", model_dir="/m")
    assert {k: opts.engine_knobs[k] for k in new} == {
        "pace": Pace.eager,
        "lookahead": 3,
        "prefetch": False,
        "cap": 5,
    }
    argv = opts.to_argv()
    for flag, text in (("--pace", "eager"), ("--lookahead", "3"), ("--prefetch", "false"), ("--cap", "5")):
        assert argv[argv.index(flag) + 1] == text
    back = WorkerOptions.from_argv(argv)
    assert back == opts and type(back.engine_knobs["pace"]) is Pace
    config = worker_prepare._engine_config(back)
    assert (config.pace, config.lookahead, config.prefetch, config.cap, config.block_size) == (
        "eager",
        3,
        False,
        5,
        32,
    )

    defaults = WorkerOptions.from_argv(["--role", "decode", "--model-dir", "/m"])  # the spec's defaults
    assert {k: defaults.engine_knobs[k] for k in new} == {
        "pace": Pace.steady,
        "lookahead": 8,
        "prefetch": True,
        "cap": None,
    }
    assert WorkerOptions(role="decode", model_dir="/m") == defaults  # built directly: the same defaults
    assert "--cap" not in defaults.to_argv() and WorkerOptions.from_argv(defaults.to_argv()) == defaults
    for bad in (["--lookahead", "0"], ["--pace", "fast"]):  # the spec's own checks, the flag named
        with pytest.raises(SystemExit):
            WorkerOptions.from_argv(["--role", "decode", "--model-dir", "/m", *bad])
        assert bad[0] in capsys.readouterr().err
