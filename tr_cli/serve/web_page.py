"""`GET /`: the chat page in the browser. Its HTML, CSS and JavaScript ship in the package
(serve/web/) and are served from memory; the page talks to the server's own /v1 like any client
(with `"tr": {"steps": true}` for the draft view) and loads nothing from elsewhere, which its
Content-Security-Policy also enforces.

The page itself needs no API key (it holds no data); /v1 still does, and the page asks for the
key when /v1 answers 401.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Everything from this server, nothing inline, no framing by other sites.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a newer tr's page shows after an upgrade
}
PAGE = "index.html"


def web_assets() -> dict[str, tuple[bytes, str]]:
    """The page's files by name, with their media types."""
    folder = files("tr_cli.serve") / "web"
    assets = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in MEDIA_TYPES:
            assets[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return assets


def add_web_page(app: FastAPI) -> None:
    """`GET /` (the page) and `GET /web/NAME` (its scripts, styles and icon)."""
    assets = web_assets()

    def serve(name: str) -> Response:
        if name not in assets:
            raise StarletteHTTPException(404, "Not Found")
        body, media_type = assets[name]
        return Response(body, media_type=media_type, headers=HEADERS)

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return serve(PAGE)

    @app.get("/web/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return serve(name)
