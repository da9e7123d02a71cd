"""`simulate --bot-url`: the persona calls a bot that Pipecat's own runner already serves.

The bot (`tests/remote_bot.py`) runs in its own process under `pipecat.runner.run.main`, as
`python bot.py -t websocket` (Pipecat's WebSocket transport, protobuf frames) or `-t webrtc`
(SmallWebRTC, its offer POSTed to the runner) runs any bot; the call is real-time audio both
ways and judged by the fake OpenAI server's deterministic judge, so those tests are `slow`.
The refusals and the start checks need no bot.
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.eligibility import eligible_session
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.simulator.remote_webrtc import offer_url
from tests import remote_bot, test_endpoint_roots
from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / "examples" / "clinic" / "world.py"
STARTUP_S = 120.0
"""How long the runner may take to import Pipecat and listen (a loaded CI machine)."""
openai_stub = test_endpoint_roots.fake
"""The fake OpenAI server with its deterministic judge, on its own thread and loop (the CLI
runs its own loop): its host URL and the requests it was sent."""

SCENARIO = f"""\
name: echo_desk
persona: A caller checking that the line works.
goal: Hear the greeting, ask for a cleaning in Berlin, hear it said back, then hang up.
success: The agent said back what the caller asked for.
max_turns: 3
max_silence_s: 30
world: {{pack: {WORLD}}}
verify:
  - count: {{table: handoffs, equals: 1}}
