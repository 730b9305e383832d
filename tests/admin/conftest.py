"""Fixtures of the admin suite (the shared ones live in tests/conftest.py)."""

from __future__ import annotations

from tests.api.conftest import settings_for  # noqa: F401  (API settings with overrides)
