"""Generate the committed Python stubs from protos/**/*.proto.

Run with the oldest supported grpcio-tools (pinned in the dev extra, 1.81.1), so the stubs work
with every protobuf runtime from 6.33.5 to 7.x. ``--out DIR`` writes elsewhere (the drift test
compares that output with the committed files).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_sources() -> list[Path]:
    return sorted((ROOT / "protos").rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Compile every .proto under protos/ into ``out`` (mirroring protos/...); return the files."""
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    sources = [str(p.relative_to(ROOT)) for p in proto_sources()]
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *sources,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        written = []
        for path in sorted(Path(tmp).rglob("*")):
            if path.name.endswith(GENERATED_SUFFIXES):
                target = out / path.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))


if __name__ == "__main__":
    sys.exit(main())
