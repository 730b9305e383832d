"""`/docs` (Swagger UI), served entirely by the API: the assets come from the
`fastapi-offline` package (which ships Swagger UI), so the page works without any network,
under a CSP that allows our own scripts only (no inline script, no CDN).

No `/redoc`: ReDoc's bundle always loads its footer logo from the vendor's CDN.
`API_DOCS_ENABLED` turns `/docs` and `/openapi.json` on or off; production
(`SAN_ENV=production`) defaults to off.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

STATIC = "/docs/static"

# Swagger UI's start-up, as a file of ours rather than an inline script, so the page's CSP
# can be `script-src 'self'`.
_SWAGGER_INIT = """window.addEventListener("load", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.specUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    layout: "BaseLayout",
  });
});
"""


def _page(title: str, head: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title}</title><link rel="icon" href="{STATIC}/favicon.png">{head}'
        f"</head><body>{body}</body></html>"
    )


def _assets() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Add the documentation pages (call only when they are enabled)."""
    swagger = _page(
        f"{app.title} — Swagger UI",
        f'<link rel="stylesheet" href="{STATIC}/swagger-ui.css">',
        f'<div id="swagger-ui" data-spec-url="{app.openapi_url}"></div>'
        f'<script src="{STATIC}/swagger-ui-bundle.js"></script>'
        '<script src="/docs/swagger-init.js"></script>',
    )

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(swagger)

    @app.get("/docs/swagger-init.js", include_in_schema=False)
    async def swagger_init() -> Response:
        return Response(_SWAGGER_INIT, media_type="text/javascript")

    app.mount(STATIC, StaticFiles(directory=_assets()), name="docs-static")
