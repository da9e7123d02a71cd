"""A small Chrome DevTools Protocol client: Debian's headless Chromium driven over its own
websocket (the `websockets` package, already installed), offline, nothing downloaded.

Every wait is for a protocol message (a reply or an event), bounded by a generous hang guard.
"""

import contextlib
import itertools
import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from tests.chromium import CHROMIUM

HANG_GUARD_S = 120.0


class Browser:
    """Headless Chromium with one DevTools connection; `tab()` opens a page session."""

    def __init__(self, profile: Path):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1200,900",
             "about:blank"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in self.proc.stderr:  # the browser says where it listens: an event, not a timer
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                break
        else:
            raise RuntimeError(f"chromium exited ({self.proc.wait()}) without a DevTools socket")
        # keep reading its log, so a full pipe never blocks the browser
        self._drain = threading.Thread(target=self.proc.stderr.read, daemon=True)
        self._drain.start()
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            connect(found.group(1), max_size=None, open_timeout=HANG_GUARD_S)
        )
        self._ids = itertools.count(1)
        self.pending: list[dict] = []

    def send(self, method: str, session: str | None = None, **params: Any) -> dict:
        """Call `method` and return its result (events that arrive meanwhile are kept)."""
        call_id = next(self._ids)
        message = {"id": call_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=HANG_GUARD_S))
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.pending.append(reply)

    def wait(self, method: str, session: str | None = None) -> dict:
        """The next event `method` (of `session`), kept or yet to come."""
        while True:
            for i, event in enumerate(self.pending):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.pending.pop(i)["params"]
            self.pending.append(json.loads(self.ws.recv(timeout=HANG_GUARD_S)))

    def tab(self, headers: dict[str, str] | None = None) -> "Tab":
        """A new page; `headers` go with every request it makes (the token, as a browser)."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable", session)
        if headers:
            self.send("Network.setExtraHTTPHeaders", session, headers=headers)
        return Tab(self, session)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket and end the browser (this process's own child)."""
        self._stack.close()
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)
        self._drain.join(timeout=HANG_GUARD_S)
        self.proc.stderr.close()


class Tab:
    """One page of the browser."""

    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def goto(self, url: str) -> int:
        """Load `url`; returns the document's HTTP status once the page has loaded."""
        self.browser.send("Page.navigate", self.session, url=url)
        status = self._document_status()
        self.browser.wait("Page.loadEventFired", self.session)
        return status

    def _document_status(self) -> int:
        while True:
            event = self.browser.wait("Network.responseReceived", self.session)
            if event["type"] == "Document":
                return event["response"]["status"]

    def press(self, key: str) -> int:
        """Press `key` on the page (a keydown, as a person's); returns the next page's status."""
        self.browser.send("Input.dispatchKeyEvent", self.session, type="keyDown", key=key,
                          text=key)  # fmt: skip
        status = self._document_status()
        self.browser.wait("Page.loadEventFired", self.session)
        return status

    def text(self) -> str:
        """The page's visible text."""
        result = self.browser.send("Runtime.evaluate", self.session,
                                   expression="document.body.innerText")  # fmt: skip
        return result["result"]["value"]

    def screenshot(self, path: Path) -> None:
        """A PNG of the page as shown."""
        import base64

        data = self.browser.send("Page.captureScreenshot", self.session, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