script:
  rules:
    - {{when: "you said", say: "Thank you, goodbye.", end_call: true}}
    - {{when: "reached|desk", say: "I would like a cleaning in Berlin.", times: 1}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scenario(tmp_path: Path, text: str = SCENARIO) -> Path:
    path = tmp_path / "echo_desk.yaml"
    path.write_text(text)
    return path


def _simulate(tmp_path: Path, *flags: str):
    return invoke(
        "simulate", str(_scenario(tmp_path)), "--persona", "scripted", "--no-server",
        "--ledger", str(tmp_path / "l.db"), *flags,
    )  # fmt: skip


def _wait_listening(port: int, bot: subprocess.Popen) -> None:
    """Until the runner accepts connections (or has died, or `STARTUP_S` has passed)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if bot.poll() is not None:
            raise AssertionError(f"the runner exited with {bot.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the runner did not listen on {port} within {STARTUP_S:.0f} s")


URLS = {"websocket": "ws://127.0.0.1:{port}/ws-client", "webrtc": "http://127.0.0.1:{port}"}
"""Where the runner serves the bot, by `-t`: its WebSocket, and (with no path: the runner's
`/api/offer` is meant) its SmallWebRTC offer endpoint."""


@pytest.fixture(params=sorted(URLS))
def running_bot(request, tmp_path):
    """`python tests/remote_bot.py -t TRANSPORT --port PORT`: the URL it is called at."""
    port = _free_port()
    log = (tmp_path / "bot.log").open("w")
    bot = subprocess.Popen(
        [sys.executable, remote_bot.__file__, "-t", request.param, "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_listening(port, bot)
        yield URLS[request.param].format(port=port)
    finally:
        bot.terminate()
        bot.wait(timeout=30)
        log.close()


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
def test_a_call_to_a_running_bot_goes_both_ways_is_judged_and_recorded_from_the_caller(
    tmp_path, running_bot, openai_stub
):
    judge, seen = openai_stub
    seen.clear()
    result = _simulate(tmp_path, "--bot-url", running_bot, "--judge-llm-url", judge, "--json")
    bot_log = (tmp_path / "bot.log").read_text()[-3000:]
    assert result.exit_code == 0, (result.stdout, result.stderr, bot_log)
    assert (
        f"the bot at {running_bot} runs elsewhere: recorded from the caller's side only; its "
        "world is not verified"
    ) in " ".join(result.stderr.split())
    (episode,) = json.loads(result.stdout)["episodes"]
    ledger = Ledger(tmp_path / "l.db")
    session = ledger.session(episode["session_id"])
    transcript = session.metadata["transcript"]
    agent = [x["text"].lower() for x in transcript if x["speaker"] == "agent"]
    # The caller heard the bot's greeting, and the bot answered the caller's line with what its
    # own STT heard of it: the audio went both ways over the WebSocket.
    assert agent and "reached" in agent[0], transcript
    assert any("you said" in x and ("cleaning" in x or "berlin" in x) for x in agent), transcript
    assert session.metadata["recorded_from"] == "caller"
    assert session.metadata["bot_url"] == running_bot
    assert session.metadata["transport"] == ("webrtc" if "http" in running_bot else "websocket")
    # Judged on the transcript as the caller heard it (the bot's words as its STT wrote them),
    # and the judge's verdict is the only one: nothing of the bot's world was verified.
    asked = [json.dumps(b["messages"]) for path, b in seen if "response_format" in b]
    assert asked and all("reached" in x.lower() for x in asked), asked
    scores = {s.name: s.value for s in ledger.scores(session.id)}
    assert scores["judge:success"] == episode["reward_parts"]["judge:success"] == 1.0, scores
    assert episode["outcome"] == session.outcome == "pass"
    assert "verifier" not in episode["reward_parts"]
    assert episode["unscored"]["verifier"] == (
        "unverified: the bot runs elsewhere; its world cannot be read"
    )
    assert ledger.turns(session.id) == []  # no token ids: nothing of the bot's was seen
    heard = [r.heard_gap_ms for r in ledger.latencies(session.id)]
    assert heard and all(ms is not None and ms > 0 for ms in heard)  # timed at the caller's ear
    # Never trains: the eligibility rule keeps it out, and `ledger stats` says why.
    assert ledger.rows(f"SELECT count(*) FROM sessions s WHERE {eligible_session()}") == [(0,)]
    stats = invoke("ledger", "stats", "--ledger", str(tmp_path / "l.db"))
    assert "1 recorded from the caller's side" in " ".join(stats.stdout.split())


@pytest.mark.parametrize(("url", "start"), [
    ("ws://127.0.0.1:{port}/ws-client", "python bot.py -t websocket"),
    ("http://127.0.0.1:{port}/api/offer", "python bot.py -t webrtc"),
])  # fmt: skip
def test_nothing_answering_at_the_url_is_one_clear_error(tmp_path, url, start):
    url = url.format(port=_free_port())  # bound once, closed: nothing listens
    result = _simulate(tmp_path, "--bot-url", url)
    assert result.exit_code == EXIT_UNAVAILABLE, (result.stdout, result.stderr)
    said = " ".join(result.stderr.split())
    assert f"--bot-url {url}: nothing answers there" in said
    assert start in said  # how to start a bot that answers there
    assert "Traceback" not in result.stderr + result.stdout
    assert not Ledger(tmp_path / "l.db").sessions()  # no call was made


def test_a_server_that_takes_no_offers_is_refused_before_any_call(tmp_path, openai_stub):
    host, _ = openai_stub  # an HTTP server, but no SmallWebRTC offer endpoint: /api/offer is a 404
    result = _simulate(tmp_path, "--bot-url", host)
    assert result.exit_code == EXIT_UNAVAILABLE, (result.stdout, result.stderr)
    said = " ".join(result.stderr.split())
    assert f"--bot-url {host}: nothing takes WebRTC offers at {host}/api/offer (HTTP 404)" in said
    assert not Ledger(tmp_path / "l.db").sessions()


def test_a_refused_offer_is_a_failed_call_that_says_why(tmp_path, openai_stub):
    host, _ = openai_stub
    url = f"{host}/v1/models"  # answers the start check's GET, refuses the POSTed offer
    result = _simulate(tmp_path, "--bot-url", url, "--json")
    (episode,) = json.loads(result.stdout)["episodes"]
    assert episode["outcome"] == "error", episode
    assert episode["error"].startswith(
        f"--bot-url {url}: the bot refused the WebRTC offer (POST {url}: HTTP 405"
    ), episode["error"]
    (session,) = Ledger(tmp_path / "l.db").sessions()  # a failed call is data, not a crash
    assert session.outcome == "error" and session.metadata["transport"] == "webrtc"


def test_a_webrtc_url_without_aiortc_names_the_flag_and_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "aiortc", None)  # as if pipecat-rl[webrtc] were not installed
    url = f"http://127.0.0.1:{_free_port()}"
    result = _simulate(tmp_path, "--bot-url", url)
    assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr)
    said = " ".join(result.stderr.split())
    assert f"--bot-url {url} needs aiortc and PyAV (aiortc is missing)" in said, said
    assert "pipecat-rl[webrtc]" in said and "--transport" not in said


def test_an_http_url_means_the_runners_offer_endpoint():
    assert offer_url("http://127.0.0.1:7860") == "http://127.0.0.1:7860/api/offer"
    assert offer_url("http://127.0.0.1:7860/") == "http://127.0.0.1:7860/api/offer"
    given = "https://bot.example/sessions/s1/api/offer"
    assert offer_url(given) == given


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--bot", "bot.py", "--bot-url", "ws://127.0.0.1:1/ws-client"], "--bot-url URL"),
        ([], "--bot-url URL"),
        (["--bot-url", "ftp://127.0.0.1:7860/x"], "--bot-url ftp://127.0.0.1:7860/x: give"),
        (["--bot-url", "127.0.0.1:7860"], "--bot-url 127.0.0.1:7860: give the bot's WebSocket"),
        (["--bot-url", "ws://127.0.0.1:1/ws-client", "--mode", "text"], "leave out --mode text"),
        (["--bot-url", "ws://x/ws-client", "--transport", "webrtc"], "--transport webrtc"),
    ],
)
def test_bot_url_refuses_what_it_cannot_do(tmp_path, flags, said):
    result = _simulate(tmp_path, *flags)
    assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr)
    assert said in " ".join(result.stderr.split())


def test_scenarios_that_need_the_bots_inside_are_refused(tmp_path):
    from pipecat_rl.simulator.remote import check_remote

    check_remote(load_scenarios([_scenario(tmp_path)]))  # what the caller hears: fine
    context = "max_turns: 3\ncontext:\n  - {role: user, content: hi}\n"
    text = SCENARIO.replace("max_turns: 3\n", context)
    with pytest.raises(ConfigError, match="echo_desk needs what only the bot's own process sees"):
        check_remote(load_scenarios([_scenario(tmp_path, text)]))


def test_a_session_recorded_from_the_caller_never_trains(tmp_path):
    from tests.test_ledger_scores import session, turn

    ledger = Ledger(tmp_path / "l.db")
    for sid, metadata in (("ours", {}), ("theirs", {"recorded_from": "caller"})):
        ledger.write_session(
            session(sid, source="simulate", outcome="pass", metadata=metadata), [turn(sid)]
        )
    trainable = ledger.rows(f"SELECT s.id FROM sessions s WHERE {eligible_session()}")
    assert trainable == [("ours",)]  # the same pass, kept out by where it was recorded from
    assert ledger.stats()["recorded_from_caller"] == 1
    stats = invoke("ledger", "stats", "--ledger", str(tmp_path / "l.db"))
    said = " ".join(stats.stdout.split())
    assert "sessions kept out of training: 1 recorded from the caller's side" in said
