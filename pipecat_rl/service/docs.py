"""The API's documentation pages, served from this machine: no CDN, so they load offline.

`/docs` is Swagger UI when an installed package ships its bundle: vLLM does (its own offline
docs), and the `cpu` and `gpu` extras install it. Otherwise `/docs` is the reference page
rendered here from the OpenAPI document itself (every operation, its parameters, body fields
and answers, and every schema), which `/redoc` always is: no installed package ships ReDoc's
bundle. The pages, the assets and `/openapi.json` need no token (they hold no data); Swagger's
"Authorize" takes the token for the calls it makes.
"""

import functools
import html
import importlib.util
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response

SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")
ASSETS = "/docs/assets"


@functools.cache
def swagger_assets() -> Path | None:
    """The folder holding Swagger UI's bundle in an installed package, or None.

    Found by name inside vLLM's package, without importing vLLM.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for bundle in Path(root).rglob(SWAGGER_FILES[0]):
            if all((bundle.parent / name).is_file() for name in SWAGGER_FILES):
                return bundle.parent
    return None


def add_docs(app: FastAPI) -> None:
    """Serve `/docs`, its assets and `/redoc` from local files (create the app with neither)."""

    def reference() -> HTMLResponse:
        return HTMLResponse(render_reference(app.openapi(), app.openapi_url or ""))

    async def docs(request: Request) -> Response:
        if swagger_assets() is None:
            return reference()
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "", title=f"{app.title}: Swagger UI",
            swagger_js_url=f"{ASSETS}/{SWAGGER_FILES[0]}",
            swagger_css_url=f"{ASSETS}/{SWAGGER_FILES[1]}", swagger_favicon_url="data:,",
        )  # fmt: skip

    async def asset(request: Request) -> Response:
        name, folder = request.path_params["name"], swagger_assets()
        if folder is None or name not in SWAGGER_FILES:
            return Response(status_code=404)
        return FileResponse(folder / name)

    async def redoc(request: Request) -> Response:
        return reference()

    app.add_route("/docs", docs, include_in_schema=False)
    app.add_route(ASSETS + "/{name}", asset, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)


# -- the reference page ------------------------------------------------------------------------

_STYLE = """body{font:15px/1.45 system-ui,sans-serif;max-width:64rem;margin:2rem auto;
padding:0 1rem}h2{border-top:1px solid #ccc;padding-top:1rem}
code,.path{font-family:ui-monospace,monospace}
.method{display:inline-block;min-width:4.5rem;font-weight:700}table{border-collapse:collapse;
margin:.4rem 0 1rem}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;
vertical-align:top}th{background:#f4f4f4}"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _type(schema: dict[str, Any]) -> str:
    """A schema's type as a reader says it, with links to named schemas."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f'<a href="#schema-{_e(name)}">{_e(name)}</a>'
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type(s) for s in schema[key])
    if "const" in schema:
        return f"<code>{_e(repr(schema['const']))}</code>"
    if "enum" in schema:
        return " | ".join(f"<code>{_e(repr(v))}</code>" for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list[{_type(schema.get('items', {}))}]"
    return _e(schema.get("type", "any"))


def _rows(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    if not rows:
        return ""
    cells = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    parts = [
        f'<h3><span class="method">{method.upper()}</span> <span class="path">{_e(path)}</span>'
        f"</h3><p>{_e(op.get('description') or op.get('summary', ''))}</p>"
    ]
    params = [
        (f"<code>{_e(p['name'])}</code>", _e(p["in"]), _type(p.get("schema", {})),
         "yes" if p.get("required") else "", _e(p.get("description", "")))
        for p in op.get("parameters", [])
    ]  # fmt: skip
    parts.append(_rows(("parameter", "in", "type", "required", ""), params))
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body:
        parts.append(f"<p>Body (JSON): {_type(body['schema'])}</p>")
    answers = [
        (_e(code), _e(r.get("description", "")),
         " | ".join(_type(c["schema"]) for c in r.get("content", {}).values() if "schema" in c))
        for code, r in op.get("responses", {}).items()
    ]  # fmt: skip
    parts.append(_rows(("status", "meaning", "body"), answers))
    return "".join(parts)


def _schema(name: str, schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = [
        (f"<code>{_e(field)}</code>", _type(s), "yes" if field in required else "",
         f"<code>{_e(repr(s['default']))}</code>" if "default" in s else "",
         _e(s.get("description", "")))
        for field, s in schema.get("properties", {}).items()
    ]  # fmt: skip
    table = _rows(("field", "type", "required", "default", ""), rows)
    if not rows:
        table = f"<p>{_type(schema)}</p>"
    return (
        f'<h3 id="schema-{_e(name)}">{_e(name)}</h3>'
        f"<p>{_e(schema.get('description', ''))}</p>{table}"
    )


def render_reference(spec: dict[str, Any], openapi_url: str) -> str:
    """The whole OpenAPI document as one self-contained HTML page (no script, no asset)."""
    info = spec.get("info", {})
    operations = [
        _operation(path, method, op)
        for path, methods in spec.get("paths", {}).items()
        for method, op in methods.items()
    ]
    schemas = [_schema(n, s) for n, s in spec.get("components", {}).get("schemas", {}).items()]
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(info.get('title'))}"
        f"</title><style>{_STYLE}</style></head><body><h1>{_e(info.get('title'))} "
        f"{_e(info.get('version', ''))}</h1><p>{_e(info.get('description', ''))}</p>"
        f"<p><a href='{_e(openapi_url)}'>OpenAPI document</a></p><h2>Operations</h2>"
        f"{''.join(operations)}<h2>Schemas</h2>{''.join(schemas)}</body></html>"
    )
