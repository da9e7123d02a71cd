"""One error path: what fails inside a simulation's task group reaches the user as itself.

Every verb that simulates (`simulate`, `gate`, the service's jobs) runs its episodes in asyncio
task groups, which wrap what a task raised in an `ExceptionGroup` whose own message ("unhandled
errors in a TaskGroup") names no cause and no fix. Each case here plants a real error inside
one (a bot refused before its first frame, a provider we cannot serve, a held-out id reused
with other content) and checks the exit code of the error's branch and its own message.

And no label without a judge: a persona or judge endpoint that does not answer stops the run
before any call (exit 69, a service unavailable), and one that dies mid-run, or answers every
question with HTTP 404 or 500, leaves its calls harness errors and stops the run (69), never a
`judge:success` nobody gave and never a training row.
"""

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipecat_rl.cli.common import (
    EXIT_DATA,
    EXIT_FAILURE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code_for,
)
from pipecat_rl.errors import (
    ConfigError,
    JobCancelled,
    ServingError,
    SimulationError,
    first_error,
)
from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.jobs import JobRecord
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.service import jobs
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.serving.server import free_port
from tests.cli_helpers import invoke
from tests.pipecat_helpers import BOTS, SCENARIOS
from tests.service_helpers import clinic_copy

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
ROUTINE = CLINIC / "handwritten" / "pool" / "routine_booking.yaml"
SCRIPTED = ("--persona", "scripted")


def _no_group(text: str) -> None:
    assert "ExceptionGroup" not in text and "TaskGroup" not in text, text
    assert "please report it" not in text, text


# -- the unwrapping ------------------------------------------------------------------------


def test_a_group_stands_for_its_first_project_error_at_any_depth():
    ours = ConfigError("the bot's OpenAILLMService needs the served model")
    nested = BaseExceptionGroup(
        "outer", [asyncio.CancelledError(), ExceptionGroup("inner", [RuntimeError("x"), ours])]
    )
    assert first_error(nested) is ours  # ours, though a bug came first: it says what to do
    assert exit_code_for(nested) == EXIT_USAGE
    bug = RuntimeError("a bug")
    assert first_error(BaseExceptionGroup("g", [asyncio.CancelledError(), bug])) is bug
    cancelled = JobCancelled("stop")
    assert first_error(BaseExceptionGroup("g", [cancelled, asyncio.CancelledError()])) is cancelled
    plain = ServingError("gone")
    assert first_error(plain) is plain and exit_code_for(plain) == EXIT_UNAVAILABLE


def test_a_real_task_group_is_unwrapped_to_the_error_its_task_raised():
    async def planted() -> None:
        async def fails() -> None:
            await asyncio.sleep(0)
            raise SimulationError("the harness broke: here is what to do")

        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(60))  # cancelled by the failure
            group.create_task(fails())

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(planted())
    error = first_error(raised.value)
    assert isinstance(error, SimulationError) and exit_code_for(raised.value) == EXIT_FAILURE


# -- simulate ------------------------------------------------------------------------------


def test_simulate_a_bot_refused_before_its_first_frame_is_64_with_its_own_message(tmp_path):
    ledger = tmp_path / "l.db"
    result = invoke(
        "simulate", str(ROUTINE), "--bot", str(CLINIC / "bot.py"), *SCRIPTED, "--no-server",
        "--ledger", str(ledger), "--json",
    )  # fmt: skip
    assert result.exit_code == EXIT_USAGE, result.output
    assert "OpenAILLMService needs the served model" in result.stderr
    assert "drop --no-server, or pass --llm-url" in result.stderr
    assert "needs the served model" in json.loads(result.stdout)["error"]
    _no_group(result.output)
    with Ledger(ledger) as store:
        assert store.sessions() == []


def test_simulate_a_provider_we_cannot_serve_names_itself_and_the_fix(tmp_path):
    result = invoke(
        "simulate", str(SCENARIOS / "capital.yaml"), "--bot", str(BOTS / "anthropic_bot.py"),
        *SCRIPTED, "--no-server", "--ledger", str(tmp_path / "l.db"),
    )  # fmt: skip
    assert result.exit_code == EXIT_USAGE, result.output
    assert "AnthropicLLMService" in result.stderr and "--bot file.py:entry" in result.stderr
    _no_group(result.output)


