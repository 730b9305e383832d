import json, jwt, time
import httpx
from tests.conftest import JWT_SECRET

async def test_probe(api, new_user):
    h = new_user()
    async def gen():
        for _ in range(20):
            yield b"x" * 100_000
    cases = [
        ("POST", "/scraps", dict(content=gen(), headers={**h, "content-type": "application/json"})),
        ("POST", "/scraps", dict(content=b'{"content": "\\ud800"}', headers={**h, "content-type": "application/json"})),
        ("POST", "/scraps", dict(content=b'{"content": "a\\u0000b"}', headers={**h, "content-type": "application/json"})),
        ("POST", "/scraps", dict(content=b'{"content": "hi"}', headers={**h, "content-type": "text/plain"})),
        ("POST", "/scraps", dict(content=b'{"content": "hi"}', headers={**h})),
        ("POST", "/scraps", dict(content=b'[' * 100000, headers={**h, "content-type": "application/json"})),
        ("POST", "/scraps", dict(content=b'{"content":' + b'[' * 900 + b']' * 900 + b'}', headers={**h, "content-type": "application/json"})),
        ("POST", "/scraps", dict(headers=h)),
        ("DELETE", "/scraps", dict(headers=h)),
        ("GET", "/nope", dict(headers=h)),
        ("GET", "/async-jobs/abc", dict(headers=h)),
        ("GET", "/async-jobs/abc", dict()),
        ("POST", "/scraps", dict(content=b'{bad', headers={"content-type": "application/json"})),
        ("POST", "/scraps", dict(json={"content": "x"}, headers={"Authorization": "Bearer " + jwt.encode({"sub": "a\x00b"}, JWT_SECRET, "HS256")})),
        ("POST", "/scraps", dict(json={"content": "x"}, headers={"Authorization": "Bearer " + jwt.encode({"sub": "a\ud800b"}, JWT_SECRET, "HS256")})),
        ("POST", "/scraps", dict(json={"content": "x"}, headers={"Authorization": "Bearer " + jwt.encode({"sub": 5}, JWT_SECRET, "HS256")})),
        ("POST", "/scraps", dict(json={"content": "x"}, headers={"Authorization": "Basic abc"})),
        ("GET", "/cards/00000000-0000-0000-0000-000000000000/similar-cards?limit=0", dict(headers=h)),
        ("GET", "/cards/00000000-0000-0000-0000-000000000000/similar-cards?limit=99999999999999999999999", dict(headers=h)),
        ("OPTIONS", "/scraps", dict(headers=h)),
        ("HEAD", "/healthz", dict()),
    ]
    for m, u, kw in cases:
        try:
            r = await api.request(m, u, **kw)
            print(m, u, r.status_code, dict(r.headers), r.text[:300])
        except Exception as e:
            print(m, u, "EXC", repr(e)[:300])
    assert False
