"""Where the test suite's time goes: per folder and the slowest files, from a JUnit XML report.

    python3 dev.py test --junitxml=artifacts/suite.xml
    .venv/bin/python bench/suite_times.py artifacts/suite.xml [--files 25]
    .venv/bin/python bench/suite_times.py artifacts/suite.xml --write-durations tests/durations.json

Times are the tests' own (setup, call and teardown as pytest reports them), summed per folder
and per file; with several test processes the wall time is shorter than the sum. The table
goes into bench/suite_times.md so that the next slow test is visible. ``--write-durations``
writes the per-file seconds that test processes use to take the longest files first
(tests/file_order.py).
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict


def times(path: str) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    per_file: dict[str, float] = defaultdict(float)
    per_folder: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # "tests.runs.test_worker" or "tests.runs.test_worker.TestX"
        parts = [p for p in module if not p[:1].isupper()]
        name = "/".join(parts) + ".py"
        folder = "/".join(parts[:-1]) + "/"
        seconds = float(case.get("time") or 0)
        per_file[name] += seconds
        per_folder[folder] += seconds
        counts[folder] += 1
    return per_folder, per_file, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--files", type=int, default=25)
    parser.add_argument("--write-durations", metavar="JSON", help="per-file seconds, to this file")
    args = parser.parse_args()
    per_folder, per_file, counts = times(args.report)
    if args.write_durations:
        table = {name: round(seconds, 1) for name, seconds in sorted(per_file.items())}
        with open(args.write_durations, "w") as out:
            out.write(json.dumps(table, indent=1) + "\n")
    total = sum(per_folder.values())
    print("| folder | tests | seconds | share |\n|---|--:|--:|--:|")
    for folder, seconds in sorted(per_folder.items(), key=lambda kv: -kv[1]):
        print(f"| {folder} | {counts[folder]} | {seconds:.0f} | {seconds / total:.0%} |")
    print(f"| **all** | {sum(counts.values())} | {total:.0f} | |\n")
    print(f"| slowest {args.files} files | seconds |\n|---|--:|")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.files]:
        print(f"| {name} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
