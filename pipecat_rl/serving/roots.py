"""The one rule for an OpenAI-compatible endpoint's URL: every server, persona and judge URL.

A server is named by its OpenAI-compatible root, the URL that `/models` and `/chat/completions`
hang from. Users write it in several ways; `openai_base_url` takes each of them one way, so the
bot's server (`--llm-url`), the persona and the judge can never disagree about where a route is:

- no path (`http://host:8000`, `http://host:8000/`): `/v1` is appended (vLLM, Ollama, llama.cpp
  and this project's own server all answer there), said once at info level;
- a path ending in one of the API's routes (`/v1/chat/completions`, `/openai/v1/models`): refused
  with a `ConfigError` naming the option, the value and the root to give instead (the path less
  the route), never guessed at: requests would go to `.../chat/completions/chat/completions`;
- any other path (`/v1`, `/openai/v1`, `/api/v1`, Gemini's `/v1beta/openai`): kept as given, less
  a trailing slash. Providers put their roots where they like; the preflight's one `GET
  <root>/models` says at start whether it is one (a 404 there: "not an OpenAI-compatible root").
- no scheme, or a query or fragment: refused.

`server_root` is the same URL less `/v1`: where vLLM's `/health` and admin routes live.
"""

from urllib.parse import urlsplit

from loguru import logger

from pipecat_rl.errors import ConfigError

ROOT_SUFFIX = "/v1"
"""How every OpenAI-compatible root this project accepts ends (`/v1`, `/openai/v1`, ...)."""

ROUTES = ("/chat/completions", "/completions", "/responses", "/models", "/embeddings")
"""The API's routes under a root: a URL ending in one names a route, not the root."""

_SAID: set[str] = set()
"""URLs whose appended `/v1` was already said: once a process, not once per use."""


def openai_base_url(url: str, option: str = "--llm-url") -> str:
    """The OpenAI-compatible root that `url` names (`/v1` appended to a bare host).

    `option` is where `url` came from, for messages: a flag, or a file's key.

    Raises:
        ConfigError: `url` is not http(s), carries a query, or ends in one of the API's routes;
            the message names `option`, the value and the root to give.
    """
    given = url.strip()
    parts = urlsplit(given)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(_refused(option, url, "is not an http(s) URL", "http://host:8000/v1"))
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if parts.query or parts.fragment:
        raise ConfigError(_refused(option, url, "carries a query", f"{base}{path or '/v1'}"))
    if not path:
        root = f"{base}{ROOT_SUFFIX}"
        if given not in _SAID:
            _SAID.add(given)
            logger.info(f"{option} {given} names no path: using its OpenAI-compatible root {root}")
        return root
    route = next((r for r in ROUTES if path == r or path.endswith(r)), None)
    if route is None:
        return f"{base}{path}"
    example = f"{base}{path.removesuffix(route) or ROOT_SUFFIX}"
    raise ConfigError(_refused(option, url, f"ends in the route {route!r}", example))


def server_root(url: str, option: str = "--llm-url") -> str:
    """The server's own root (`openai_base_url` less a final `/v1`): vLLM's `/health`, admin."""
    return openai_base_url(url, option).removesuffix(ROOT_SUFFIX)


def _refused(option: str, url: str, why: str, example: str) -> str:
    return (
        f"{option} {url!r} {why}, so it is no OpenAI-compatible root; give the server's root "
        f"(the part before /chat/completions), e.g. {example}"
    )
