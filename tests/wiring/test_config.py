from __future__ import annotations

from pathlib import Path

import pytest

from prudent.kernel.errors import ConfigError
from prudent.wiring.config import load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prudent.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file(home: Path) -> None:
    settings = load_settings(environ={})
    assert (settings.store.home, settings.console.mode, settings.run.device) == (".prudent", "auto", "auto")


def test_file_is_read_from_the_working_directory(home: Path) -> None:
    write(Path.cwd(), "store: {flush_interval_s: 0.2}\nconsole: {mode: plain}\n")
    settings = load_settings(environ={})
    assert settings.store.flush_interval_s == 0.2 and settings.console.mode == "plain"


def test_environment_beats_file_and_flags_beat_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "run: {device: cpu}\nstore: {home: from-file}\n")
    settings = load_settings(path, environ={"PRUDENT_HOME": "from-env"},
                             overrides={("store", "home"): "from-flag"})
    assert settings.store.home == "from-flag" and settings.run.device == "cpu"
    assert load_settings(path, environ={"PRUDENT_HOME": "from-env"}).store.home == "from-env"


def test_unknown_section_lists_allowed_sections(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown section 'stor' \(did you mean 'store'\?\); "
                                          r"allowed: store, console, run"):
        load_settings(write(tmp_path, "stor: {home: x}\n"), environ={})


def test_unknown_key_names_key_and_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'store.hom' \(did you mean "
                                          r"'store.home'\?\); allowed: home, url, flush_interval_s"):
        load_settings(write(tmp_path, "store: {hom: x}\n"), environ={})


def test_wrong_type_names_key_value_and_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, "store: {flush_interval_s: soon}\n"), environ={})
    assert "store.flush_interval_s='soon' is invalid" in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_choice_lists_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"console.mode='fancy' is invalid: .*'auto', 'rich', 'plain' or 'off'"):
        load_settings(write(tmp_path, "console: {mode: fancy}\n"), environ={})


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^PRUDENT_DEVICE: run.device='gpu' is invalid: "
                       r"allowed: auto, cpu, mps, cuda, cuda:N$"):
        load_settings(write(tmp_path, ""), environ={"PRUDENT_DEVICE": "gpu"})


def test_yaml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"prudent.yaml line [23]: not valid YAML"):
        load_settings(write(tmp_path, "store:\n  home: [unclosed\n"), environ={})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read settings file"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_off_written_bare_in_yaml_means_off_not_false(tmp_path: Path) -> None:
    # YAML 1.1 reads off/on/yes/no as booleans: `every: off`, as the docs write it, was
    # refused ("checkpoint.every=False is invalid"); boolean settings still take them
    path = tmp_path / "prudent.yaml"
    path.write_text("checkpoint: {every: off, heartbeat_interval: off}\nconsole: {mode: off}\n"
                    "monitor: {enabled: no}\ndebug: {capture: yes}\n")
    settings = load_settings(path, environ={})
    assert (settings.checkpoint.every, settings.checkpoint.heartbeat_interval,
            settings.console.mode) == ("off", "off", "off")
    assert settings.monitor.enabled is False and settings.debug.capture is True


def test_a_file_that_is_not_sections_shows_what_it_holds(tmp_path: Path) -> None:
    config = tmp_path / "prudent.yaml"
    config.write_text("- checkpoint\n- monitor\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert "got ['checkpoint', 'monitor']" in str(caught.value)
    assert "{data" not in str(caught.value)
