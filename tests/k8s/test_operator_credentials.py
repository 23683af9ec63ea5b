"""The operator's own client against the real API server: it logs in through a credential plugin, and logs
in again when the server answers 401 (a rotated or expired token), so no request is lost to it."""

from __future__ import annotations

import sys

import yaml

from tandem.operator.runtime.kube import Kube
from tandem.testing.cluster import USERS


def test_a_401_logs_in_again_through_the_plugin_and_the_request_succeeds(control_plane, tmp_path):
    cp = control_plane
    calls = tmp_path / "calls"
    plugin = tmp_path / "plugin.py"
    # the first token the plugin gives is one the server refuses; every later one is the admin's
    plugin.write_text(
        f"#!{sys.executable}\nimport json, pathlib\n"
        f"calls = pathlib.Path({str(calls)!r})\n"
        "n = int(calls.read_text()) + 1 if calls.exists() else 1\n"
        "calls.write_text(str(n))\n"
        f"token = 'revoked' if n == 1 else {USERS['admin'][0]!r}\n"
        "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': token}}))\n"
    )
    plugin.chmod(0o755)
    with open(cp.kubeconfig("admin")) as f:
        cfg = yaml.safe_load(f)
    cfg["users"] = [{"name": "admin", "user": {"exec": {"command": str(plugin)}}}]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))

    kube = Kube.from_kubeconfig(str(path))
    assert calls.read_text() == "1"
    assert kube.get("Service", "default", "kubernetes") is not None  # 401, a new login, the same GET
    assert calls.read_text() == "2"
    assert kube.get("Service", "default", "kubernetes") is not None
    assert calls.read_text() == "2"  # a good token is kept
