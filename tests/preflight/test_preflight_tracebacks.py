from __future__ import annotations

import os
import sysconfig

from prudent.preflight.tracebacks import format_frames, is_user_file, parse_stderr

STDERR = """some output
Traceback (most recent call last):
  File "/home/me/train.py", line 40, in <module>
    run.log(val_acc=evaluate())
  File "{lib}/torch/nn/modules/module.py", line 1, in _call_impl
    return forward_call(*args, **kwargs)
  File "/home/me/train.py", line 12, in evaluate
    return correct / totl
NameError: name 'totl' is not defined
"""


def test_parse_stderr_reads_the_last_traceback() -> None:
    lib = sysconfig.get_paths()["purelib"]
    exc = parse_stderr(STDERR.format(lib=lib))
    assert exc is not None
    assert (exc["type"], exc["message"]) == ("NameError", "name 'totl' is not defined")
    assert [f["line"] for f in exc["frames"]] == [40, 1, 12]
    assert exc["frames"][2]["code"] == "return correct / totl"
    assert parse_stderr("no traceback here") is None


def test_format_frames_keeps_only_the_users_frames() -> None:
    lib = sysconfig.get_paths()["purelib"]
    text = format_frames(parse_stderr(STDERR.format(lib=lib)))  # type: ignore[arg-type]
    assert "module.py" not in text
    assert text.splitlines()[-1] == "NameError: name 'totl' is not defined"
    assert 'File "/home/me/train.py", line 12, in evaluate' in text


def test_prudent_and_library_files_are_not_the_users() -> None:
    import prudent

    assert not is_user_file(prudent.__file__)
    assert not is_user_file(os.__file__)
    assert is_user_file("/home/me/train.py")
