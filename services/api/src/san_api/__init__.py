"""FastAPI HTTP API: scraps, cards, TIL, jobs, GitHub linking."""
