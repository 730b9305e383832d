"""Bearer JWT authentication (SPEC §8)."""
