"""github-worker: consumes TIL_GITHUB_COMMIT with its own queue and pool
(docs/reference/job-rules.md §2.5)."""
