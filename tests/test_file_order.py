"""Test processes take whole files longest first (tests/file_order.py): the scheduler as
pytest-xdist drives it, with stand-in processes that record the tests they are sent."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.file_order import LongestFileFirst, load_durations


class Process:
    """A test process as the scheduler sees it: it is sent test indices and may be shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(collection, durations, processes=2):
    config = SimpleNamespace(
        getvalue=lambda name: {"tx": [f"{processes}*popen"]}[name],
        option=SimpleNamespace(loadscopereorder=True),
    )
    sched = LongestFileFirst(config, durations=durations)
    nodes = [Process(f"gw{i}") for i in range(processes)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def files_sent(node, collection):
    files = []
    for index in node.sent:
        name = collection[index].split("::")[0]
        if name not in files:
            files.append(name)
    return files


def test_the_longest_files_start_first_whatever_their_number_of_tests():
    collection = [
        *(f"tests/many.py::test_{i}" for i in range(40)),
        "tests/soak.py::test_chaos",
        "tests/install.py::test_fresh",
        *(f"tests/small_{i}.py::test_it" for i in range(6)),
    ]
    durations = {"tests/many.py": 30.0, "tests/soak.py": 180.0, "tests/install.py": 120.0}
    durations |= {f"tests/small_{i}.py": 0.1 * (i + 1) for i in range(6)}
    sched, (first, second) = scheduler(collection, durations)

    assert files_sent(first, collection)[0] == "tests/soak.py"
    assert files_sent(second, collection)[0] == "tests/install.py"
    # each holds one long test: the next test it needs to start it is the shortest file
    assert files_sent(first, collection)[1] == "tests/small_0.py"
    assert files_sent(second, collection)[1] == "tests/small_1.py"
    assert "tests/many.py" in sched.workqueue


def test_a_process_about_to_be_free_takes_the_longest_file_waiting():
    collection = [
        *(f"tests/a.py::test_{i}" for i in range(4)),
        *(f"tests/b.py::test_{i}" for i in range(4)),
        *(f"tests/c.py::test_{i}" for i in range(10)),
        "tests/d.py::test_it",
    ]
    durations = {"tests/a.py": 8.0, "tests/b.py": 4.0, "tests/c.py": 2.0, "tests/d.py": 1.0}
    sched, (first, second) = scheduler(collection, durations)
    assert files_sent(first, collection) == ["tests/a.py"]
    assert files_sent(second, collection) == ["tests/b.py"]

    for index in first.sent[:2]:  # two of a.py's four done: two left, 4 s of work
        sched.mark_test_complete(first, index)
    assert files_sent(first, collection) == ["tests/a.py", "tests/c.py"]


def test_a_file_the_table_does_not_know_is_estimated_from_its_tests():
    collection = [
        *(f"tests/new.py::test_{i}" for i in range(30)),
        *(f"tests/known.py::test_{i}" for i in range(10)),
        "tests/long.py::test_it",
    ]
    # the table's files take 30 s over 11 tests: new.py's 30 tests about 82 s, more than long.py
    durations = {"tests/known.py": 10.0, "tests/long.py": 1.0 * 20}
    sched, nodes = scheduler(collection, durations, processes=1)
    assert sched.estimate("tests/new.py", 30) == 30 * (30.0 / 11)
    assert files_sent(nodes[0], collection)[0] == "tests/new.py"


def test_the_table_is_read_and_a_missing_or_broken_one_is_empty(tmp_path):
    table = load_durations()
    assert table and all(seconds >= 0 for seconds in table.values())
    assert load_durations(tmp_path / "missing.json") == {}
    broken = tmp_path / "durations.json"
    broken.write_text("{not json")
    assert load_durations(broken) == {}
    broken.write_text(json.dumps({"tests/x.py": 2}))
    assert load_durations(broken) == {"tests/x.py": 2.0}
