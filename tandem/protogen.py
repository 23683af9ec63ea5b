"""Regenerate the checked-in gRPC/protobuf stubs of protos/tandem/v1 with grpcio-tools."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PROTO_PACKAGE = Path("tandem") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def repo_protos_dir() -> Path:
    """The `protos/` folder of a source checkout (this file lives in `tandem/`)."""
    return Path(__file__).resolve().parent.parent / "protos"


def proto_files(protos_dir: Path) -> list[Path]:
    return sorted((protos_dir / PROTO_PACKAGE).glob("*.proto"))


def generated_files(out_dir: Path) -> list[Path]:
    package = out_dir / PROTO_PACKAGE
    return sorted(p for p in package.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def generate(protos_dir: Path, out_dir: Path) -> list[Path]:
    """Run protoc on every .proto under protos_dir/tandem/v1, writing stubs under out_dir/tandem/v1."""
    from grpc_tools import protoc  # imported late: grpcio-tools is a development dependency

    protos = proto_files(protos_dir)
    if not protos:
        raise FileNotFoundError(f"no .proto files under {protos_dir / PROTO_PACKAGE}")
    (out_dir / PROTO_PACKAGE).mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{protos_dir}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p) for p in protos),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    return generated_files(out_dir)


def gencode_versions(stub: str) -> dict[str, str]:
    """The protobuf and grpc versions a generated stub was made with, read from its text."""
    found = {}
    if m := re.search(r"# Protobuf Python Version: (\S+)", stub):
        found["protobuf"] = m.group(1)
    if m := re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", stub):
        found["grpc"] = m.group(1)
    return found


def runtime_accepts(gencode: str, runtime: str) -> bool:
    """Protobuf's rule: same major version, and the runtime no older than the gencode."""
    g = tuple(int(x) for x in re.findall(r"\d+", gencode)[:3])
    r = tuple(int(x) for x in re.findall(r"\d+", runtime)[:3])
    return g[0] == r[0] and r >= g


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.protogen", description=__doc__)
    parser.add_argument("--protos", type=Path, default=repo_protos_dir(), help="the protos/ folder")
    parser.add_argument("--out", type=Path, default=None, help="output root (default: the protos/ folder)")
    ns = parser.parse_args(argv)
    out = ns.out or ns.protos
    written = generate(ns.protos, out)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
