"""`python -m benchmarks.scaling` (docs/scaling.md's curves) run small against the current
schema and the runtime's own statements, so the tool cannot drift from the code it
measures (it once called `complete` with a worker id where the try's number now goes)."""

from __future__ import annotations

from benchmarks.scaling import BATCH, cards_curve, jobs_curve


async def test_the_jobs_curve_measures_every_step_at_each_size(pg_server: str) -> None:
    rows = await jobs_curve(pg_server, [300, 600], samples=BATCH)
    assert [row["jobs"] for row in rows] == [300, 600]
    for row in rows:
        assert all(value not in ("", None) for value in row.values()), row
        dead, vacuum = row["dead tuples; VACUUM (s)"].split("; ")
        # every measured job was updated twice and every outbox row once: the run leaves
        # dead tuples, and the figures say so
        assert int(dead.replace(",", "")) >= 2 * 2 * BATCH
        assert float(vacuum) >= 0


async def test_the_cards_curve_reports_recall_against_the_exact_scan(pg_server: str) -> None:
    row, wider = await cards_curve(pg_server, [400], samples=10, ef_searches=(None, 400))
    assert (row["cards"], row["ef_search"]) == (400, "function's")
    assert float(row["recall_at_10"]) >= 0.9
    assert int(row["hnsw_mb"]) > 0
    # a wider search over the same cards, against the same exact answers
    assert (wider["ef_search"], wider["exact_ms"]) == (400, row["exact_ms"])
    assert float(wider["recall_at_10"]) >= 0.9
