"""What keeps the service's door shut: the bearer token, the bind rule, bodies and paths.

- Bodies: at most `max_body_bytes` (`BodyLimit`), and JSON read strictly (`StrictJSONRoute`): a
  key named twice, `NaN` / `Infinity` (or a number too big to be finite), a NUL byte or a lone
  surrogate in a string are a 422, where Python's own parser lets each through.
- Paths: every path a request names, and every path in a file it names (a loop file's paths,
  scenario files' `!include`s, world packs and recordings), must resolve inside the data
  directory with symlinks and `..` resolved (`confine`, `confine_loop_file`,
  `confine_scenario_files`), or the request is a 403 naming the field and the file. A value
  that cannot be a path (a NUL byte, over `MAX_PATH_BYTES`, a loop of symlinks) is a 422.
"""

import base64
import hmac
import json
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import yaml
from fastapi import Depends, HTTPException, Request, Response, status
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pipecat_rl.errors import ConfigError, PipecatRLError
from pipecat_rl.service.settings import TOKEN_ENV, ServiceSettings
from pipecat_rl.serving.server import is_loopback  # one rule for every server we start

_bearer = HTTPBearer(auto_error=False)

MAX_PATH_BYTES = 4096
"""Longest path accepted, in bytes (Linux's PATH_MAX)."""
MAX_NAME_BYTES = 255
"""Longest single name in a path, in bytes (Linux's NAME_MAX)."""
OUTSIDE = "resolves outside the service's data directory"


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token.

    Raises:
        ConfigError: `host` is reachable from other machines and no token was given.
    """
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without a token: anyone who can reach it could "
            f"train, gate and promote adapters. Pass --token (or set ${TOKEN_ENV}), or bind to "
            "127.0.0.1"
        )


def settings_of(request: Request) -> ServiceSettings:
    """The settings the app was created with."""
    return request.app.state.settings


def require_token(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
) -> None:
    """Let the request through only with the right token (when the service has one).

    The token comes as `Authorization: Bearer <token>`, or, from a browser (the duels page),
    as HTTP Basic with the token as the password and the rater's id as the user name: a
    browser asks a person for those once and sends them with every request and form.
    """
    expected = settings_of(request).token
    if expected is None:
        return
    given = basic_credentials(request)[1] if credentials is None else credentials.credentials
    # Constant time: how long the comparison takes must not tell how much of a guess was right.
    if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": 'Bearer, Basic realm="pipecat-rl"'},
        )


def basic_credentials(request: Request) -> tuple[str | None, str | None]:
    """(user, password) of the request's HTTP Basic credentials; (None, None) without any."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, None
    return (user, password) if sep else (None, None)


def unprocessable(loc: tuple[Any, ...], message: str, kind: str = "value_error") -> HTTPException:
    """A 422 shaped like FastAPI's validation errors, without echoing the input back.

    (An echoed input is how a bad value used to become a 500: FastAPI cannot encode NaN.)
    """
    detail = [{"type": kind, "loc": ["body", *loc], "msg": message}]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)


# -- bodies ------------------------------------------------------------------------------------


