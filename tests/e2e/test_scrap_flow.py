"""End to end: API, relay and ai-worker as separate OS processes over real PostgreSQL and
RabbitMQ, with the offline `local` AI provider."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Stack
from tests.procs import wait_healthy, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

PYTHON_GIL = (
    "The global interpreter lock in CPython lets one thread run Python bytecode at a time. "
    "Threads help with waiting on input and output, not with CPU-bound Python code."
)
PYTHON_GIL_2 = (
    "CPython's global interpreter lock allows one thread at a time to run Python bytecode, "
    "so threads help with input and output waiting but not CPU-bound Python code."
)
SOURDOUGH = (
    "Sourdough bread rises with wild yeast and lactic acid bacteria from a starter of flour "
    "and water, fed daily and kept at room temperature."
)


def test_scraps_become_cards_and_similar_cards_follow_the_rule(stack: Stack) -> None:
    stack.start("relay")
    stack.start("ai-worker")
    headers = stack.headers("e2e-alice")
    with stack.client() as client:
        accepted = []
        for content in (PYTHON_GIL, PYTHON_GIL_2, SOURDOUGH):
            response = client.post("/scraps", json={"content": content}, headers=headers)
            assert response.status_code == 202, response.text
            body = response.json()
            assert body["scrapId"] and body["analysisJobId"] and body["refineJobId"]
            accepted.append(body)
        for body in accepted:
            for key in ("analysisJobId", "refineJobId"):
                job = stack.wait_job(client, headers, body[key])
                assert job["status"] == "COMPLETED", (job, stack.logs())
        cards = []
        for body in accepted:
            response = client.get(f"/cards/{body['scrapId']}", headers=headers)
            assert response.status_code == 200, response.text
            cards.append(response.json())
        gil, gil_2, bread = (c["cardId"] for c in cards)

        similar = client.get(f"/cards/{gil}/similar-cards", headers=headers).json()
        ids = [c["cardId"] for c in similar["cards"]]
        assert similar["fallback"] is False
        assert ids == [gil_2], similar  # the near duplicate within 0.5; bread is far away
        assert gil not in ids

        # bread has nothing within the threshold: the K nearest come back as a fallback
        fallback = client.get(f"/cards/{bread}/similar-cards", headers=headers).json()
        assert fallback["fallback"] is True
        assert {c["cardId"] for c in fallback["cards"]} == {gil, gil_2}
        assert all(c["distance"] > 0.5 for c in fallback["cards"])

        # another user never sees these cards
        other = stack.headers("e2e-bob")
        assert client.get(f"/cards/{gil}/similar-cards", headers=other).status_code == 404


def test_relay_killed_after_confirm_before_mark_still_completes_each_job_once(stack: Stack) -> None:
    # The relay's crash window: every message goes through the relay, none is published by
    # the API itself (its own windows: tests/faults/test_publish_after_commit.py).
    api = stack.processes.pop(0)
    api.terminate()
    stack.env = {**stack.env, "API_DIRECT_PUBLISH": "false"}
    wait_healthy(stack.base_url, stack.start("api"))
    headers = stack.headers("e2e-carol")
    with stack.client() as client:
        bodies = [
            client.post(
                "/scraps", json={"content": f"{PYTHON_GIL} note {i}"}, headers=headers
            ).json()
            for i in range(5)
        ]
        crashing = stack.start("relay-crashing", module="tests.e2e.crashing_relay")
        wait_until(lambda: crashing.popen.poll() is not None, 30, "the crashing relay to die")
        assert crashing.popen.returncode == -9, crashing.log()

        # The broker holds the confirmed messages; the outbox still says "unpublished",
        # so the next relay publishes them again: every message is delivered twice.
        stack.start("relay")
        worker = stack.start("ai-worker")
        job_ids = [b[k] for b in bodies for k in ("analysisJobId", "refineJobId")]
        for job_id in job_ids:
            assert stack.wait_job(client, headers, job_id)["status"] == "COMPLETED", stack.logs()
        for body in bodies:
            assert client.get(f"/cards/{body['scrapId']}", headers=headers).status_code == 200

        def all_duplicates_seen() -> bool:
            lines = _json_lines(worker.log())
            skipped = [line for line in lines if line.get("msg", "").endswith("skipped")]
            return len(skipped) >= len(job_ids)

        wait_until(all_duplicates_seen, 30, "the duplicate deliveries to be skipped")
        completed = [
            line["job_id"]
            for line in _json_lines(worker.log())
            if line.get("msg") == "job completed"
        ]
        assert sorted(completed) == sorted(job_ids), "a job was processed twice or not at all"


def test_sigterm_stops_every_service_cleanly(stack: Stack) -> None:
    relay = stack.start("relay")
    worker = stack.start("ai-worker")
    wait_until(
        lambda: '"worker consuming"' in worker.log() or "worker consuming" in worker.log(),
        30,
        "worker up",
    )
    wait_until(lambda: "relay running" in relay.log(), 30, "relay up")
    for process in (relay, worker):
        assert process.terminate(timeout=30) == 0, process.log()
    assert "worker stopped" in worker.log()
    assert "relay stopped" in relay.log()


def _json_lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines
