"""Shared by the tests of Pipecat's own scenarios and bots: fixtures' paths, a deterministic
judge for the fake OpenAI server, and a guard that records every network destination."""

import ipaddress
import json
import socket
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pipecat"
BOTS = FIXTURES / "bots"
SCENARIOS = FIXTURES / "scenarios"
AGENT_SAYS = "The capital of Germany is Berlin, on the river Spree."


def judge_and_agent(body: dict) -> str:
    """The fake's reply: a judge's JSON verdicts (asked with a JSON schema), else the agent's line.

    The judge is deterministic: a goal is met when the call mentions Berlin and nobody insults;
    a criterion (or an `eval:`) is met unless what the judge reads insults.
    """
    schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
    if schema is None:
        return AGENT_SAYS
    said = json.dumps(body["messages"])
    answers = {}
    for name, question in schema["properties"].items():
        shape = question["properties"]
        if "choice" in shape:
            options = shape["choice"]["enum"]
            choice = "meets" if "meets" in options else "yes"
            if "idiot" in said:
                choice = "fails" if "fails" in options else "no"
            answers[name] = {"choice": choice, "probabilities": {o: float(o == choice)
                                                                 for o in options}}  # fmt: skip
        else:
            met = "Berlin" in said and "idiot" not in said
            answers[name] = {"probability": 0.95 if met else 0.05}
    return json.dumps(answers)


def _loopback(host: object) -> bool:
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


class NetworkGuard:
    """Records the destination of every socket connect and name lookup in the process."""

    def __init__(self, monkeypatch):
        self.destinations: list[object] = []
        real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
        real_getaddrinfo = socket.getaddrinfo

        def connect(sock, address):
            self.destinations.append(address)
            return real_connect(sock, address)

        def connect_ex(sock, address):
            self.destinations.append(address)
            return real_connect_ex(sock, address)

        def getaddrinfo(host, *args, **kwargs):
            self.destinations.append((host, "lookup"))
            return real_getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    @property
    def outside(self) -> list[object]:
        """Destinations that are not this machine (AF_UNIX paths count as this machine)."""
        return [
            d for d in self.destinations
            if isinstance(d, tuple) and not _loopback(d[0])
        ]  # fmt: skip


def logged_warnings(load):
    """`load()`'s result, and the warnings logged while it ran (one string)."""
    from loguru import logger

    caught: list[str] = []
    sink = logger.add(lambda m: caught.append(str(m)), level="WARNING")
    try:
        return load(), "\n".join(caught)
    finally:
        logger.remove(sink)
