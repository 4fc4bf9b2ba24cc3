from __future__ import annotations

from pathlib import Path

import pytest

from prudent.kernel.errors import ConfigError
from prudent.tune.study import (
    create_or_load,
    load,
    meta_of,
    open_storage,
    storage_url,
    validate_study_name,
)

META = {"objective": "val_acc", "direction": "max", "space": {"lr": {"type": "float"}},
        "pruner": {"name": "hyperband", "args": {}}}


def test_default_storage_is_a_journal_file_under_home_that_reopens_the_same_study(
        tmp_path: Path) -> None:
    url = storage_url(tmp_path, "s1")
    assert url == str(tmp_path.resolve() / "studies" / "s1.journal")
    study = create_or_load("s1", open_storage(url), META)
    trial = study.ask()
    trial.suggest_float("lr", 0.1, 1.0)
    study.tell(trial, 0.5)
    token = meta_of(study)["token"]
    again = create_or_load("s1", open_storage(url), {**META, "pruner": {"name": "asha"}})
    assert len(again.trials) == 1 and again.direction.name == "MAXIMIZE"
    assert meta_of(again)["token"] == token and meta_of(again)["pruner"] == {"name": "asha"}


@pytest.mark.parametrize(("key", "value"), [("objective", "val_loss"), ("direction", "min"),
                                            ("space", {"lr": {"type": "int"}})])
def test_restart_with_a_different_definition_is_refused(tmp_path: Path, key: str,
                                                        value: object) -> None:
    url = storage_url(tmp_path, "s2")
    create_or_load("s2", open_storage(url), META)
    with pytest.raises(ConfigError, match=f"study 's2' exists with a different {key}"):
        create_or_load("s2", open_storage(url), {**META, key: value})


def test_loading_a_missing_study_names_the_ones_there(tmp_path: Path) -> None:
    storage = open_storage(storage_url(tmp_path, "here"))
    create_or_load("here", storage, META)
    with pytest.raises(ConfigError, match=r"no study 'gone' in this storage \(studies: here\)"):
        load("gone", storage)


def test_database_url_storage_is_an_rdb_storage(tmp_path: Path) -> None:
    import optuna

    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert len(create_or_load("db", storage, META).trials) == 0


@pytest.mark.parametrize("name", ["", "../x", "a b", "-x"])
def test_study_name_must_be_a_safe_file_name(name: str) -> None:
    with pytest.raises(ConfigError, match="study name"):
        validate_study_name(name)
