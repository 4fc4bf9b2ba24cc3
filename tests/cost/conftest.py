from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_skypilot_home(tmp_path_factory: pytest.TempPathFactory,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A home without ~/.sky: a developer's own SkyPilot catalog must not change the prices."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))

