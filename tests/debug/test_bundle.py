from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from prudent.debug.bundle import read_bundle, write_bundle
from prudent.debug.settings import DebugSettings, parse_bytes
from prudent.kernel.errors import ConfigError


def _write(folder: Path, max_bytes: int = 10**9) -> str:
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()  # Adam's state: twice the model's size
    batch = (torch.randn(4, 64), torch.tensor([0, 1, 2, 3]))
    written = write_bundle(folder, "step-7", {"step": 7, "reason": "test"}, batch,
                           {"rng": {"torch": torch.get_rng_state()}, "loss": torch.tensor(1.5)},
                           {"model": model.state_dict(), "optimizer": opt.state_dict()}, max_bytes)
    return written.path


def test_bundle_round_trip_restores_every_part(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert Path(path) == tmp_path / "step-7" and not list(tmp_path.glob(".tmp-*"))
    bundle = read_bundle(path)
    assert bundle.info["step"] == 7 and bundle.info["left_out"] == []
    assert bundle.info["objects"] == ["model", "optimizer"]
    x, y = bundle.load("batch.pt")
    assert x.shape == (4, 64) and y.tolist() == [0, 1, 2, 3]
    assert set(bundle.load("object-model.pt")) == {"weight", "bias"}
    assert bundle.load("run.pt")["loss"].item() == 1.5


def test_bundle_over_max_bytes_leaves_largest_object_out_and_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, max_bytes=64 * 1024 + 40_000)  # fits the model (17 kB), not Adam
    bundle = read_bundle(path)
    (left,) = bundle.info["left_out"]
    assert left["part"] == "optimizer" and "does not fit" in left["why"]
    assert bundle.has("object-model.pt") and not bundle.has("object-optimizer.pt")
    assert bundle.num_bytes <= 64 * 1024 + 40_000


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda p: (p / "manifest.json").unlink(), "it has no manifest.json"),
    (lambda p: (p / "manifest.json").write_text('{"files": '), "manifest.json is unreadable"),
    (lambda p: (p / "object-model.pt").write_bytes((p / "object-model.pt").read_bytes()[:100]),
     "object-model.pt is truncated"),
    (lambda p: _flip_byte(p / "object-model.pt"), "object-model.pt is corrupted (sha256"),
    (lambda p: (p / "batch.pt").unlink(), "batch.pt is missing"),
])
def test_damaged_bundle_is_refused_naming_the_problem(
        tmp_path: Path, damage: Callable[[Path], object], expected: str) -> None:
    path = Path(_write(tmp_path))
    damage(path)
    with pytest.raises(ConfigError, match="refusing to replay it") as info:
        read_bundle(path)
    assert expected in str(info.value)


def test_missing_bundle_names_where_bundles_are(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no capture bundle at .*captures/step-<N>"):
        read_bundle(tmp_path / "nope")


class Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("code from the bundle ran",))


def test_bundle_never_runs_code_from_a_file_even_with_matching_checksums(tmp_path: Path) -> None:
    path = Path(_write(tmp_path))
    torch.save(Payload(), path / "batch.pt")  # a crafted file, manifest updated to match
    manifest = json.loads((path / "manifest.json").read_text())
    data = (path / "batch.pt").read_bytes()
    manifest["files"]["batch.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="batch.pt cannot be loaded safely"):
        read_bundle(path).load("batch.pt")


def test_max_bytes_accepts_units() -> None:
    assert parse_bytes("512MB") == 512_000_000 and parse_bytes("2GiB") == 2 * 1024**3
    assert DebugSettings().max_bytes == 10**9
    with pytest.raises(ValueError, match="at least 1MB"):
        DebugSettings(max_bytes="10kB")


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
