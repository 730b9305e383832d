"""Consumes TIL_GITHUB_COMMIT."""
