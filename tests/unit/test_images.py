"""The container images (images/*.Dockerfile) cannot be built here, so their contracts are checked: every
path they copy exists and is in the build context, their entrypoints are the project's real commands, they
run as the non-root uid the chart and the operator's pods expect, their names and tags are the ones the
chart and the InferenceService default use, and the torch-free operator image installs what the operator
imports."""

from __future__ import annotations

import fnmatch
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tandem.cli import COMMANDS
from tandem.operator.manifests.pod_security import RUN_AS
from tandem.spec import InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"operator": ROOT / "images/operator.Dockerfile", "worker": ROOT / "images/worker.Dockerfile"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CHART = yaml.safe_load((ROOT / "charts/tandem/Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts/tandem/values.yaml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if line.endswith("\\"):
            continue
        if buf:
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def requirements(path: Path) -> list[Requirement]:
    """Quoted requirements in the image's RUN pip install lines."""
    reqs = []
    for word, args in instructions(path):
        if word == "RUN" and "pip install" in args:
            reqs += [Requirement(r) for r in re.findall(r'"([A-Za-z0-9_.\-\[\]]+[<>=!~][^"]*)"', args)]
    return reqs


def declared() -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in PYPROJECT["project"]["dependencies"]}


def ignored(rel: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    parts = Path(rel).parts
    return any(fnmatch.fnmatch(rel, p) or (parts and fnmatch.fnmatch(parts[0], p)) for p in patterns)


@pytest.mark.parametrize("image", IMAGES)
def test_every_copied_path_exists_in_the_build_context(image):
    copies = [args.split() for word, args in instructions(IMAGES[image]) if word == "COPY"]
    assert copies
    for args in copies:
        if any(a.startswith("--from") for a in args):
            continue
        for src in args[:-1]:
            assert (ROOT / src).exists(), f"{image}: COPY {src} does not exist"
            assert not ignored(src.rstrip("/")), f"{image}: COPY {src} is excluded by .dockerignore"


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_the_tandem_command_and_the_user_is_not_root(image):
    stage = dict(reversed(final_stage(IMAGES[image])))  # the first of each instruction in the final stage
    assert (
        json.loads(stage["ENTRYPOINT"]) == ["tandem"]
        and PYPROJECT["project"]["scripts"]["tandem"] == "tandem.cli:main"
    )
    cmd = json.loads(stage["CMD"])
    assert cmd[0] in COMMANDS or cmd == ["--help"], cmd
    users = [args for word, args in final_stage(IMAGES[image]) if word == "USER"]
    assert (
        users == [f"{RUN_AS}:{RUN_AS}"] and RUN_AS != 0
    )  # the uid the rendered pods' securityContext runs as
    assert f"useradd --uid {RUN_AS}" in IMAGES[image].read_text()
    deployment = (ROOT / "charts/tandem/templates/deployment.yaml").read_text()
    assert f"runAsUser: {RUN_AS}" in deployment and "runAsNonRoot: true" in deployment


def _title(image: str) -> str:
    labels = " ".join(args for word, args in final_stage(IMAGES[image]) if word == "LABEL")
    return re.search(r'org\.opencontainers\.image\.title="([^"]+)"', labels).group(1)


def test_image_names_and_tags_match_the_chart_and_the_spec_default():
    version = PYPROJECT["project"]["version"]
    assert CHART["appVersion"] == version
    assert VALUES["image"]["repository"] == _title("operator")  # the chart's operator Deployment
    default = InferenceServiceSpec.model_fields["image"].default
    assert default == f"{_title('worker')}:{version}"  # workers and routers
    crd = (ROOT / "charts/tandem/files/crds/inferenceservice.yaml").read_text()
    assert f"default: {default}" in crd


def test_the_worker_image_has_cuda_torch_and_the_model_downloader():
    text = IMAGES["worker"].read_text()
    assert re.search(r"ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-", text)
    reqs = {r.name.lower(): r for r in requirements(IMAGES["worker"])}
    assert str(reqs["torch"].specifier) == str(declared()["torch"].specifier)  # the project's torch range
    source = (ROOT / "operator/model/source.py").read_text()
    assert (
        '"fetch-model"' in source and "huggingface_hub" in declared()
    )  # installed with the project (`pip install .`)
    assert "COPY worker/ worker/" in text


def test_the_operator_image_installs_what_the_operator_imports_and_no_torch():
    reqs = {r.name.lower(): r for r in requirements(IMAGES["operator"])}
    assert "torch" not in reqs and "--no-deps /wheels" in IMAGES["operator"].read_text()
    for name, req in reqs.items():  # the same ranges pyproject.toml declares
        assert name in declared() and req.specifier == declared()[name].specifier, name
    # every third-party module the operator's entry points import (at start and later), torch unimportable
    probe = (
        "import sys; sys.modules['torch'] = None\n"
        "import tandem.cli, tandem.operator.__main__, tandem.operator.handlers, "
        "tandem.operator.runtime.check\nimport tandem.operator.top.cli, tandem.operator.top.kube, "
        "tandem.operator.top.prom, tandem.operator.top.scrape\n"
        # what they import inside functions, once running: the leader, the defaults, the autoscaler
        "import tandem.operator.runtime.leader, tandem.operator.model.cache, "
        "tandem.operator.manifests.security_defaults\nimport tandem.operator.autoscale.backends.kube.loop, "
        "tandem.operator.top.local\nprint(' '.join(sorted({m.split('.')[0] for m, mod in sys.modules.items() "
        "if getattr(mod, '__file__', None)})))"
    )  # namespace packages: their parts count
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    baseline = subprocess.run(
        [sys.executable, "-c", "import sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()  # interpreter start-up
    dists, installed = md.packages_distributions(), closure(set(reqs))
    missing = []
    for module in set(out.stdout.split()) - {m.split(".")[0] for m in baseline}:
        providers = {d.lower() for d in dists.get(module, [])} - {"tandem"}
        if providers and not providers & installed:
            missing.append(f"{module} ({', '.join(sorted(providers))})")
    assert not missing, f"imported but not installed in the operator image: {missing}"


def closure(names: set[str]) -> set[str]:
    """The distributions `names` pull in (their requirements, recursively, in this environment)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for r in requires:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen | {n.replace("-", "_") for n in seen}