class _Duplicated(dict):
    """An object that named `key` twice (the walk in `strict_json` says where)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str):
        super().__init__(pairs)
        self.key = key


class _NotFinite:
    """A number JSON cannot hold in its place: NaN, Infinity, or one too big to be finite."""

    def __init__(self, text: str):
        self.text = text if len(text) <= 40 else f"{text[:30]}... ({len(text):,} characters)"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            return _Duplicated(pairs, key)
        out[key] = value
    return out


def _finite(text: str) -> float | _NotFinite:
    value = float(text)
    return _NotFinite(text) if value in (float("inf"), float("-inf")) else value


def text_problem(text: str) -> str | None:
    """Why `text` is no text this service stores (a NUL byte, a lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL byte, which no field of this service takes"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
    return None


def _problem(item: Any) -> tuple[str, str, Any] | None:
    """(error type, message, key) for a parsed JSON value this service refuses, or None."""
    if isinstance(item, _Duplicated):
        return "json_invalid", (
            f"duplicate key {item.key!r}: name each key once (JSON does not say which of the two "
            "would count)"
        ), item.key  # fmt: skip
    if isinstance(item, _NotFinite):
        return "json_invalid", f"{item.text} is not a finite number; send one", None
    if isinstance(item, str) and (problem := text_problem(item)):
        return "string_invalid", f"the value {problem}", None
    if isinstance(item, dict):
        bad = next((k for k in item if text_problem(k)), None)
        if bad is not None:
            return "string_invalid", f"a key {text_problem(bad)}", None
    return None


def strict_json(body: bytes) -> Any:
    """`body` as JSON, refusing what Python's parser lets through (see the module docstring).

    Raises:
        HTTPException: 422 naming the key or the place in the body.
    """
    try:
        value = json.loads(
            body, object_pairs_hook=_unique_keys, parse_constant=_NotFinite, parse_float=_finite
        )
    except json.JSONDecodeError as e:
        raise unprocessable((e.pos,), f"JSON decode error: {e.msg}", "json_invalid") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, an int of 4,300+ digits, too deep
        message = f"not a JSON body this service reads: {e}"
        raise unprocessable((), message, "json_invalid") from None
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        found = _problem(item)
        if found is not None:
            kind, message, key = found
            raise unprocessable(loc if key is None else (*loc, key), message, kind)
        if isinstance(item, dict):
            stack.extend(((*loc, key), inner) for key, inner in item.items())
        elif isinstance(item, list):
            stack.extend(((*loc, i), inner) for i, inner in enumerate(item))
    return value


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose JSON body is read by `strict_json` (every router of the service uses it)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, handed a request that parses its body strictly."""
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


class BodyLimit:
    """ASGI middleware: refuse request bodies over `limit` bytes with 413, declared or streamed."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        """Pass the request on, counting its body; answer 413 once it passes the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        # Read the whole body first (it is small by definition), so an oversized one is refused
        # before any route parses it, whether or not it declared its length.
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(send)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send) -> None:
        body = b'{"detail":"request body too large"}'
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict], then=None):
    """A `receive` that hands out `messages`, then defers to `then` (disconnects, for SSE)."""
    pending = list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


# -- paths -------------------------------------------------------------------------------------


def path_problem(value: str) -> str | None:
    """Why `value` cannot be a path here (a NUL byte, a lone surrogate, too long), or None."""
    problem = text_problem(value)
    if problem:
        return problem
    raw = os.fsencode(value)
    if len(raw) > MAX_PATH_BYTES:
        return f"is {len(raw):,} bytes long, over the {MAX_PATH_BYTES:,}-byte limit for a path"
    longest = max(len(name) for name in raw.split(b"/"))
    if longest > MAX_NAME_BYTES:
        return f"holds a {longest:,}-byte name, over the {MAX_NAME_BYTES}-byte limit for one"
    return None


def confine(
    data_dir: Path, value: str | Path, field: str = "path", shown: str | None = None
) -> Path:
    """`value` as a path inside `data_dir` (relative paths are taken from it).

    Symlinks and `..` are resolved before the check, so a link inside the folder that points
    out of it is refused too. `field` names where the value came from in the messages
    (`scenarios.0`, `config: loop.yaml: out`), `shown` the value as its sender wrote it.

    Raises:
        HTTPException: 403 when the path resolves outside the data directory; 422 when the
            value cannot be a path (a NUL byte, too long, a loop of symlinks).
    """
    root = data_dir.resolve()
    problem = path_problem(str(value))
    if problem is None:
        candidate = Path(value)
        try:
            resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
        except RuntimeError:  # Python 3.11's word for a loop of symlinks
            problem = "goes round a loop of symbolic links"
        except (OSError, ValueError) as e:
            problem = f"cannot be resolved ({e})"
    said = _short(value if shown is None else shown)
    if problem is not None:
        raise unprocessable(_loc(field), f"{field}: {said} {problem}", "path_invalid")
    if not resolved.is_relative_to(root):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"{field}: {said} {OUTSIDE}")
    return resolved


def _loc(field: str) -> tuple[Any, ...]:
    """The body location of the request field a message label starts with (`scenarios.0`)."""
    head = field.split(": ")[0]
    return tuple(int(p) if p.isdigit() else p for p in head.split("."))


def _short(value: str | Path) -> str:
    text = repr(str(value))
    return text if len(text) <= 80 else f"{text[:60]}...' ({len(str(value)):,} characters)"


