"""Dynamo's own loader reads what `tandem profile export-dynamo` writes: its converter to the mocker's timing
table (the path of `mocker --planner-profile-data` and the replay harness's `--profile-dir`) runs on the
export, in the Python that has ai-dynamo."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tandem.profile import shipped_profile
from tandem.profile_dynamo import to_dynamo

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_PYTHON = Path(os.environ.get("TANDEM_DYNAMO_PYTHON", Path.home() / ".cache/tandem/dynvenv/bin/python"))
HARNESS = Path(os.environ.get("TANDEM_DYNAMO_REPLAY", ROOT.parent / "shared" / "tools" / "dynamo-replay"))

LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import replay  # the harness: its stub for the planner's uninstallable import, then Dynamo's own converter
replay.install_ais_import_stub()
path, max_kv = replay.h200_perf_npz(sys.argv[3], sys.argv[2])
with np.load(path) as d:
    print(json.dumps({"max_kv": max_kv, "keys": sorted(d.files), "ttft": d["prefill_ttft_ms"].tolist(),
                      "isl": d["prefill_isl"].tolist(), "itl": d["decode_itl"].tolist()}))
"""


def _dynamo_missing() -> str | None:
    if not DYNAMO_PYTHON.is_file():
        return f"no Python with ai-dynamo at {DYNAMO_PYTHON} (set TANDEM_DYNAMO_PYTHON)"
    if not (HARNESS / "replay.py").is_file():
        return f"no Dynamo replay harness at {HARNESS} (set TANDEM_DYNAMO_REPLAY)"
    found = subprocess.run([str(DYNAMO_PYTHON), "-c", "import dynamo.mocker"], capture_output=True, cwd="/")
    return None if found.returncode == 0 else "ai-dynamo is not importable in TANDEM_DYNAMO_PYTHON"


MISSING = _dynamo_missing()


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
@pytest.mark.parametrize("name", ["tiny-cpu", "h200-llama-3.1-8b-fp8"])
def test_dynamos_converter_reads_the_export(name, tmp_path):
    profile = shipped_profile(name)
    to_dynamo(profile, tmp_path / "export")
    done = subprocess.run(
        [str(DYNAMO_PYTHON), "-c", LOAD, str(HARNESS), str(tmp_path / "export"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not the repository root: its operator/ folder would shadow the standard library's
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads(done.stdout.strip().splitlines()[-1])
    assert table["max_kv"] == profile.kv_capacity_tokens
    assert {"prefill_isl", "prefill_ttft_ms", "decode_itl"} <= set(table["keys"])
    lengths = [p.prompt_tokens for p in profile.prefill if p.chunk_tokens == profile.prefill_chunk_tokens]
    assert table["isl"][0] == min(lengths) and table["isl"][-1] == max(lengths)
    # Dynamo refits the points (its own regression): its table keeps their order of magnitude and trend
    assert table["ttft"][-1] > table["ttft"][0] > 0
    assert profile.prefill_ms(max(lengths)) / 3 < table["ttft"][-1] < 3 * profile.prefill_ms(max(lengths))
    assert all(v > 0 for row in table["itl"][1:] for v in row)