def test_simulate_a_heldout_id_reused_with_other_content_is_65_naming_it(tmp_path):
    clinic = clinic_copy(tmp_path, pool=[], heldout=["heldout_terse_booking"])
    path = clinic / "handwritten" / "heldout" / "heldout_terse_booking.yaml"
    (before,) = load_scenarios([path])
    ledger = tmp_path / "l.db"
    with Ledger(ledger) as store:
        store.record_heldout_hashes([(before.content_hash(), before.id, None)])
    text = path.read_text()
    path.write_text(text.replace("goal: ", "goal: Be quick. ", 1))  # same name, new content
    (after,) = load_scenarios([path])
    assert after.content_hash() != before.content_hash()
    result = invoke(
        "simulate", str(path), "--bot", str(clinic / "expert.py"), *SCRIPTED, "--no-server",
        "--ledger", str(ledger),
    )  # fmt: skip
    assert result.exit_code == EXIT_DATA, result.output
    assert "was held out with other content" in result.stderr
    assert "give the edited scenario a new name" in result.stderr
    _no_group(result.output)


# -- gate ----------------------------------------------------------------------------------


class _Root(BaseHTTPRequestHandler):
    """An OpenAI-compatible root that lists one model and answers each question with text that
    is no verdict; with `status`, every question gets that HTTP error instead; with `dies`, the
    first POST kills it."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.rstrip("/").endswith("/models"):
            body = b'{"object": "list", "data": [{"id": "base", "owned_by": "test"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        if getattr(server, "dies", False) and not server.dead:  # type: ignore[attr-defined]
            server.dead = True  # type: ignore[attr-defined]
            server.shutdown()  # the listening socket closes: later requests are refused
            server.server_close()
            self.close_connection = True
            return  # and this one is never answered
        if server.status != 200:  # type: ignore[attr-defined]
            self.send_error(server.status)  # type: ignore[attr-defined]
            return
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "base",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "maybe"}}]}  # fmt: skip
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # noqa: D102 (quiet)
        pass


@contextmanager
def openai_root(*, dies: bool = False, status: int = 200) -> Iterator[str]:
    """A tiny OpenAI-compatible server on loopback; yields its `/v1` URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Root)
    server.daemon_threads = True  # so a handler may close the server it runs in
    server.dies, server.dead, server.status = dies, False, status  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        if not server.dead:  # type: ignore[attr-defined]
            server.shutdown()
            server.server_close()


def _gate(tmp_path: Path, bot: Path, llm_url: str) -> tuple:
    clinic = clinic_copy(tmp_path, pool=[], heldout=["heldout_terse_booking", "heldout_handoff"])
    ledger = tmp_path / "l.db"
    result = invoke(
        "gate", "--candidate", "base", "--incumbent", "base",
        "--scenarios", str(clinic / "handwritten" / "heldout"), "--bot", str(bot),
        "--llm-url", llm_url, *SCRIPTED, "--mode", "text", "--repeats", "2",
        "--ledger", str(ledger), "--out", str(tmp_path / "receipt"),
    )  # fmt: skip
    return result, ledger


def test_gate_a_bot_refused_inside_its_runs_is_64_with_its_own_message(tmp_path):
    with openai_root() as url:
        result, ledger = _gate(tmp_path, BOTS / "anthropic_bot.py", url)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "AnthropicLLMService" in result.stderr and "--bot file.py:entry" in result.stderr
    # said before any call: how many, on which channel
    assert "gate: 8 calls (2 held-out scenario(s) x 2 run(s) x 2 policies), in text:" in (
        result.stderr
    )
    _no_group(result.output)
    assert not (tmp_path / "receipt").exists()
    assert not ledger.exists() or Ledger(ledger).sessions() == []


