"""`make demo`: the README's "Try it", walked by itself against a running `make run`.

Mints a token for "demo-user" (with the secret `make run` generated into DATA_DIR, or
AUTH_JWT_SECRET), saves a scrap, waits for its CARD_ANALYSIS job, then reads the card and
its similar cards, printing each request and answer. The API is the one API_HOST and
API_PORT name (default 127.0.0.1:8000). Exits 0 when every step answered as documented,
else 1 with one line saying which step did not.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx

from san_api.auth.tokens import mint
from san_api.settings import ApiSettings
from san_common.settings import load_settings

JOB_TIMEOUT_SECONDS = 60.0


class StepFailed(Exception):
    pass


def base_url() -> str:
    host = os.environ.get("API_HOST", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: reach it on loopback
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('API_PORT', '8000')}"


def show(response: httpx.Response) -> dict[str, object]:
    request = response.request
    print(f"\n$ {request.method} {request.url.path}")
    try:
        body = response.json()
    except ValueError:
        body = {"text": response.text[:500]}
    print(f"→ {response.status_code} {json.dumps(body, indent=2, ensure_ascii=False)}")
    return body if isinstance(body, dict) else {"items": body}


def expect(response: httpx.Response, status: int, step: str) -> dict[str, object]:
    body = show(response)
    if response.status_code != status:
        raise StepFailed(f"{step}: expected {status}, got {response.status_code}")
    return body


def walk(client: httpx.Client) -> None:
    expect(client.get("/healthz"), 200, "GET /healthz")
    scrap = expect(
        client.post(
            "/scraps", json={"content": "The GIL lets one thread run Python bytecode at a time."}
        ),
        202,
        "POST /scraps",
    )
    job_id, scrap_id = scrap["analysisJobId"], scrap["scrapId"]
    # The demo ran before: the scrap exists, and either its card (no job id) or the
    # analysis still on its way (its id), which is waited for like a new one.
    if job_id is None:
        print("(this scrap was saved before; its card already exists)")
    else:
        deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
        while True:
            job = client.get(f"/async-jobs/{job_id}").json()
            if job["status"] in ("COMPLETED", "FAILED") or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # poll interval, inside the deadline above
        job = expect(client.get(f"/async-jobs/{job_id}"), 200, "GET /async-jobs/{jobId}")
        if job["status"] != "COMPLETED":
            raise StepFailed(f"job {job_id} is {job['status']}: {job.get('errorMessage')}")
    card = expect(client.get(f"/cards/{scrap_id}"), 200, "GET /cards/{scrapId}")
    expect(client.get(f"/cards/{card['cardId']}/similar-cards"), 200, "similar cards")


def main() -> int:
    url = base_url()
    token = mint(load_settings(ApiSettings).auth_jwt_secret, "demo-user", 3600)
    print(f"demo: the API at {url}, as user demo-user")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            walk(client)
    except httpx.ConnectError:
        print(
            f"demo: no API at {url}; start it with `make run` in another terminal", file=sys.stderr
        )
        return 1
    except (StepFailed, httpx.HTTPError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    print("\ndemo: every step answered as the README says")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
