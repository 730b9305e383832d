"""Recovery sweeps and the daily TIL batch."""
