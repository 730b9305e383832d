"""Issue 13's acceptance ratios as `make bench` computes them: against the four peers with
their defaults, never against a variant run beside them (`dramatiq_durable`)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.run import acceptance, peer_rows

pytestmark = pytest.mark.unit


def _run(rate: float, p99_ms: float) -> dict[str, list[dict[str, Any]]]:
    outcome = {"rate": rate, "latency_p50_ms": p99_ms / 2, "latency_p99_ms": p99_ms}
    return {"drain": [outcome], "burst": [outcome], "paced": [outcome]}


def test_a_variant_is_reported_but_never_the_bar() -> None:
    table = peer_rows(
        {
            "san": _run(500, 10.0),
            "pgqueuer": _run(1000, 4.0),
            "dramatiq": _run(2000, 2.0),
            # faster than every peer: any bar it joined would move
            "dramatiq_durable": _run(4000, 1.0),
        }
    )
    checks = dict(acceptance(table, {}))
    assert checks["drain ≥ 1.0 × pgqueuer"] == "0.50×"
    assert checks["burst enqueue→done ≥ 1.0 × best peer"] == "0.25×"
    assert checks["paced p99 ≤ 1.5 × best peer's and < 20 ms"].startswith("5.00×")
    assert "dramatiq_durable" in table  # its row is still rendered
