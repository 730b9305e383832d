"""Consumes the AI job types."""
