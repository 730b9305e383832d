"""docs/operations.md documents every setting a service reads, so it cannot silently rot."""

from __future__ import annotations

from tests.deploy.services import ROOT, services


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    names = {name for service in services().values() for name in service.env_names}
    undocumented = sorted(name for name in names if f"`{name}`" not in text)
    assert not undocumented, f"docs/operations.md does not mention {undocumented}"
