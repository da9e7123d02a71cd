"""SmallWebRTC over loopback: the agent on Pipecat's SmallWebRTC, the caller an aiortc peer.

Both run in the simulator's process and meet on 127.0.0.1 (host candidates only, no STUN):
the caller makes the offer and the agent's `SmallWebRTCConnection` answers it, handed across
in memory as Pipecat's `SmallWebRTCRequestHandler` would over HTTP. From there it is a real
WebRTC call: ICE, DTLS-SRTP, Opus both ways, aiortc's jitter buffer and decoder on each
receiving side, and the RTVI `client-ready` message over a data channel. The caller still
speaks through its paced 20 ms mouth (its frames become the microphone track), and the heard
gap is taken where the agent's audio comes out of the caller's decoder, so it includes the
codec, the packetisation and the buffer. Hanging up is what a browser does: the caller closes
its peer connection (the bot sees `on_client_disconnected`); the bot's `EndFrame` closes the
agent's side, which the caller sees as the peer leaving.

Needs the `webrtc` extra (`pipecat-ai[webrtc]`: aiortc, PyAV).
"""

import asyncio
import contextlib
import fractions
import json
import time
from typing import Any

import numpy as np

from pipecat_rl import compat
from pipecat_rl.errors import ConfigError, SimulationError
from pipecat_rl.simulator.audio.channel import FRAME_SAMPLES, SAMPLE_RATE
from pipecat_rl.simulator.audio.transport import AudioTransportPair, voiced
from pipecat_rl.simulator.transport import client_ready

CONNECT_TIMEOUT_S = 15.0
"""How long ICE + DTLS on loopback may take before the call counts as failed (it takes ~0.2 s)."""
MAX_QUEUED_FRAMES = 5
"""The microphone keeps at most this many 20 ms frames waiting for the sender (no backlog)."""


def require_webrtc(flag: str = "--transport webrtc") -> None:
    """A `ConfigError` naming `flag` and the extra when aiortc (SmallWebRTC's stack) is missing."""
    try:
        import aiortc  # noqa: F401
        import av  # noqa: F401
        from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"{flag} needs aiortc and PyAV ({e.name} is missing): pip install 'pipecat-rl[webrtc]'"
        ) from e


def _microphone_class() -> type:
    from aiortc import MediaStreamTrack

    class CallerMicrophone(MediaStreamTrack):
        """The caller's microphone: the 20 ms frames its mouth sends, as an aiortc audio track.

        Frames queued before the call is up are dropped (a caller is not heard before it is
        connected), and the queue never holds more than `MAX_QUEUED_FRAMES`.
        """

        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.live = False
            self._queue: asyncio.Queue[bytes] = asyncio.Queue()
            self._pts = 0

        def send(self, pcm: bytes) -> None:
            if not self.live:
                return
            while self._queue.qsize() >= MAX_QUEUED_FRAMES:
                self._queue.get_nowait()
            self._queue.put_nowait(pcm)

        async def recv(self) -> Any:
            from av import AudioFrame

            pcm = await self._queue.get()
            samples = np.frombuffer(pcm, dtype=np.int16)
            frame = AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = self._pts
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            self._pts += len(samples)
            return frame

    return CallerMicrophone


