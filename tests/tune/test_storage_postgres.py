"""`servedeck tune FILE --storage postgresql://…`: the study in a real PostgreSQL server (tests/pgserver.py), not in
the tune folder. What a user relies on: the database is reached before a folder is made; tune.json names it without
its password; each tune has a study of its own there (two tunes of one file never continue each other's); a resume
finds it from tune.json and refuses another database; `tune show` reads the importance from it. No engine is
launched: the study's bookkeeping is the head's alone (runner.py), the same on any storage."""

from __future__ import annotations

import json
import socket

import optuna
import pytest
from typer.testing import CliRunner

from pgserver import postgres
from ports import free_port
from servedeck.cli import root_app
from servedeck.errors import RunError, UsageError
from servedeck.tune.file import parse
from servedeck.tune.runner import TuneRun
from servedeck.tune.storage import check

from tests.tune.test_resume import TUNE


@pytest.fixture(scope="module")
def pg_url():
    with postgres() as url:
        yield url


def _run(cfg, tmp_path, resume: bool = False, storage: str | None = None) -> TuneRun:
    (tmp_path / "search.toml").write_text(TUNE)
    return TuneRun(cfg, parse(TUNE, tmp_path / "search.toml"), resume, storage=storage)


def test_the_study_is_in_the_named_database_under_a_name_of_its_own(deck_config, tmp_path, monkeypatch, pg_url):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    with_password = pg_url.replace("postgres@", "postgres:s3cret@")  # trust authentication ignores it
    first = _run(deck_config, tmp_path, storage=with_password)
    doc = first.folder.doc
    assert doc["storage"] == pg_url.replace("postgres@", "postgres:***@")
    assert "s3cret" not in (first.folder.path / "tune.json").read_text()
    assert doc["study_name"].startswith(f"{first.folder.path.name}@{socket.gethostname()}.")
    study = first._study()
    t = study.ask()
    study.tell(t, 1.5)
    assert not (first.folder.path / "study.db").exists()
    # straight from the database, as another host's Optuna would read it
    names = [s.study_name for s in optuna.get_all_study_summaries(storage=pg_url)]
    assert doc["study_name"] in names

    # a resume without --storage connects to the recorded database (its password from libpq's environment)
    again = _run(deck_config, tmp_path, resume=True)
    assert again.folder.path == first.folder.path
    assert [x.value for x in again._study().get_trials(deepcopy=False)] == [1.5]

    # a second tune of the same file: a folder and a study of its own, empty
    monkeypatch.setattr("servedeck.tune.folder.datetime", _Later)
    second = _run(deck_config, tmp_path, storage=pg_url)
    assert second.folder.path != first.folder.path
    assert second.folder.doc["study_name"] != doc["study_name"]
    assert second._study().get_trials(deepcopy=False) == []
    # and one in another results folder whose folder has the same name (the same tune, the same second): its own
    # study too (a fresh-clone CI run had two tests' tunes meet in one study before the name had a random tag)
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results-2"))
    third = _run(deck_config, tmp_path, storage=pg_url)
    assert third.folder.path.name == second.folder.path.name
    assert third.folder.doc["study_name"] != second.folder.doc["study_name"]
    assert third._study().get_trials(deepcopy=False) == []


class _Later:
    """datetime for the second and third tune folders: one fixed instant, never the clock's now, so the second's name
    differs from the first's and the third's equals the second's (a live now() once ticked to the next second
    between them in a fresh-clone CI run)."""

    @staticmethod
    def now():
        from datetime import datetime

        return datetime(2000, 1, 1, 12, 0, 0)


def test_a_resume_names_the_database_the_tune_began_in_or_none(deck_config, tmp_path, monkeypatch, pg_url):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    _run(deck_config, tmp_path, storage=pg_url)
    other = pg_url.rsplit("/", 1)[0] + "/postgres"
    with pytest.raises(UsageError) as e:
        _run(deck_config, tmp_path, resume=True, storage=other)
    assert f"this tune's study is in {pg_url}, not {other}" in e.value.message
    assert _run(deck_config, tmp_path, resume=True, storage=pg_url).at.shown == pg_url

    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results-sqlite"))
    _run(deck_config, tmp_path)  # study.db in its folder
    with pytest.raises(UsageError) as e:
        _run(deck_config, tmp_path, resume=True, storage=pg_url)
    assert "this tune's study is in its folder" in e.value.message and "resume it without --storage" in e.value.hint


def test_a_database_that_cannot_be_reached_is_said_before_any_folder_is_made(deck_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    url = f"postgresql://postgres:pw@127.0.0.1:{free_port()}/tunes"  # nothing listens there
    with pytest.raises(RunError) as e:
        _run(deck_config, tmp_path, storage=url)
    assert e.value.message.startswith("the tune's study storage postgresql://postgres:***@127.0.0.1:")
    assert "cannot be reached" in e.value.message and "pw@" not in e.value.message
    assert not (tmp_path / "results" / "tunes").exists() or not any((tmp_path / "results" / "tunes").iterdir())


def test_a_url_that_is_not_one_or_lacks_its_driver_is_refused_with_what_to_do():
    with pytest.raises(UsageError) as e:
        check("postgres at db1")
    assert "is not a database URL" in e.value.message
    with pytest.raises(UsageError) as e:
        check("oracle+nosuch://u@h/db")
    assert "not a database kind SQLAlchemy knows" in e.value.message
    with pytest.raises(UsageError) as e:
        check("mysql://u@h/db")  # the mysqlclient driver is not installed here
    assert "its driver is not installed" in e.value.message and "mysql" in e.value.hint


def test_tune_show_reads_the_importance_from_the_database(deck_config, tmp_path, monkeypatch, pg_url):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    run = _run(deck_config, tmp_path, storage=pg_url)
    study = run._study()
    for parallel, batch in ((1, 64), (4, 70), (2, 500), (1, 400), (4, 300), (2, 100)):
        study.enqueue_trial({"args.parallel": parallel, "args.batch-size": batch})
        t = study.ask()
        p = t.suggest_categorical("args.parallel", [1, 2, 4])
        b = t.suggest_int("args.batch-size", 64, 512, log=True)
        study.tell(t, p * 1.0 + b / 100_000)
    r = CliRunner().invoke(root_app, ["tune", "show", run.folder.path.name, "--json"])
    assert r.exit_code == 0, r.output
    imp = json.loads(r.stdout)["importance"]
    assert imp["trials"] == 6 and list(imp["importance"])[0] == "args.parallel", imp
