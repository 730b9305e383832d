"""The arithmetic of `make soak`'s report (benchmarks/soak.py): the least-squares slope and
the flat/grows verdict."""

from __future__ import annotations

import pytest

from benchmarks.soak import slope_per_minute, trend


def test_slope_is_per_minute() -> None:
    # 1 MB every 30 s: 2 MB/min, whatever the intercept
    points = [(t, 100 + t / 30) for t in (0.0, 30.0, 60.0, 90.0)]
    assert slope_per_minute(points) == pytest.approx(2.0)


def test_slope_fits_noise_by_least_squares() -> None:
    assert slope_per_minute([(0, 10), (60, 12), (120, 11)]) == pytest.approx(0.5)


@pytest.mark.parametrize("points", [[], [(5.0, 1.0)], [(5.0, 1.0), (5.0, 2.0)]])
def test_no_slope_without_two_times(points: list[tuple[float, float]]) -> None:
    assert slope_per_minute(points) is None


def test_trend_reads_the_second_half() -> None:
    # grows 5 MB/min in the first half (warming caches), then flat
    points = [(float(t), 100 + min(t, 300) / 12) for t in range(0, 601, 5)]
    report = trend(points, minutes=10)
    assert report["start_mb"] == 100
    assert report["peak_mb"] == report["end_mb"] == 125
    assert report["slope_second_half_mb_per_min"] == pytest.approx(0.0)
    assert report["slope_all_mb_per_min"] > 2
    assert report["verdict"] == "flat"


def test_trend_calls_a_steady_climb_growth() -> None:
    points = [(float(t), 100 + t / 60) for t in range(0, 601, 5)]  # 1 MB/min for 10 min
    assert trend(points, minutes=10)["verdict"] == "grows"
    falling = [(t, 200 - v) for t, v in points]
    assert trend(falling, minutes=10)["verdict"] == "shrinks"
