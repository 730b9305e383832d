"""The acceptance ratios as `make bench` computes them: issue 13's against the four peers
with their defaults, never against the durable variants run beside them; issue 40's
against the peer each bar names (pgqueuer, durable Dramatiq, the like-for-like peer)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.peers.common import CPU_PREFIX
from benchmarks.run import acceptance, peer_rows

pytestmark = pytest.mark.unit


def _run(rate: float, p99_ms: float, cpu_ms: float = 1.0) -> dict[str, list[dict[str, Any]]]:
    outcome = {
        "rate": rate,
        "latency_p50_ms": p99_ms / 2,
        "latency_p99_ms": p99_ms,
        "extra": {f"{CPU_PREFIX}all": cpu_ms},
    }
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


def test_issue_40s_bars_each_name_their_peer() -> None:
    table = peer_rows(
        {
            "san": _run(500, 6.0, cpu_ms=1.2),
            "pgqueuer": _run(1000, 3.0, cpu_ms=0.8),
            "dramatiq": _run(2000, 1.0),  # the best plain peer: none of issue 40's bars
            "dramatiq_durable": _run(1500, 2.0),
            "dramatiq_pg": _run(1200, 4.0),
        }
    )
    checks = dict(acceptance(table, {}))
    assert checks["40: CPU per burst job (all processes) ≤ 1.0 × pgqueuer's"].startswith("1.50×")
    assert checks["40: drain ≥ 1.0 × pgqueuer"] == "0.50×"
    assert checks["40: burst enqueue→done ≥ 1.0 × pgqueuer"] == "0.50×"
    durable = "40: paced p99 ≤ 1.5 × Dramatiq durable (quorum queue + publisher confirms)"
    assert checks[durable].startswith("3.00×")
    like = "40: paced p99 ≤ 1.0 × like-for-like: Dramatiq durable + PostgreSQL status row"
    assert checks[like].startswith("1.50×")
