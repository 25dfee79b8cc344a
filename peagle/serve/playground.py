"""The playground: a chat page at ``/`` that shows what speculation did to each response (every token
coloured by how it came, acceptance live, the same prompt without speculation beside it), and
``GET /v1/server_info``, the page's view of the server.

The page is three static files (``static/``: plain HTML, JS and CSS, no build step, nothing fetched from
elsewhere, so it works offline). They hold no data, so they are answered without the API key: the
page asks for the key and sends it on its own API calls, which the server checks as any client's."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse

from peagle.serve.engine_core import EngineInfo

STATIC = Path(__file__).with_name("static")
# the page's paths and their files: a fixed list, so no request names a file of its own choosing
PAGES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
         "/playground.css": ("playground.css", "text/css; charset=utf-8")}


def server_info(info: EngineInfo, model_name: str) -> dict:
    """What the page shows of the server: the model, how it speculates, and where it runs."""
    return {"model": model_name, "method": info.method, "num_speculative_tokens": info.k,
            "max_speculative_tokens": info.k_max, "speculative_token_tree": info.token_tree,
            "device": info.device, "precision": info.dtype, "kernels": info.kernels,
            "cuda_graphs": info.cuda_graphs, "max_model_len": info.max_model_len}


def mount_playground(app: FastAPI, info: EngineInfo, model_name: str) -> None:
    """Add the page and ``/v1/server_info`` to ``app``. Call it after the API key's middleware is added:
    the page's files are answered by a middleware added later, so outside that check."""

    @app.get("/v1/server_info", responses={401: {"description": "an OpenAI error object"}})
    async def get_server_info():
        return server_info(info, model_name)

    app.add_middleware(_Page)


class _Page:
    """GET (or HEAD) of one of :data:`PAGES`: its file, before anything inside; any other request passes on
    (plain ASGI, as the API key's check)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        page = PAGES.get(scope["path"]) if scope["type"] == "http" and scope["method"] in ("GET", "HEAD") else None
        if page is None:
            return await self.app(scope, receive, send)
        name, media_type = page
        await FileResponse(STATIC / name, media_type=media_type, headers={"Cache-Control": "no-cache"})(
            scope, receive, send)
