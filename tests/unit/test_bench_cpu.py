"""The CPU-per-job figures of `make bench` (benchmarks/peers/common.py), read from /proc:
a process tree's CPU counts its children, alive or reaped, and the per-job arithmetic."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from benchmarks.peers.common import (
    CPU_PREFIX,
    cpu_per_job,
    cpu_snapshot,
    processes_named,
    tree_cpu_seconds,
)
from benchmarks.run import cpu_medians

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")

BURN = "sum(i * i for i in range(6_000_000))"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_a_reaped_child_counts_in_its_parents_tree() -> None:
    before, truth_before = tree_cpu_seconds(os.getpid()), _children_cpu()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    after, truth_after = tree_cpu_seconds(os.getpid()), _children_cpu()
    assert before is not None and after is not None
    burnt = truth_after - truth_before
    assert burnt > 0.05  # the child did work worth measuring
    # the child's CPU, as the kernel accounts it, plus this process's own bit of waiting
    assert burnt - 0.02 <= after - before <= burnt + 0.5


def test_a_running_child_counts_in_its_parents_tree() -> None:
    # the child burns, says so, then waits (alive, not reaped) until stdin closes
    code = f"import sys; {BURN}; print('burnt', flush=True); sys.stdin.read()"
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "burnt"
            own, parent = tree_cpu_seconds(child.pid), tree_cpu_seconds(os.getpid())
            alone = _self_cpu() + _children_cpu()  # this process and its reaped children
            assert own is not None and own > 0.05
            assert parent is not None and parent - alone >= own - 0.05
        finally:
            child.stdin.close()


def test_gone_processes_are_left_out() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert tree_cpu_seconds(gone.pid) is None
    snapshot = cpu_snapshot({"me": [os.getpid()], "gone": [gone.pid]})
    assert set(snapshot) == {"me"}


def test_processes_are_found_by_command_name() -> None:
    with open("/proc/self/comm") as comm:
        assert os.getpid() in processes_named(comm.read().strip())
    assert processes_named("no-such-command-here") == []


def test_cpu_per_job_is_each_part_and_all_in_milliseconds() -> None:
    before = {"driver": 1.0, "worker": 10.0, "PostgreSQL": 100.0}
    after = {"driver": 1.5, "worker": 12.0, "PostgreSQL": 101.0}
    assert cpu_per_job(before, after, 1000) == {
        f"{CPU_PREFIX}driver": 0.5,
        f"{CPU_PREFIX}worker": 2.0,
        f"{CPU_PREFIX}PostgreSQL": 1.0,
        f"{CPU_PREFIX}all": 3.5,
    }


def test_a_part_missing_at_either_end_is_not_counted() -> None:
    got = cpu_per_job({"worker": 1.0, "relay": 5.0}, {"worker": 2.0}, 100)
    assert got == {f"{CPU_PREFIX}worker": 10.0, f"{CPU_PREFIX}all": 10.0}
    assert cpu_per_job({"worker": 1.0}, {"worker": 2.0}, 0) == {}


def test_the_report_takes_each_parts_median_over_runs() -> None:
    runs = [{"extra": {f"{CPU_PREFIX}worker": v, "enqueue_rate": 9.0}} for v in (3.0, 1.0, 2.0)]
    assert cpu_medians(runs) == {"worker": 2.0}
