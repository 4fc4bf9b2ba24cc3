from __future__ import annotations

import prudent.profile


def test_profile_exports_a_small_sorted_public_api() -> None:
    assert prudent.profile.__all__ == sorted(prudent.profile.__all__)
    for name in prudent.profile.__all__:
        assert hasattr(prudent.profile, name)
