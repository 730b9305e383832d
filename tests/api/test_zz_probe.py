import uuid
async def test_probe(api, new_user):
    h = new_user()
    await api.get(f"/async-jobs/{uuid.uuid4()}", headers=h)
    r = await api.get("/metrics")
    print([l for l in r.text.splitlines() if l.startswith("san_http_requests_total")])
    r = await api.get("/readyz"); print(r.status_code, r.text)
    r = await api.get("/docs"); print(r.status_code, r.headers["content-type"])
    assert False
