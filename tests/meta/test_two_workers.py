"""The suite's two workers (`bash scripts/test.sh`, by default: pytest-xdist): which tests share a worker, what environment a
worker gives its engines, and which ports each worker takes. Pure: no worker and no engine is started."""

from __future__ import annotations

import os

import workers

from servedeck.testing import ports


def test_a_file_is_a_group_unless_its_directory_holds_session_fixtures():
    dirs = ("tests/report/",)
    assert workers.group_of("tests/deck/test_lifecycle.py::test_a[1]", dirs) == "tests/deck/test_lifecycle.py"
    assert workers.group_of("tests/report/test_report_real.py::test_x", dirs) == "tests/report/"
    assert workers.group_of("tests/reporting/test_y.py::test_z", dirs) == "tests/reporting/test_y.py"


def test_directories_with_session_fixtures_are_found_and_the_root_is_left_out(tmp_path):
    root = tmp_path / "tests"
    for d, text in {"": 'import pytest\n@pytest.fixture(scope="session")\ndef shared(): pass\n',
                    "a": 'import pytest\n@pytest.fixture(scope="session")\ndef built(): pass\n',
                    "b": 'import pytest\n@pytest.fixture(scope="module")\ndef m(): pass\n',
                    "c/d": 'import pytest\n@pytest.fixture(autouse=True, scope="session")\ndef e(): pass\n'}.items():
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "conftest.py").write_text(text)
    assert workers.session_fixture_dirs(root) == ("tests/a/", "tests/c/d/")


def test_the_report_and_capacity_directories_each_run_on_one_worker():
    # their conftests build run folders once per session (five launches; a capacity campaign)
    dirs = workers.session_fixture_dirs()
    assert "tests/report/" in dirs and "tests/capacity/" in dirs
    assert "tests/" not in dirs  # the shared servers: one set per worker


def test_a_worker_gives_its_engines_one_thread_and_its_own_core():
    env = {"PYTEST_XDIST_WORKER": "gw1", "COLUMNS": "80", "LINES": "24"}
    workers.as_a_worker(env)
    assert env["LLAMA_ARG_THREADS"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(1 % (os.cpu_count() or 1))
    assert "COLUMNS" not in env
    assert "LINES" not in env


def test_a_setting_already_made_is_kept_and_one_process_is_left_alone():
    env = {"PYTEST_XDIST_WORKER": "gw0", "LLAMA_ARG_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    workers.as_a_worker(env)
    assert env["LLAMA_ARG_THREADS"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    alone = {"COLUMNS": "120"}
    workers.as_a_worker(alone)
    assert alone == {"COLUMNS": "120"}


def test_each_worker_takes_ports_from_its_own_share(monkeypatch):
    shares = []
    for n in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        shares.append(ports.span(32768))
    assert shares[0][0] == 10000
    assert shares[-1][1] <= 32767
    assert all(a[1] <= b[0] for a, b in zip(shares, shares[1:]))  # no two overlap
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports.span(32768) == (10000, 32767)


def test_a_process_never_gets_the_same_port_twice(monkeypatch):
    # one models.toml asks for several ports before any engine binds one: a second draw of the same port
    # (here forced) is drawn again (a collision failed a test in a two-worker run, 2026-12-04)
    draws = iter([23456, 23456, 23456, 23457])
    monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
    monkeypatch.setattr(ports, "given", set())
    monkeypatch.setattr(ports, "bindable", lambda p: True)
    assert [ports.free_port(), ports.free_port()] == [23456, 23457]


def test_the_second_port_of_a_pair_is_not_handed_out_again(monkeypatch):
    draws = iter([23456, 23457, 23458])
    monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
    monkeypatch.setattr(ports, "given", set())
    monkeypatch.setattr(ports, "bindable", lambda p: True)
    assert ports.free_port_pair() == 23456
    assert ports.free_port() == 23458  # 23457 serves the pair's second replica


def test_the_worker_is_read_from_xdist_s_name_for_it():
    assert workers.worker_index({"PYTEST_XDIST_WORKER": "gw3"}) == 3
    assert workers.worker_index({"PYTEST_XDIST_WORKER": "master"}) is None
    assert workers.worker_index({}) is None