class WebRTCAudioPair(AudioTransportPair):
    """An audio call carried over WebRTC on loopback; the agent's transport is SmallWebRTC's.

    `agent_params` are the `TransportParams` the agent's `SmallWebRTCTransport` is built with
    (the bot's own `transport_params["webrtc"]`, when it declares one); audio in and out are on.
    `answerer` answers the caller's offer (`initialize`, `get_answer`): by default an in-process
    `SmallWebRTCConnection`, the agent's side; a bot elsewhere answers over HTTP instead.
    """

    def __init__(self, *, agent_params: Any = None, answerer: Any = None, **kwargs: Any):
        require_webrtc()
        from aiortc import RTCPeerConnection
        from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection

        self._agent_params = agent_params
        self.connection = answerer if answerer is not None else SmallWebRTCConnection()
        """The side that answers the caller's offer (Pipecat's, in process, by default)."""
        self.peer = RTCPeerConnection()
        """The caller's side (aiortc), the browser of a real call."""
        self.microphone = _microphone_class()()
        self._hearing: asyncio.Task | None = None
        self._closing: asyncio.Task | None = None
        self._channel: Any = None
        super().__init__(**kwargs)

    def _agent_transport(self) -> Any:
        from pipecat.transports.base_transport import TransportParams
        from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

        params = self._agent_params or TransportParams()
        params = params.model_copy(update={"audio_in_enabled": True, "audio_out_enabled": True})
        return SmallWebRTCTransport(webrtc_connection=self.connection, params=params)

    async def connect_caller(self) -> None:
        """Offer, answer, and wait for ICE and DTLS; then `client-ready` on the data channel."""
        from aiortc import RTCSessionDescription

        peer = self.peer
        peer.addTransceiver(self.microphone, direction="sendrecv")
        self._channel = peer.createDataChannel("pipecat-rl")
        connected = asyncio.get_running_loop().create_future()

        @peer.on("connectionstatechange")
        async def on_state() -> None:
            state = peer.connectionState
            if state == "connected" and not connected.done():
                connected.set_result(None)
            elif state in ("failed", "closed"):
                if not connected.done():
                    connected.set_exception(ConnectionError(f"WebRTC connection {state}"))
                self.end("agent_hung_up")

        @peer.on("track")
        def on_track(track: Any) -> None:
            self._hearing = asyncio.get_running_loop().create_task(self._hear(track))

        @self._channel.on("open")
        def on_open() -> None:
            if self.send_client_ready:
                self._channel.send(json.dumps(client_ready()))

        @self._channel.on("message")
        def on_message(message: Any) -> None:
            if _peer_left(message):  # the bot ended the call (its transport disconnected)
                self.end("agent_hung_up")

        with compat.loopback_ice():  # both peers gather their candidates here: 127.0.0.1 only
            await peer.setLocalDescription(await peer.createOffer())
            offer = peer.localDescription
            await self.connection.initialize(sdp=offer.sdp, type=offer.type)
        answer = self.connection.get_answer()
        await peer.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        try:
            await asyncio.wait_for(connected, CONNECT_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as e:
            raise SimulationError(
                f"WebRTC loopback: the caller could not connect to the agent's SmallWebRTC "
                f"({e or f'no ICE/DTLS connection within {CONNECT_TIMEOUT_S:.0f} s'})"
            ) from e
        self.microphone.live = True
        self.caller_connected.set()

    async def caller_audio_out(self, pcm: bytes, at: float) -> None:
        """The caller's frame goes out on its microphone track."""
        del at
        self.microphone.send(pcm)

    async def _hear(self, track: Any) -> None:
        """The agent's audio, decoded by aiortc, resampled to 16 kHz mono, into the caller's ear."""
        from aiortc.mediastreams import MediaStreamError
        from av import AudioResampler

        resampler = AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        ear = self.caller.input()
        carry = bytearray()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            at = time.monotonic()
            for out in resampler.resample(frame):
                carry.extend(out.to_ndarray().astype(np.int16).tobytes())
            while len(carry) >= FRAME_SAMPLES * 2:
                pcm = bytes(carry[: FRAME_SAMPLES * 2])
                del carry[: FRAME_SAMPLES * 2]
                self.agent_audio_heard(voiced(pcm), at)
                await ear.receive(pcm, at)

    def end(self, reason: Any) -> None:
        """End the call, then hang up the caller's peer connection (the bot sees it leave)."""
        first = not self.done.is_set()
        super().end(reason)
        if first:
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        """Close both peers and stop listening (idempotent)."""
        self.microphone.live = False
        with contextlib.suppress(Exception):
            await self.peer.close()
        with contextlib.suppress(Exception):  # closed already, unless the bot never ran
            await self.connection.pc.close()
        if self._hearing is not None:
            self._hearing.cancel()
            await asyncio.gather(self._hearing, return_exceptions=True)
            self._hearing = None
        closing, self._closing = self._closing, None
        if closing is not None and closing is not asyncio.current_task():
            await asyncio.gather(closing, return_exceptions=True)  # the hang-up's own close


def _peer_left(message: Any) -> bool:
    try:
        body = json.loads(message) if isinstance(message, str) else None
    except ValueError:
        return False
    inner = body.get("message") if isinstance(body, dict) else None
    return (
        isinstance(inner, dict)
        and body.get("type") == "signalling"
        and (inner.get("type") == "peerLeft")
    )