def test_gate_against_a_server_that_does_not_answer_is_69_before_any_call(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    result, ledger = _gate(tmp_path, CLINIC / "expert.py", dead)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert "cannot reach the LLM server" in result.stderr
    _no_group(result.output)
    assert not ledger.exists() or Ledger(ledger).sessions() == []


# -- the service's jobs --------------------------------------------------------------------


def _run_job(tmp_path: Path, params: dict, data_dir: Path | None = None) -> JobRecord:
    """Run a simulate job; the data dir holds the examples the jobs here name (the repo's)."""
    data_dir = data_dir or CLINIC.parents[1]
    settings = ServiceSettings(data_dir=data_dir, ledger=tmp_path / "ledger.db", token="t")
    with Ledger(settings.ledger) as ledger:
        ledger.add_job("simulate", params, job_id=jobs.new_job_id("simulate"))
        job = ledger.claim_next_job()
        assert job is not None
        return jobs.run_job(jobs.JobContext(job, ledger, settings))


def test_a_job_stores_the_real_error_not_the_group(tmp_path):
    params = {"scenarios": [str(ROUTINE)], "bot": str(CLINIC / "bot.py"), "persona": "scripted",
              "repeats": 1, "no_server": True}  # fmt: skip
    done = _run_job(tmp_path, params)
    assert done.state == "failed"
    assert done.error is not None and "OpenAILLMService needs the served model" in done.error
    _no_group(done.error)


def test_a_job_whose_handler_fails_in_a_task_group_records_the_cause(tmp_path, monkeypatch):
    async def grouped(error: BaseException) -> None:
        async def raises() -> None:
            raise error

        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(60))
            group.create_task(raises())

    params = {"scenarios": [str(ROUTINE)], "bot": str(CLINIC / "expert.py")}
    monkeypatch.setitem(jobs.HANDLERS, "simulate", lambda *_: asyncio.run(grouped(KeyError("k"))))
    failed = _run_job(tmp_path / "bug", params)
    assert failed.state == "failed" and failed.error == "KeyError: 'k'"
    monkeypatch.setitem(
        jobs.HANDLERS, "simulate", lambda *_: asyncio.run(grouped(JobCancelled("asked to stop")))
    )
    assert _run_job(tmp_path / "stop", params).state == "cancelled"  # never "failed"


# -- no label without a judge --------------------------------------------------------------


def test_a_judge_that_does_not_answer_stops_simulate_before_any_call(tmp_path):
    ledger = tmp_path / "l.db"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    result = invoke(
        "simulate", str(ROUTINE), "--bot", str(CLINIC / "expert.py"), *SCRIPTED, "--no-server",
        "--judge-llm-url", dead, "--ledger", str(ledger),
    )  # fmt: skip
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"{dead} (model base), which does not answer" in result.stderr
    assert "--judge-llm-url URL --judge-model NAME" in result.stderr
    assert not ledger.exists() or Ledger(ledger).sessions() == []
    # the served model as persona and judge (--no-server with a URL): refused as fast
    served = invoke(
        "simulate", str(ROUTINE), "--bot", str(CLINIC / "expert.py"), "--no-server",
        "--llm-url", dead.removesuffix("/v1"), "--ledger", str(ledger),
    )  # fmt: skip
    assert served.exit_code == EXIT_UNAVAILABLE, served.output
    assert f"the served model at {dead} does not answer" in served.stderr
    assert not ledger.exists() or Ledger(ledger).sessions() == []


def _simulate_judged(tmp_path: Path, judge_url: str, repeats: int) -> tuple:
    ledger = tmp_path / "l.db"
    result = invoke(
        "simulate", str(ROUTINE), "--bot", str(CLINIC / "expert.py"), *SCRIPTED, "--no-server",
        "--judge-llm-url", judge_url, "--judge-timeout", "10", "--repeats", str(repeats),
        "-c", "1", "--ledger", str(ledger), "--json",
    )  # fmt: skip
    return result, ledger


