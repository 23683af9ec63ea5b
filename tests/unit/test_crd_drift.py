"""The checked-in CRDs (the chart's copy, and crds/ at the top) are exactly what the spec types give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem import crdgen
from tandem.spec import InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("crd", crdgen.CRDS, ids=lambda c: c.file)
def test_checked_in_crds_equal_what_the_types_give(crd):
    fresh = crd.render()
    for folder in (ROOT / "charts/tandem/files/crds", ROOT / "crds"):
        assert (folder / crd.file).read_text() == fresh, (
            f"regenerate with `python -m tandem.crdgen`: {crd.file}"
        )


def test_check_mode_finds_a_stale_file(tmp_path):
    out = ["--out", str(tmp_path), "--doc", str(tmp_path / "inferenceservice.md")]
    assert crdgen.main(out) == 0
    assert crdgen.main([*out, "--check"]) == 0
    (tmp_path / "tandempool.yaml").write_text("# edited by hand\n")
    assert crdgen.stale(tmp_path) == ["tandempool.yaml"]
    assert crdgen.main([*out, "--check"]) == 1


def test_the_schema_is_structural():
    """What the API server refuses in a structural schema never appears: references, unions, titles."""
    text = yaml.safe_dump(crdgen.structural(InferenceServiceSpec))
    for word in ("$ref", "anyOf", "allOf", "oneOf", "title:", "exclusiveMinimum", "type: 'null'"):
        assert word not in text, word


def test_descriptions_come_from_the_field_docstrings():
    spec = crdgen.structural(InferenceServiceSpec)["properties"]
    assert (
        spec["slo"]["properties"]["ttftMs"]["description"]
        == InferenceServiceSpec.model_fields["slo"].annotation.model_fields["ttft_ms"].description
    )
    assert (
        spec["prefill"]["description"] != spec["decode"]["description"]
    )  # one type, described where it is used
    assert spec["prefill"]["properties"] == spec["decode"]["properties"]


def test_a_model_default_is_an_empty_object_the_api_server_fills():
    spec = crdgen.structural(InferenceServiceSpec)["properties"]
    assert spec["router"]["default"] == {} and spec["router"]["properties"]["replicas"]["default"] == 1
    assert spec["security"]["properties"]["networkPolicy"]["properties"]["metricsFrom"]["default"][0][
        "podSelector"
    ]
    assert (
        "default" not in spec["prefill"]["properties"]["podTemplate"]["properties"]["labels"]
    )  # {} adds nothing


def test_a_pool_default_holds_what_the_pool_rules_read():
    """The API server checks a default against the object's rules before it fills the fields' own defaults."""
    pool = crdgen.structural(InferenceServiceSpec)["properties"]["prefill"]
    read = {
        word for r in pool["x-kubernetes-validations"] for word in r["rule"].replace("self.", " ").split()
    }
    assert {"replicas", "minReplicas", "maxReplicas"} <= read
    assert pool["default"] == {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}
