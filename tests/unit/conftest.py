"""The unit tier: no servers (no PostgreSQL, no RabbitMQ), well under 10 s in all."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/unit/" in item.nodeid:
            item.add_marker(pytest.mark.unit)
