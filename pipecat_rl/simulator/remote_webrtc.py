"""`simulate --bot-url http://...`: the caller's side of a SmallWebRTC call to a running bot.

Pipecat's development runner (`python bot.py -t webrtc`) serves SmallWebRTC's signalling at
`POST /api/offer`: an SDP offer (`{"sdp", "type"}`) in, the bot's answer (`{"sdp", "type",
"pc_id"}`) out, and the bot started on that connection. The caller is the aiortc peer of the
loopback simulation (`audio.webrtc.WebRTCAudioPair`: its microphone track, its decoder-side ear,
its `client-ready` on a data channel, its hang-up), with that offer sent over HTTP instead of
handed to an in-process `SmallWebRTCConnection`. aiortc gathers its candidates before it
offers, so they travel inside the SDP and no `PATCH /api/offer` (trickled ICE) is needed.

That peer offers host candidates on 127.0.0.1 only (`compat.loopback_ice`), so the bot must
run on this machine; a bot elsewhere answers the offer but the call never connects, which the
call's failure says.
"""

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from pipecat_rl.errors import ServingError, SimulationError
from pipecat_rl.simulator.audio.webrtc import CONNECT_TIMEOUT_S as ICE_TIMEOUT_S
from pipecat_rl.simulator.audio.webrtc import WebRTCAudioPair, require_webrtc
from pipecat_rl.simulator.remote import CONNECT_TIMEOUT_S, RemoteCall, described, not_answering

OFFER_PATH = "/api/offer"
"""Where Pipecat's runner takes SmallWebRTC offers; a URL with no path means it."""


def offer_url(url: str) -> str:
    """`url` with the runner's offer path when it names only the host (`http://HOST:PORT`)."""
    parts = urlsplit(url)
    if parts.path.strip("/"):
        return url
    return urlunsplit((parts.scheme, parts.netloc, OFFER_PATH, parts.query, parts.fragment))


async def probe(url: str) -> None:
    """Ask the offer endpoint without offering, so no bot session starts for the check.

    Raises:
        ConfigError: aiortc or PyAV is missing (the `webrtc` extra).
        ServingError: nothing answers at the URL, or nothing there takes offers (HTTP 404).
    """
    require_webrtc(f"--bot-url {url}")
    target = offer_url(url)
    try:
        async with httpx.AsyncClient(timeout=CONNECT_TIMEOUT_S) as client:
            response = await client.get(target)  # the runner answers 405: it takes POST
    except httpx.HTTPError as e:
        raise not_answering(url, e) from e
    if response.status_code == 404:
        raise ServingError(
            f"--bot-url {url}: nothing takes WebRTC offers at {target} (HTTP 404); start the "
            "bot with `python bot.py -t webrtc`, or give its offer URL"
        )


class HttpOffer:
    """The bot's answerer, over HTTP: what `WebRTCAudioPair` asks of its `connection`.

    It has no `pc`: the bot's side of the call is the bot's to close.
    """

    def __init__(self, url: str):
        self.url = url
        self._answer: dict[str, str] | None = None

    async def initialize(self, sdp: str, type: str) -> None:
        """POST the offer; keep the bot's answer.

        Raises:
            ServingError: nothing answers, the bot refuses the offer, or answers it with no SDP.
        """
        target = offer_url(self.url)
        try:
            async with httpx.AsyncClient(timeout=CONNECT_TIMEOUT_S) as client:
                response = await client.post(target, json={"sdp": sdp, "type": type})
        except httpx.HTTPError as e:
            raise not_answering(self.url, e) from e
        if response.is_error:
            raise ServingError(
                f"--bot-url {self.url}: the bot refused the WebRTC offer (POST {target}: HTTP "
                f"{response.status_code} {response.text[:200]})"
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not {"sdp", "type"} <= answer.keys():
            raise ServingError(
                f"--bot-url {self.url}: POST {target} took the WebRTC offer but sent back no SDP "
                f"answer ({response.text[:200]!r}); is it the bot's SmallWebRTC offer URL?"
            )
        self._answer = answer

    def get_answer(self) -> dict[str, str] | None:
        """The bot's SDP answer, once `initialize` has it."""
        return self._answer


class WebRTCCallPair(RemoteCall, WebRTCAudioPair):
    """The caller's side of a SmallWebRTC call to the bot at `url`; there is no agent side."""

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(url, answerer=HttpOffer(url), **kwargs)  # the bot's runner answers

    async def connect_caller(self) -> None:
        """Offer over HTTP, connect, say `client-ready`; a failure ends the call, said."""
        try:
            await super().connect_caller()
        except ServingError as e:
            self._failed(str(e))
        except SimulationError as e:  # the offer was answered; ICE or DTLS never completed
            cause = e.__cause__
            why = (
                f"no ICE/DTLS connection within {ICE_TIMEOUT_S:.0f} s"
                if cause is None or isinstance(cause, TimeoutError)
                else described(cause)
            )
            self._failed(
                f"--bot-url {self.url}: the bot answered the offer, but the WebRTC call did not "
                f"connect ({why}); this caller offers 127.0.0.1 only, so the bot must run on "
                "this machine"
            )
