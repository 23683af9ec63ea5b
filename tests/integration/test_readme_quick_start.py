"""The README's local command works as written: `tandem up -f examples/tiny.yaml --create-tiny --demo` creates
the tiny model, starts a router, a prefill and a decode worker, streams one answer, prints its TTFT and TPOT
and stops (run in a scratch copy of examples/, on free ports so that it cannot collide with another stack)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.operator.local.stack import free_port_block

ROOT = Path(__file__).resolve().parents[2]
QUICK_START = re.compile(r"```bash\npip install -e \. && (tandem up [^\n]+)\n```")


def test_the_readme_names_the_command_and_the_tests_command():
    readme = (ROOT / "README.md").read_text()
    assert QUICK_START.search(readme), (
        "the README's local run is `pip install -e . && tandem up ...` in a bash block"
    )
    assert "```bash\npip install -e '.[test]' && pytest\n```" in readme


@pytest.mark.slow  # three processes load torch and the model on a busy 2-core host: over a minute
def test_the_readmes_local_command_streams_an_answer_and_prints_ttft_and_tpot(tmp_path):
    found = QUICK_START.search((ROOT / "README.md").read_text())
    assert found is not None
    argv = shlex.split(found.group(1))
    assert argv[:2] == ["tandem", "up"] and "--demo" in argv and "--create-tiny" in argv, argv
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    base = free_port_block(24)
    out = subprocess.run(
        [sys.executable, "-m", "tandem", *argv[1:], "--port", str(base), "--worker-port", str(base + 2)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert re.search(r"TTFT [\d.]+ ms \| TPOT [\d.]+ ms \| [1-9]\d* tokens", said), said
    assert (tmp_path / ".tandem/models/tiny/config.json").is_file()
