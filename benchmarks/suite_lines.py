"""Tag the JSON lines a GPU-suite part prints with that part, the device it ran on and the date, so that the
tables of docs/performance.md read every figure beside where and when it was measured.

    python benchmarks/compare_trl.py ... | python benchmarks/suite_lines.py --part compare --device "NVIDIA H200" \\
        shape=llama-3.2-1b

Reads lines on stdin: each JSON object gets `part`, `device`, `date` (UTC, ISO 8601) and the given key=value
fields first (a value JSON reads, such as seconds=12.5, as a number), then its own; the part's device wins over a
child's own guess of it. Other lines go to stderr untouched. Standard library only: the suite runs it before and
after its wheels are installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys


def tagged(line: str, fields: dict[str, str]) -> str | None:
    """The line with `fields` first, or None when it is no JSON object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return json.dumps(fields | {k: v for k, v in row.items() if k not in fields}) if isinstance(row, dict) else None


def typed(field: str) -> tuple[str, object]:
    """key=value with the value as JSON reads it (seconds=12.5 a number), else as the string it is."""
    key, value = field.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", required=True)
    parser.add_argument("--device", required=True, help="the GPU's name, or the CPU's")
    parser.add_argument("fields", nargs="*", help="key=value added to every line")
    args = parser.parse_args()
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    fields = {"part": args.part, "device": args.device, "date": date}
    fields |= dict(typed(field) for field in args.fields)
    for line in sys.stdin:
        out = tagged(line, fields)
        print(out if out is not None else line.rstrip("\n"), file=sys.stdout if out is not None else sys.stderr)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
