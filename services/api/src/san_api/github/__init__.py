"""GitHub: account linking (token or OAuth), repositories, TIL commits, star recommendations."""
