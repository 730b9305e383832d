"""Shared code of the SAN services. Never runs on its own."""
