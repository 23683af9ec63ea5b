"""`tandem fetch-model` with the real `huggingface_hub` client against a local server in the Hub's API shape:
N concurrent fetches into one folder download each file once, the filter leaves the other formats on the
server, a router's fetch takes no weights, and a download cut short is fetched again cleanly and never
leaves a folder that looks complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.testing.fake_hub import COMMIT, FakeHub
from tandem.worker.hf.fetch import complete
from tandem.worker.hf.files import Part

pytestmark = pytest.mark.slow

REPO_ID = "org/tiny"
WEIGHTS = os.urandom(3 << 20)
FILES = {
    "config.json": b'{"model_type": "llama", "max_position_embeddings": 131072}',
    "generation_config.json": b"{}",
    "tokenizer.json": b'{"v": 1}',
    "tokenizer_config.json": b"{}",
    "model.safetensors": WEIGHTS,
    "pytorch_model.bin": os.urandom(1 << 20),
    "flax_model.msgpack": os.urandom(1 << 16),
    "tf_model.h5": b"h5",
    "README.md": b"# tiny",
}
WORKER_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
}
TOKENIZER_FILES = WORKER_FILES - {"model.safetensors"}


def fetch_model(hub: FakeHub, folder: Path, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(folder.parent / "hf"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tandem", "fetch-model", REPO_ID, "--dir", str(folder), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def on_disk(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def test_concurrent_fetches_download_each_file_once(tmp_path):
    folder = tmp_path / "cache" / REPO_ID / "main"
    with FakeHub({REPO_ID: FILES}, bandwidth=4 << 20) as hub:  # ~1 s of weights: the others arrive meanwhile
        procs = [fetch_model(hub, folder, "--report", str(tmp_path / f"report-{i}.json")) for i in range(4)]
        results = [finish(p) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), [err[-2000:] for _, _, err in results]
    assert dict(hub.gets) == {f: 1 for f in WORKER_FILES}  # one GET per file for 4 pods, no other format
    reports = [json.loads((tmp_path / f"report-{i}.json").read_text()) for i in range(4)]
    assert sorted(r["cache"] for r in reports) == ["hit", "hit", "hit", "miss"]
    miss = next(r for r in reports if r["cache"] == "miss")
    assert all(r["max_position_embeddings"] == 131072 for r in reports)  # read from the config it fetched
    assert miss["bytes"] == sum(len(FILES[f]) for f in WORKER_FILES) and miss["commit"] == COMMIT
    assert all(
        r["waited_seconds"] > 0.3 for r in reports if r["cache"] == "hit"
    )  # they waited for the download
    assert on_disk(folder) == WORKER_FILES
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert complete(folder, Part.weights, COMMIT) and complete(folder, Part.tokenizer, COMMIT)


def test_router_fetch_takes_config_and_tokenizer_only(tmp_path):
    folder = tmp_path / "cache" / REPO_ID / "main"
    with FakeHub({REPO_ID: FILES}) as hub:
        rc, out, err = finish(fetch_model(hub, folder, "--part", "tokenizer", "--report", ""))
    assert rc == 0, err
    assert set(hub.gets) == TOKENIZER_FILES and hub.served["model.safetensors"] == 0
    assert on_disk(folder) == TOKENIZER_FILES
    assert complete(folder, Part.tokenizer, COMMIT) and not complete(folder, Part.weights, COMMIT)
    assert json.loads(out)["cache"] == "miss"


def test_a_download_cut_short_is_fetched_again_and_never_looks_complete(tmp_path):
    folder = tmp_path / "cache" / REPO_ID / "main"
    report = tmp_path / "report.json"
    hub = FakeHub({REPO_ID: FILES}).start()
    try:
        hub.die_in("model.safetensors", len(WEIGHTS) // 2)
        rc, _, err = finish(fetch_model(hub, folder, "--report", str(report)))
        assert rc == 1, err  # the server died mid-file and stayed down
        assert hub.served["model.safetensors"] == len(WEIGHTS) // 2
        assert "error" in json.loads(report.read_text())
        assert not complete(folder, Part.weights) and not complete(folder, Part.tokenizer)
        final = folder / "model.safetensors"
        assert not final.exists()  # never a truncated file under the final name

        hub.start()  # the server is back on the same port: the next start of the init container
        rc, out, err = finish(fetch_model(hub, folder, "--report", str(report)))
        assert rc == 0, err
        assert final.read_bytes() == WEIGHTS
        assert complete(folder, Part.weights, COMMIT)
        assert json.loads(report.read_text())["cache"] == "miss"
        assert hub.gets["model.safetensors"] == 2  # the cut one and one retry, from where it stopped or anew
    finally:
        hub.stop()


def test_a_file_damaged_after_the_fetch_is_not_a_cache_hit(tmp_path):
    folder = tmp_path / "cache" / REPO_ID / "main"
    with FakeHub({REPO_ID: FILES}) as hub:
        assert finish(fetch_model(hub, folder, "--report", ""))[0] == 0
        with open(folder / "model.safetensors", "r+b") as fh:
            fh.truncate(1000)
        assert not complete(folder, Part.weights, COMMIT)
        rc, out, err = finish(fetch_model(hub, folder, "--report", ""))
    assert rc == 0, err
    assert json.loads(out)["cache"] == "miss" and json.loads(out)["bytes"] == len(WEIGHTS)
    assert hub.gets["model.safetensors"] == 2 and hub.gets["config.json"] == 1  # only the damaged file again
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS


def test_a_cached_commit_is_a_hit_without_the_hub(tmp_path):
    folder = tmp_path / "cache" / REPO_ID / COMMIT
    with FakeHub({REPO_ID: FILES}) as hub:
        assert finish(fetch_model(hub, folder, "--revision", COMMIT, "--report", ""))[0] == 0
    # the server is gone: a pinned commit that is complete needs no request
    rc, out, err = finish(fetch_model(hub, folder, "--revision", COMMIT, "--report", ""))
    assert rc == 0, err
    assert json.loads(out)["cache"] == "hit"
