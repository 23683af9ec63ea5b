"""Where the API server is and who the operator is to it, read as kubectl reads them: a kubeconfig's current
context (tokens, client certificates, credential plugins) or the pod's ServiceAccount.

The operator speaks to the API server through runtime/kube.py and kopf, so it needs no generated client.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# a projected ServiceAccount token is rotated in place by the kubelet: read it again this often
TOKEN_REREAD = dt.timedelta(minutes=1)
PLUGIN_TIMEOUT_SECONDS = 60


class LoginError(ValueError):
    """No usable credentials: says which file, context or plugin and why."""


def login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """`kubeconfig` if given; else the pod's ServiceAccount; else $KUBECONFIG or ~/.kube/config."""
    if kubeconfig:
        return from_kubeconfig([Path(kubeconfig)])
    pod = in_cluster()
    if pod is not None:
        return pod
    paths = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    default = Path("~/.kube/config").expanduser()
    if not paths and default.exists():
        paths = [default]
    if not paths:
        raise LoginError(
            "no credentials: not in a pod with a ServiceAccount token, and no kubeconfig "
            "(--kubeconfig, $KUBECONFIG or ~/.kube/config)"
        )
    return from_kubeconfig(paths)


def in_cluster(
    account: Path = SERVICE_ACCOUNT, env: Mapping[str, str] = os.environ
) -> kopf.ConnectionInfo | None:
    """The pod's ServiceAccount and the API server its environment names; None outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token = account / "token"
    if not (host and port and token.exists()):
        return None
    namespace = account / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        ca_path=str(account / "ca.crt"),
        scheme="Bearer",
        token=token.read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
        expiration=dt.datetime.now(dt.UTC) + TOKEN_REREAD,
    )


def from_kubeconfig(paths: list[Path]) -> kopf.ConnectionInfo:
    """The current context of one or more kubeconfig files merged as kubectl merges them (the first file
    to set a name or the current context wins); relative paths are relative to the file that names them."""
    current: str | None = None
    entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
        "contexts": {},
        "clusters": {},
        "users": {},
    }
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise LoginError(f"kubeconfig {path}: {e}") from e
        current = current or doc.get("current-context")
        for section, field in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
            for item in doc.get(section) or []:
                entries[section].setdefault(item["name"], (item.get(field) or {}, path.parent))
    where = ", ".join(map(str, paths))
    if not current or current not in entries["contexts"]:
        raise LoginError(f"kubeconfig {where}: no current context (or it names no context)")
    context, _ = entries["contexts"][current]
    try:
        cluster, cluster_dir = entries["clusters"][context["cluster"]]
        user, user_dir = entries["users"][context["user"]] if context.get("user") else ({}, Path("."))
    except KeyError as e:
        raise LoginError(f"kubeconfig {where}: context {current} names {e} that it does not define") from e
    if not cluster.get("server"):
        raise LoginError(f"kubeconfig {where}: cluster {context['cluster']} has no server")
    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_path=_path(cluster.get("certificate-authority"), cluster_dir),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        default_namespace=context.get("namespace"),
        proxy_url=cluster.get("proxy-url"),
        **_user(user, user_dir, current),
    )


def _path(value: str | None, base: Path) -> str | None:
    return None if not value else str((base / Path(value).expanduser()).resolve())


def _user(user: dict[str, Any], base: Path, context: str) -> dict[str, Any]:
    """The user's credentials as kopf.ConnectionInfo fields; a credential plugin is run for them."""
    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = Path(_path(user["tokenFile"], base) or "").read_text().strip()
        except OSError as e:
            raise LoginError(f"kubeconfig context {context}: tokenFile: {e}") from e
    if not token and user.get("auth-provider"):
        token = ((user["auth-provider"].get("config") or {}).get("access-token")) or None
        if not token:
            raise LoginError(
                f"kubeconfig context {context}: auth-provider {user['auth-provider'].get('name')} "
                "holds no access-token (use a credential plugin: users[].user.exec)"
            )
    fields: dict[str, Any] = {
        "certificate_path": _path(user.get("client-certificate"), base),
        "certificate_data": user.get("client-certificate-data"),
        "private_key_path": _path(user.get("client-key"), base),
        "private_key_data": user.get("client-key-data"),
        "username": user.get("username"),
        "password": user.get("password"),
    }
    if user.get("exec"):
        status = exec_credential(user["exec"], base)
        token = status.get("token") or token
        if status.get("clientCertificateData"):
            fields |= {
                "certificate_path": None,
                "certificate_data": status["clientCertificateData"],
                "private_key_path": None,
                "private_key_data": status.get("clientKeyData"),
            }
        if status.get("expirationTimestamp"):
            fields["expiration"] = dt.datetime.fromisoformat(status["expirationTimestamp"])
    return {**fields, "scheme": "Bearer" if token else None, "token": token}


def exec_credential(spec: dict[str, Any], base: Path) -> dict[str, Any]:
    """Run a client-go credential plugin (users[].user.exec) and return its ExecCredential's status."""
    command = str(spec.get("command") or "")
    if not command:
        raise LoginError("kubeconfig: users[].user.exec has no command")
    if os.sep in command and not os.path.isabs(command):  # as client-go: relative to the kubeconfig
        command = str(base / command)
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
    )
    try:
        out = subprocess.run(
            [command, *(spec.get("args") or [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=PLUGIN_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LoginError(f"credential plugin {command}: {e}") from e
    if out.returncode != 0:
        raise LoginError(f"credential plugin {command} exited {out.returncode}: {out.stderr.strip()[:500]}")
    try:
        status = json.loads(out.stdout).get("status") or {}
    except (ValueError, AttributeError) as e:
        raise LoginError(
            f"credential plugin {command} printed no ExecCredential: {out.stdout[:200]!r}"
        ) from e
    if not (status.get("token") or status.get("clientCertificateData")):
        raise LoginError(f"credential plugin {command} gave neither a token nor a client certificate")
    return dict(status)
