"""Bearer JWT authentication (docs/reference/job-rules.md §8)."""