def _shown(root: Path, path: Path) -> str:
    """`path` relative to the data directory, as a message names a file to its sender."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _unreadable(field: str, e: BaseException) -> HTTPException:
    """A 422 for a file a field names that cannot be read as what the field says it is."""
    problem = str(e) if isinstance(e, PipecatRLError) else f"{type(e).__name__}: {e}"
    return unprocessable(_loc(field), f"{field}: {problem}")


def confine_loop_file(data_dir: Path, path: Path, field: str = "config", **overrides: Any) -> None:
    """Check every path a loop file names, and the scenarios in its `pool` and `heldout`.

    The file is read as the cycle job reads it (`load_loop_config` with the job's `overrides`,
    the service's `ledger` among them: a file's own `ledger:` is never opened by the service).
    Bots given as module names (`package.module:run_bot`) are code installed where the service
    runs, not paths.

    Raises:
        HTTPException: 403 naming the field, the file and the key; 422 when it is no loop file.
    """
    from pipecat_rl.loop.config import load_loop_config
    from pipecat_rl.service.jobs import split_bot
    from pipecat_rl.serving.weights import PACKAGED_MODELS

    root = data_dir.resolve()
    where = f"{field}: {_shown(root, path)}"
    try:
        config = load_loop_config(path, **overrides)
    except (PipecatRLError, ValueError, OSError, RuntimeError) as e:
        raise _unreadable(field, e) from e
    named: dict[str, Path | str | None] = {
        "pool": config.pool, "heldout": config.heldout, "out": config.out,
        "drafts": config.drafts_dir, "gate.config": config.gate.config,
    }  # fmt: skip
    for key in ("bot", "expert_bot"):
        value = getattr(config, key)
        if value is not None and (".py" in value or "/" in value):  # as `_rebase` tells a path
            named[key] = split_bot(value)[0]
    if config.model not in PACKAGED_MODELS:  # a model folder or GGUF, from the service's cwd
        named["model"] = Path.cwd() / Path(config.model).expanduser()
    for key, value in named.items():
        if value is not None:
            confine(root, value, f"{where}: {key}")
    confine_scenario_files(root, config.pool, f"{where}: pool")
    confine_scenario_files(root, config.heldout, f"{where}: heldout")


def confine_scenario_files(data_dir: Path, target: Path | str, field: str = "scenarios") -> None:
    """Check a scenario file or folder: its files, their `!include`s, world packs, recordings.

    The includes are found in the YAML itself (every node tagged `!include`, however the tag
    is spelt) and checked before any scenario loads, so no file outside is read; the world
    packs and recordings are the loaded scenarios' own (`Scenario.pack_path`, `audio:`).

    Raises:
        HTTPException: 403 naming the field, the file and what in it points out; 422 when a
            file is no scenario the loader reads.
    """
    from pipecat_rl.scenarios.loading import load_scenarios
    from pipecat_rl.scenarios.turns import recordings

    root = data_dir.resolve()
    target = confine(root, target, field)
    try:
        files = (
            sorted(p for p in target.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
            if target.is_dir()
            else [target]
        )
        _confine_includes(root, files, field)
        loaded = load_scenarios([target])
    except HTTPException:
        raise
    except (PipecatRLError, ValueError, OSError, RuntimeError) as e:
        raise _unreadable(field, e) from e
    for s in loaded:
        shown = f"{field}: {_shown(root, s.source_path)}" if s.source_path else field
        if s.source_path is not None:
            confine(root, s.source_path, shown)
        try:
            pack = s.pack_path  # None for a module name: installed code, not a path
        except (ValueError, OSError, RuntimeError) as e:
            raise _unreadable(shown, e) from e
        if pack is not None:
            confine(root, pack, f"{shown}: world.pack", s.world.pack)
        for turn, audio in recordings(s.parsed_turns or []).items():
            confine(root, audio, f"{shown}: turn {turn}: audio")


def _confine_includes(root: Path, files: list[Path], field: str) -> None:
    """403 for a file, or a file it `!include`s at any depth, that resolves outside `root`."""
    from pipecat_rl.scenarios.yaml_safe import read_text

    pending = [(f, field, _shown(root, f)) for f in files]
    seen: set[Path] = set()
    while pending:
        file, where, written = pending.pop()
        path = confine(root, file, where, written)
        if path in seen or not path.is_file():
            continue  # a loop of includes, or a missing file: the loader says which
        seen.add(path)
        try:
            text = read_text(path)
        except PipecatRLError:
            continue  # too big, or not UTF-8: the loader says so
        for value in _include_targets(text):
            pending.append((path.parent / value, f"{field}: {_shown(root, path)}: !include", value))


def _include_targets(text: str) -> list[str]:
    """The targets of every node tagged `!include` in a YAML document (aliases walked once)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return []  # the loader reports the file
    found, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag == "!include" and isinstance(node, yaml.ScalarNode):
            found.append(str(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return found
