from __future__ import annotations

from collections.abc import Callable

import httpx


async def test_post_scrap_registers_both_jobs(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    response = await api.post("/scraps", json={"content": "  hello\r\nworld  "}, headers=headers)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["analysisJobId"] and body["refineJobId"]
    job = await api.get(f"/async-jobs/{body['analysisJobId']}", headers=headers)
    assert job.status_code == 200
    assert job.json()["status"] == "PENDING"
    assert job.json()["jobType"] == "CARD_ANALYSIS"
