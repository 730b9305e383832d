"""Fixtures of the API suite (the shared ones live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from san_api.settings import ApiSettings
from tests.conftest import api_settings


@pytest.fixture
def settings_for(db_url: str, amqp_url: str) -> Callable[..., ApiSettings]:
    """API settings on the shared test database, with the given overrides."""

    def build(**overrides: object) -> ApiSettings:
        broker = str(overrides.pop("amqp_url", amqp_url))
        return api_settings(db_url, broker, **overrides)

    return build
