"""`model.quantization` and `engine.kvCacheDtype` from the spec to the worker: the operator's rendered
Deployments and `tandem up`'s command lines carry the same flags (one source, tandem/launch.py), the real
worker parser reads them, and the spec refuses an 8-bit cache with the flex backend."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml

from tandem import names
from tandem.operator.local.plan import plan
from tandem.operator.manifests import render
from tandem.spec import InferenceServiceSpec, parse_object
from tandem.worker.serve.main import parse_args

ROOT = Path(__file__).resolve().parents[2]


def _obj(model: dict | None = None, engine: dict | None = None) -> dict:
    return {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "q"},
        "spec": {
            "model": {
                "source": {"path": "models/tiny"},
                "servedName": "tiny",
                "dtype": "float32",
                **(model or {}),
            },
            "prefill": {"resources": {"gpus": 0}},
            "decode": {"resources": {"gpus": 0}},
            "kvTransfer": {"compression": "int8"},
            "engine": engine or {},
        },
    }


QUANTIZED = _obj({"quantization": "int8"}, {"kvCacheDtype": "int8"})


def test_rendered_worker_deployments_carry_both_options():
    spec = parse_object(QUANTIZED).spec
    for pool in (names.POOL_PREFILL, names.POOL_DECODE):
        dep = render.worker_deployment(spec, "q", "ml", "u", pool, 1)
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        args = parse_args(container["args"][1:])
        assert (args.quantization, args.kv_cache_dtype, args.kv_compression) == ("int8", "int8", "int8")


def test_fp8_weights_reach_the_worker():
    spec = parse_object(_obj({"quantization": "fp8"})).spec
    (container,) = render.worker_deployment(spec, "q", "ml", "u", names.POOL_DECODE, 1)["spec"]["template"][
        "spec"
    ]["containers"]
    assert parse_args(container["args"][1:]).quantization == "fp8"


def test_tandem_up_command_lines_carry_both_options():
    procs = plan(parse_object(QUANTIZED), Path("/srv"), port=9000, first_worker_port=9100, cpus=2)
    workers = [parse_args(p.argv[4:]) for p in procs if p.role != "router"]
    assert [w.role for w in workers] == ["prefill", "decode"]
    assert all((w.quantization, w.kv_cache_dtype) == ("int8", "int8") for w in workers)


def test_defaults_leave_the_weights_and_the_cache_as_the_checkpoint_has_them():
    spec = parse_object(_obj()).spec
    (container,) = render.worker_deployment(spec, "q", "ml", "u", names.POOL_DECODE, 1)["spec"]["template"][
        "spec"
    ]["containers"]
    argv = container["args"]
    assert (
        argv[argv.index("--quantization") + 1] == "none"
        and argv[argv.index("--kv-cache-dtype") + 1] == "auto"
    )
    args = parse_args(argv[1:])
    assert (args.quantization, args.kv_cache_dtype) == ("none", "auto")


def test_an_8_bit_cache_with_flex_attention_is_refused_by_the_spec_and_the_crd():
    with pytest.raises(pydantic.ValidationError, match="kvCacheDtype int8 needs engine.attention sdpa"):
        InferenceServiceSpec.model_validate(
            _obj(engine={"kvCacheDtype": "int8", "attention": "flex"})["spec"]
        )
    with pytest.raises(pydantic.ValidationError, match="quantization"):
        InferenceServiceSpec.model_validate(_obj({"quantization": "int4"})["spec"])
    crd = yaml.safe_load((ROOT / "charts/tandem/files/crds/inferenceservice.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    (rule,) = schema["engine"]["x-kubernetes-validations"]
    assert "kvCacheDtype" in rule["rule"] and "flex" in rule["rule"] and "sdpa" in rule["message"]
    assert schema["engine"]["properties"]["kvCacheDtype"]["enum"] == ["auto", "int8"]
    assert schema["model"]["properties"]["quantization"]["enum"] == ["none", "int8", "fp8"]