def test_a_judge_that_dies_mid_run_labels_nothing_and_trains_nothing(tmp_path):
    # the planted case's twin: a judge that answers (with no verdict) keeps the call trainable
    with openai_root() as url:
        answers, kept = _simulate_judged(tmp_path / "alive", url, 1)
    assert answers.exit_code == 0, answers.output
    with Ledger(kept) as store:
        assert {s.outcome for s in store.sessions()} == {"pass"}  # the verifier decides
        assert store.training_turns(require_token_exact=False, purpose="sft")

    with openai_root(dies=True) as url:  # answers both pre-flights, dies at the first question
        result, ledger = _simulate_judged(tmp_path / "dies", url, 3)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"the judge at {url} stopped answering" in result.stderr
    report = json.loads(result.stdout)
    outcomes = [e["outcome"] for e in report["episodes"]]
    assert outcomes == ["error", "not_run", "not_run"]  # no call started against a dead judge
    (episode,) = [e for e in report["episodes"] if e["outcome"] == "error"]
    assert "stopped answering" in episode["error"] and "not judged" in episode["error"]
    assert not any(part.startswith("judge:") for part in episode["reward_parts"])
    with Ledger(ledger) as store:
        (session,) = store.sessions()
        assert session.outcome == "error"
        assert "judge:success" not in {s.name for s in store.scores(session.id)}
        assert store.training_turns(require_token_exact=False, purpose="sft") == []


@pytest.mark.parametrize("status", [404, 500])
def test_a_judge_that_lists_models_but_answers_http_errors_stops_the_run(tmp_path, status):
    # /models answers (the pre-flight passes); every question gets 404 (a model it does not
    # serve) or 500: unanswered, never "unscored" in a run that exits 0
    with openai_root(status=status) as url:
        result, ledger = _simulate_judged(tmp_path, url, 3)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"the judge at {url} answers a question for model base with HTTP {status}" in (
        result.stderr
    )
    report = json.loads(result.stdout)
    assert [e["outcome"] for e in report["episodes"]] == ["error", "not_run", "not_run"]
    assert not any(p.startswith("judge:") for e in report["episodes"] for p in e["reward_parts"])
    with Ledger(ledger) as store:
        (session,) = store.sessions()
        assert session.outcome == "error"
        assert store.training_turns(require_token_exact=False, purpose="sft") == []


# -- --ledger "" ---------------------------------------------------------------------------

_VERBS = {
    "ledger stats": ["ledger", "stats"],
    "simulate": ["simulate", str(ROUTINE), "--bot", str(CLINIC / "expert.py"), *SCRIPTED,
                 "--no-server"],
    "gate": ["gate", "--candidate", "base", "--from-ledger"],
    "train": ["train", "--algo", "sft"],
    "cycle": ["cycle", "--config", str(CLINIC / "loop.yaml")],
    "service": ["service", "--data-dir", "."],
}  # fmt: skip


@pytest.mark.parametrize("verb", list(_VERBS))
@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_ledger_flag_is_refused_not_read_as_unset(verb, blank, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    result = invoke(*_VERBS[verb], "--ledger", blank)
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"--ledger {blank!r} names no ledger" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no ./pipecat-rl.db written unasked


def test_a_server_whose_engine_died_is_gone_though_its_models_still_answer():
    """vLLM's API process keeps answering /v1/models after its engine died; /health says 503."""
    import http.server
    import threading

    from pipecat_rl.simulator.runner import server_gone

    class Handler(http.server.BaseHTTPRequestHandler):
        health = 503

        def do_GET(self):  # noqa: N802 - the standard library's name
            code = Handler.health if self.path == "/health" else 200
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        reason = asyncio.run(server_gone(url))
        assert reason and "engine is gone (/health 503)" in reason
        Handler.health = 404  # a server without /health (not vLLM) is judged by its models
        assert asyncio.run(server_gone(url)) is None
        Handler.health = 200
        assert asyncio.run(server_gone(url)) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_job_whose_files_now_lead_outside_the_data_dir_fails_as_it_starts(tmp_path):
    """Checked when queued and again when run: a file swapped for a link out fails the job."""
    inside = tmp_path / "data"
    (inside / "scenarios").mkdir(parents=True)
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(ROUTINE.read_text())
    (inside / "scenarios" / "routine.yaml").symlink_to(outside)  # swapped after it was queued
    params = {"scenarios": [str(inside / "scenarios")], "bot": str(CLINIC / "expert.py"),
              "persona": "scripted", "repeats": 1, "no_server": True}  # fmt: skip
    done = _run_job(tmp_path, params, data_dir=inside)
    assert done.state == "failed"
    assert done.error is not None and "refused as the job started" in done.error
    assert "outside" in done.error
