"""What keeps the service's door shut: the bearer token, the bind rule, paths and body size."""

import hmac
from pathlib import Path

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pipecat_rl.errors import ConfigError
from pipecat_rl.service.settings import TOKEN_ENV, ServiceSettings
from pipecat_rl.serving.server import is_loopback  # one rule for every server we start

_bearer = HTTPBearer(auto_error=False)


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
    """Let the request through only with the right bearer token (when the service has one)."""
    expected = settings_of(request).token
    if expected is None:
        return
    given = "" if credentials is None else credentials.credentials
    # Constant time: how long the comparison takes must not tell how much of a guess was right.
    if credentials is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


def confine(data_dir: Path, value: str) -> Path:
    """`value` as a path inside `data_dir` (relative paths are taken from it).

    Symlinks are resolved before the check, so a link inside the folder that points out of it
    is refused too.

    Raises:
        HTTPException: 403 when the path resolves outside the data directory.
    """
    root = data_dir.resolve()
    candidate = Path(value)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"path {value!r} is outside the service's data directory",
        )
    return resolved


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
