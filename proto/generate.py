"""Regenerate the Python code for the kubelet protos: `python -m proto.generate` (what `make proto` runs).

Every `*.proto` under proto/ is compiled with the protoc bundled in grpcio-tools, with the repository
root as the only import root, so a file proto/dra/v1/api.proto becomes the module proto.dra.v1.api_pb2
and registers itself under a path no other file shares (two files both registered as "api.proto"
would collide in protobuf's default descriptor pool). Next to each _pb2.py/_pb2_grpc.py it writes
mypy-protobuf stubs (.pyi) so callers type-check against the messages.

The output depends only on the .proto sources and the generator versions, so running it twice gives
byte-identical files; tests/proto/test_proto.py regenerates into a temporary directory and compares.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerateError(Exception):
    """protoc or one of its plugins failed, or a plugin is not installed."""


def proto_sources(root: Path = REPO_ROOT) -> list[Path]:
    """The .proto files to compile, relative to `root`, in a stable order."""
    return sorted(p.relative_to(root) for p in (root / "proto").rglob("*.proto"))


def generated_files(root: Path) -> list[Path]:
    """Generated files under `root`/proto, relative to `root`, in a stable order."""
    return sorted(
        p.relative_to(root)
        for p in (root / "proto").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    )


def _plugin(name: str) -> str:
    # Look beside the interpreter first: `make proto` runs .venv/bin/python without activating the
    # venv, so the plugin is usually not on PATH.
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise GenerateError(f"{name} not found next to {sys.executable} or on PATH: install mypy-protobuf")
    return found


def generate(out_dir: Path = REPO_ROOT, root: Path = REPO_ROOT) -> list[Path]:
    """Compile every proto under `root`/proto into `out_dir` (same relative layout); return the files written."""
    from grpc_tools import protoc

    sources = proto_sources(root)
    if not sources:
        raise GenerateError(f"no .proto files under {root / 'proto'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(s) for s in sources),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise GenerateError(f"protoc exited with {rc} compiling {', '.join(map(str, sources))}")
    return generated_files(out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="write under this directory (default: the repo)")
    args = parser.parse_args(argv)
    try:
        written = generate(args.out)
    except GenerateError as exc:
        sys.stderr.write(f"proto.generate: {exc}\n")
        return 1
    sys.stdout.write("".join(f"{args.out / p}\n" for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
