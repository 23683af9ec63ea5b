"""The CRD schema and the spec types (tandem/spec*.py) describe the same object: same fields, same defaults,
same enums."""

import types
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tandem.spec import InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]
CRDS = (
    ROOT / "charts/tandem/files/crds"
)  # the one copy: the chart templates it, kubectl apply -f takes it as is


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; the API server's decoder may refuse the file. Refuse it
    here."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    keys = [
        loader.construct_object(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"
    ]  # `<<` may be overridden
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {twice}", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _crd(name: str) -> dict:
    return yaml.load((CRDS / name).read_text(), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)


def test_the_strict_loader_refuses_a_key_given_twice():
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate keys"):
        yaml.load("a: {b: 1, b: 2}", Loader=_StrictLoader)  # noqa: S506
    assert yaml.load("a: {b: 1, c: [{b: 2}]}", Loader=_StrictLoader) == {"a": {"b": 1, "c": [{"b": 2}]}}  # noqa: S506


def _schema() -> dict:
    version = _crd("inferenceservice.yaml")["spec"]["versions"][0]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _inner(annotation: Any) -> Any:
    """Strip Optional[...] to the one real type."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def _walk(model: type[BaseModel], schema: dict, where: str, problems: list[str]) -> None:
    props = schema.get("properties", {})
    fields = {f.alias or n: f for n, f in model.model_fields.items()}
    if set(fields) != set(props):
        problems.append(f"{where}: spec types {sorted(fields)} vs CRD {sorted(props)}")
    required = set(schema.get("required", []))
    for alias, f in fields.items():
        if alias not in props:
            continue
        prop, typ = props[alias], _inner(f.annotation)
        if f.is_required() != (alias in required):
            problems.append(f"{where}.{alias}: required differs")
        if isinstance(typ, type) and issubclass(typ, BaseModel):
            _walk(typ, prop, f"{where}.{alias}", problems)
            continue
        if isinstance(typ, type) and issubclass(typ, Enum):
            if sorted(e.value for e in typ) != sorted(prop.get("enum", [])):
                problems.append(f"{where}.{alias}: enum differs")
        if (
            f.default is not PydanticUndefined
            and f.default is not None
            and not isinstance(f.default, BaseModel)
        ):
            want = f.default.value if isinstance(f.default, Enum) else f.default
            if prop.get("default") != want:
                problems.append(f"{where}.{alias}: default {want!r} vs CRD {prop.get('default')!r}")
        for meta in f.metadata:
            for attr, key in (("ge", "minimum"), ("le", "maximum")):
                if getattr(meta, attr, None) is not None and prop.get(key) != getattr(meta, attr):
                    problems.append(f"{where}.{alias}: {key} {getattr(meta, attr)} vs CRD {prop.get(key)}")
            if getattr(meta, "gt", None) is not None and prop.get("minimum") != meta.gt + 1:
                problems.append(f"{where}.{alias}: minimum {meta.gt + 1} vs CRD {prop.get('minimum')}")


def test_crd_schema_matches_spec_types():
    problems: list[str] = []
    _walk(InferenceServiceSpec, _schema(), "spec", problems)
    assert not problems, "\n".join(problems)


def test_router_resources_default_no_gpu_in_both():
    router = _schema()["properties"]["router"]["properties"]["resources"]["properties"]
    assert router["gpus"]["default"] == 0
    assert (
        InferenceServiceSpec.model_validate(
            {"model": {"source": {"path": "/m"}, "servedName": "m"}, "router": {"resources": {"cpu": "1"}}}
        ).router.resources.gpus
        == 0
    )


@pytest.mark.parametrize("name", ["inferenceservice.yaml", "tandempool.yaml"])
def test_crd_basics(name):
    crd = _crd(name)
    assert crd["spec"]["group"] == "serving.tandem.dev"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    assert "isvc" not in crd["spec"]["names"].get("shortNames", [])


def test_pool_scale_subresource():
    scale = _crd("tandempool.yaml")["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_name_limit_lets_every_child_name_fit_a_dns_label():
    from tandem import names
    from tandem.operator.manifests.render import child_name

    schema = _crd("inferenceservice.yaml")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    name = schema["properties"]["metadata"]["properties"]["name"]
    pools = (names.POOL_PREFILL, names.POOL_DECODE, names.POOL_COLOCATED, names.POOL_ROUTER)
    assert name["maxLength"] == 63 - max(len(child_name("", p)) for p in pools)
    assert name["pattern"] == "^[a-z]([-a-z0-9]*[a-z0-9])?$"  # DNS-1035: Services need it


def _undescribed(schema: dict, path: str = "") -> list[str]:
    out = []
    for key, sub in (schema.get("properties") or {}).items():
        here = f"{path}.{key}" if path else key
        if "description" not in sub and here not in (
            "apiVersion",
            "kind",
            "metadata",
        ):  # the API server's own
            out.append(here)
        out += _undescribed(sub, here)
        if isinstance(sub.get("items"), dict):
            out += _undescribed(sub["items"], here + "[]")
        if isinstance(sub.get("additionalProperties"), dict):
            out += _undescribed(sub["additionalProperties"], here + "{}")
    return out


@pytest.mark.parametrize("name", ["inferenceservice.yaml", "tandempool.yaml"])
def test_every_field_is_described_for_kubectl_explain(name):
    schema = _crd(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _undescribed(schema) == []


def test_decode_pool_has_the_prefill_pool_schema_and_its_own_description():
    props = _schema()["properties"]
    assert props["decode"]["properties"] == props["prefill"]["properties"]
    assert "decode" in props["decode"]["description"] and "prefill" in props["prefill"]["description"]
