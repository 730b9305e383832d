"""github-worker: consumes TIL_GITHUB_COMMIT with its own queue and pool (SPEC §2.5)."""
