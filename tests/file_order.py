"""The order in which test processes take whole test files (``--dist loadfile``): the longest
first, by the seconds each file took in a measured run (tests/durations.json).

pytest-xdist's own file scheduler takes the files with the most tests first, so the long files
with one or two tests (the soaks, the fresh installs, the calendar) start last and make the
run's tail. Taking the longest first (longest-processing-time-first) lets the short files fill
in beside them instead.

A process can start a file's last test only once it holds a next one (pytest-xdist keeps one
test back until more work or the end of the run arrives). A process that asks for more work
while its own files still hold much of it (a single long test) gets the shortest file waiting,
not the next long one, which another process will soon be free to take.

    python3 dev.py test --junitxml=artifacts/suite.xml
    .venv/bin/python bench/suite_times.py artifacts/suite.xml --write-durations tests/durations.json

rewrites the table from a run; a file the table does not know is estimated from its number of
tests and the table's seconds per test.
"""

from __future__ import annotations

import json
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

DURATIONS = Path(__file__).resolve().parent / "durations.json"
SECONDS_PER_TEST_UNKNOWN = 1.5  # the whole suite's average, when the table is empty
# A process whose assigned files still hold more than this many seconds of work takes the
# shortest file waiting (it needs a next test only to start its current one).
BUSY_S = 20.0


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """``{"tests/soak/test_short_soak.py": 120.4, ...}``; empty when the table is missing."""
    try:
        table = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(name): float(seconds) for name, seconds in table.items()}


class LongestFileFirst(LoadFileScheduling):
    """``--dist loadfile`` with the work queue taken longest file first."""

    def __init__(self, config, log=None, durations: dict[str, float] | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations() if durations is None else durations
        self.per_test = SECONDS_PER_TEST_UNKNOWN  # the table's own average once collected

    def estimate(self, scope: str, tests: int) -> float:
        """The seconds a file is expected to take: the table's, else its tests × the average."""
        seconds = self.durations.get(scope)
        return seconds if seconds is not None else tests * self.per_test

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed:
            counts: dict[str, int] = {}
            for nodeid in next(iter(self.registered_collections.values()), []):
                scope = self._split_scope(nodeid)
                counts[scope] = counts.get(scope, 0) + 1
            measured = [scope for scope in counts if scope in self.durations]
            tests = sum(counts[scope] for scope in measured)
            if tests:
                self.per_test = sum(self.durations[scope] for scope in measured) / tests
        super().schedule()

    def remaining(self, node) -> float:
        """The expected seconds of the work a process holds and has not finished."""
        total = 0.0
        for scope, unit in self.assigned_work.get(node, {}).items():
            pending = list(unit.values()).count(False)
            if pending:
                total += self.estimate(scope, len(unit)) * pending / len(unit)
        return total

    def _assign_work_unit(self, node) -> None:
        assert self.workqueue
        size = {scope: self.estimate(scope, len(unit)) for scope, unit in self.workqueue.items()}
        if self.remaining(node) > BUSY_S:
            scope = min(size, key=size.__getitem__)
        else:
            scope = max(size, key=size.__getitem__)
        work_unit = self.workqueue.pop(scope)
        self.log(f"{scope} (~{size[scope]:.0f} s) to {node.gateway.id}")
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )
