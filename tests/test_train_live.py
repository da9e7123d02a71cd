"""A day of live calls becomes training rows: recorded, scored through the service and the CLI,
chosen by the loop's `live:` trust (or `pipecat-rl train --live-*`), trained with each scorer's
explanation as the OPSD hint. The whole day, end to end: the clinic bot in production
(`examples/clinic/live_bot.py`) takes scripted callers' calls on a stand-in vLLM serving a tiny
model, QA scores half through the service, `pipecat-rl judge` the rest, OPSD trains from the
CLI and the candidate is gated on the held-out set."""

import asyncio
import importlib
import json
import sys
import time
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, LiveTrust, ScoreIn, SessionRecord
from pipecat_rl.loop.config import LiveSettings, load_loop_config
from pipecat_rl.loop.cycle import live_calls, run_cycle
from pipecat_rl.scenarios import Scenario, load_scenarios
from pipecat_rl.scenarios.scenario import Script, ScriptRule
from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training import trainer as trainer_module
from tests.test_train_online import TinyVLLM
from tests.train_helpers import sample_turn

TOKEN = "day-token"
CLINIC_LOOP = Path(__file__).parents[1] / "examples" / "clinic" / "loop.yaml"
CALLER = ("Hi, I need a cleaning.", "Tuesday at nine, please.")
WRONG_TIME = "Booked Tuesday at ten; the caller asked for nine."
RIGHT = "Booked the cleaning the caller asked for and read it back."


def _loop(tmp_path: Path, live_block: str) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(f"bot: bot.py\npool: pool\nheldout: heldout\nout: out\n{live_block}")
    return path


def test_the_clinic_loops_commented_live_block_is_a_valid_one(tmp_path):
    lines = CLINIC_LOOP.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# live:"))
    block = [lines[start][2:]]
    block += [line[2:] for line in lines[start + 1 :] if line.startswith("#   ")]
    config = load_loop_config(_loop(tmp_path, "\n".join(block) + "\n"))
    assert config.live == LiveSettings(since=86400, settle=3600, opsd_steps=4, sft=True)
    assert config.live.trust().sources == ("human", "coval", "pipecat-evals", "judge")
    assert load_loop_config(CLINIC_LOOP).live is None  # commented out: no live call trains


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ("live: {since: yesterday}", "live.since: Value error, 'yesterday' is not a span"),
        ("live: {settle: -5}", "live.settle: Input should be greater than or equal to 0"),
        ("live: {sources: [Coval Inc]}", "live.sources: Value error, score source(s) 'Coval Inc'"),
        ("live: {opsd_steps: -1}", "live.opsd_steps: Input should be greater than or equal to 0"),
        ("live: {colour: red}", "live.colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_live_block_is_refused_naming_its_field(tmp_path, block, said):
    with pytest.raises(ConfigError, match="loop.yaml: ") as e:
        load_loop_config(_loop(tmp_path, block + "\n"))
    assert said in str(e.value)


def _record_call(ledger: Ledger, model, tokenizer, sid: str, ended_ago: float, **turn) -> None:
    """A live call as the recorder writes it: each turn's prompt the chat so far, token-exact."""
    messages = [{"role": "system", "content": "You are the clinic's receptionist."}]
    turns = []
    for index, line in enumerate(CALLER):
        messages = [*messages, {"role": "user", "content": line}]
        prompt = list(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True)["input_ids"])  # fmt: skip
        sampled = sample_turn(
            model, prompt, 4, session_id=sid, index=index, seed=index,
            request={"model": "base", "temperature": 1.0, "messages": messages},
        )  # fmt: skip
        said = tokenizer.decode(sampled.completion_token_ids)
        turns.append(sampled.model_copy(update={"generated_text": said, "redacted": True, **turn}))
        messages = [*messages, {"role": "assistant", "content": said}]
    ended = time.time() - ended_ago
    session = SessionRecord(
        id=sid, source="live", started_at=ended - 60, ended_at=ended, policy="base",
        outcome="completed",
    )  # fmt: skip
    ledger.write_session(session, turns)


def test_a_day_of_live_calls_trains_on_exactly_the_trusted_ones(tmp_path, tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    path = tmp_path / "ledger.db"
    hour = 3600.0
    with Ledger(path) as ledger:  # the day's calls, as the bot's recorder wrote them
        for sid, ended_ago, turn in (
            ("api-fail", 3 * hour, {}), ("cli-pass", 2 * hour, {}),
            ("untrusted", 2 * hour, {}), ("unscored", 2 * hour, {}),
            ("unredacted", 2 * hour, {"redacted": False}),
            ("too-recent", 60.0, {}), ("last-week", 7 * 24 * hour, {}),
        ):  # fmt: skip
            _record_call(ledger, model, tokenizer, sid, ended_ago, **turn)

    settings = ServiceSettings(data_dir=tmp_path, ledger=path, token=TOKEN, poll_s=0.05)
    with TestClient(create_app(settings)) as client:  # the platform's webhook
        for sid, source, verdict, why in (
            ("api-fail", "coval", "fail", WRONG_TIME),
            ("untrusted", "judge", "pass", "fine"),  # trusted by default, not by this loop
            ("unredacted", "coval", "pass", "fine"),
            ("too-recent", "coval", "pass", "fine"),
            ("last-week", "coval", "fail", "old news"),
        ):
            body = {"metric": "success", "value": verdict, "source": source, "explanation": why}
            r = client.post(f"/sessions/{sid}/scores", json=body,
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            assert r.status_code == 201, r.text
    scored = CliRunner().invoke(app, [  # a person's review, on the CLI
        "ledger", "score", "cli-pass", "--value", "pass", "--source", "human",
        "--explanation", RIGHT, "--ledger", str(path),
    ])  # fmt: skip
    assert scored.exit_code == 0, scored.output

    live = LiveSettings(since="24h", sources=["human", "coval"], settle="1h")
    hints: list[tuple[str, int, str]] = []
    opsd_row = trainer_module.opsd_row

    def spy(turn, tok, hint, where):
        hints.append((turn.session_id, turn.index, hint))
        return opsd_row(turn, tok, hint, where)

    monkeypatch.setattr(trainer_module, "opsd_row", spy)
    with Ledger(path) as ledger:
        calls = live_calls(ledger, live, time.time())
        assert sorted(calls["judged"]) == ["api-fail", "cli-pass"]
        assert calls["passed"] == ["cli-pass"]

    def train_cli(*args: str) -> dict:
        """`pipecat-rl train` on the day's live calls, trusting what the loop's `live:` does."""
        result = CliRunner().invoke(app, [
            "train", *args, "--model", str(tiny_dir), "--out", str(tmp_path / "a"),
            "--live-since", "24h", "--live-sources", "human", "--live-sources", "coval",
            "--live-settle", "1h", "--ledger", str(path), "--json",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    opsd = train_cli("--algo", "opsd", "--lr", "1e-3")
    assert opsd["session_ids"] == ["api-fail", "cli-pass"]  # of 6 calls in the window
    assert opsd["metrics"]["hinted_turns"] == 4 and opsd["metrics"]["grad_norm"] > 0
    next_line = f"The caller's next line will be: {CALLER[1]!r}."
    assert sorted(hints) == [
        ("api-fail", 0, f"{next_line} {WRONG_TIME}"), ("api-fail", 1, WRONG_TIME),
        ("cli-pass", 0, f"{next_line} {RIGHT}"), ("cli-pass", 1, RIGHT),
    ]  # fmt: skip
    filtered = train_cli("--algo", "sft", "--epochs", "1")
    assert filtered["session_ids"] == ["cli-pass"]
    assert filtered["metrics"]["passed_sessions"] == 1
    with Ledger(path) as ledger:  # the same trust from the library: the CLI adds only flags
        window = [s.id for s in ledger.sessions(source="live", since=time.time() - live.since)]
        sft = TrainConfig(algo="sft", base_model=str(tiny_dir), out_dir=tmp_path / "a", epochs=1)
        assert train(ledger, sft, live=live.trust(), session_ids=window).session_ids == ["cli-pass"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--live-sources", "Coval Inc"], "--live-sources: score source(s) 'Coval Inc'"),
        (["--live-since", "yesterday"], "--live-since 'yesterday': give a span"),
        (["--live-settle", "soon"], "--live-settle 'soon': give a span"),
        (
            ["--live-since", "1h", "--scenarios", ".", "--bot", "bot.py", "--algo", "grpo"],
            "--live-since trains on recorded live calls",
        ),
    ],
)
def test_bad_live_flags_are_refused_naming_the_flag(tmp_path, flags, said):
    with Ledger(tmp_path / "l.db"):
        pass
    result = CliRunner().invoke(app, ["train", "--ledger", str(tmp_path / "l.db"), *flags])
    assert result.exit_code == 64, result.output
    assert said in " ".join(result.output.split())


def test_no_live_call_in_the_span_is_no_training_signal(tmp_path):
    with Ledger(tmp_path / "l.db"):
        pass
    result = CliRunner().invoke(
        app, ["train", "--ledger", str(tmp_path / "l.db"), "--live-since", "24h"]
    )
    assert result.exit_code == 66, result.output
    assert "no live call started within --live-since 24h" in " ".join(result.output.split())


@pytest.fixture
def cycle_world(tmp_path, monkeypatch):
    """test_cycle's clinic, stand-in vLLM and stand-in training; `train` calls recorded."""
    from tests.service_helpers import FakeVLLM, clinic_copy
    from tests.test_cycle import FakeTraining

    clinic = clinic_copy(tmp_path, pool=["routine_booking"], heldout=["heldout_terse_booking"])
    module = FakeTraining(tmp_path / "ledger.db").module()
    inner, seen = module.train, []

    def train(ledger, config, *, live=None, session_ids=None, **kw):
        seen.append((config.algo, config.parent, live, session_ids))
        return inner(ledger, config, **kw)

    module.train = train
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", module)
    with FakeVLLM() as vllm:
        yield clinic, vllm, seen


def test_the_cycles_train_stage_trains_on_the_live_calls_its_loop_trusts(tmp_path, cycle_world):
    from tests.test_cycle import loop
    from tests.test_ledger_scores import turn

    clinic, vllm, seen = cycle_world
    now = time.time()
    with Ledger(tmp_path / "ledger.db") as ledger:
        for sid, source, value in (("fail", "coval", 0.0), ("pass", "human", 1.0),
                                   ("judged", "judge", 1.0)):  # fmt: skip
            ledger.write_session(
                SessionRecord(id=sid, source="live", started_at=now - 7200, ended_at=now - 7000,
                              outcome="completed"), [turn(sid, 0), turn(sid, 1)])  # fmt: skip
            ledger.post_score(sid, ScoreIn(metric="success", value=value, source=source,
                                           explanation=f"why {sid}"))  # fmt: skip
    live = {"since": "24h", "sources": ["human", "coval"], "settle": "1h", "opsd_steps": 2}
    config = loop(tmp_path, clinic, vllm, stop_after="train", train={"grpo_steps": 0}, live=live)
    summary = run_cycle(config)
    runs = summary.stages["train"]["runs"]
    assert [r["algo"] for r in runs] == ["opsd-live", "sft-live"]
    trust = LiveTrust(sources=("human", "coval"), settle_s=3600)
    (opsd, opsd_parent, opsd_trust, opsd_ids), (sft, sft_parent, sft_trust, sft_ids) = seen
    assert (opsd, opsd_parent, opsd_trust, sorted(opsd_ids)) == ("opsd", None, trust,
                                                                 ["fail", "pass"])  # fmt: skip
    assert (sft, sft_parent, sft_trust, sft_ids) == ("sft", runs[0]["adapter"], trust, ["pass"])
    assert summary.stages["train"]["candidate"] == runs[1]["adapter"]
    events = [json.loads(x) for x in (config.out / "events.jsonl").read_text().splitlines()]
    (counted,) = [e for e in events if e["event"] == "live_calls"]
    assert (counted["judged"], counted["passed"]) == (2, 1)


class StreamingTinyVLLM(TinyVLLM):
    """`TinyVLLM` as a Pipecat bot's recorder meets it: listed as vLLM, chats streamed with
    prompt ids, each chunk's sampled id and its logprob, and usage. A reply is `REPLY_TOKENS`
    sampled ids ending `stop` (a random tiny model never samples its end token). A judge's
    question (a JSON schema, never streamed) is answered by `clinic_judge`: a tiny model
    writes no JSON."""

    REPLY_TOKENS = 6

    def __init__(self, model_dir: Path):
        super().__init__(model_dir)
        api: FastAPI = self._server.config.app
        api.router.routes = [
            r for r in api.router.routes
            if getattr(r, "path", "") not in ("/v1/models", "/v1/chat/completions")
        ]  # fmt: skip

        @api.get("/v1/models")
        def models():
            names = ["base", *self.listed]
            return {"data": [{"id": name, "owned_by": "vllm"} for name in names]}

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            if body.get("response_format"):
                message = {"role": "assistant", "content": clinic_judge(body)}
                choice = {"index": 0, "finish_reason": "stop", "message": message}
                return {"object": "chat.completion", "model": body["model"], "choices": [choice]}
            rendered = self.tokenizer.apply_chat_template(
                body["messages"], tools=body.get("tools"), add_generation_prompt=True,
                tokenize=True,
            )  # fmt: skip
            prompt = list(rendered["input_ids"])
            asked = body.get("max_completion_tokens") or body.get("max_tokens") or 64
            n = min(int(asked), self.REPLY_TOKENS)
            ids, logprobs = self._sample({**body, "max_tokens": n}, prompt)

            def chunk(choices: list, **extra) -> str:
                payload = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                           "model": body["model"], "choices": choices, **extra}  # fmt: skip
                return f"data: {json.dumps(payload)}\n\n"

            def delta(content: str, **extra) -> dict:
                return {"index": 0, "delta": {"content": content}, "finish_reason": None, **extra}

            events = [chunk([delta("")], prompt_token_ids=prompt)]
            for token, logprob in zip(ids, logprobs, strict=True):
                text = self.tokenizer.decode([token])
                sampled = {"content": [{"token": text, "logprob": logprob, "top_logprobs": []}]}
                events.append(chunk([delta(text, token_ids=[token], logprobs=sampled)]))
            events.append(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                     "total_tokens": len(prompt) + len(ids)}  # fmt: skip
            events += [chunk([], usage=usage), "data: [DONE]\n\n"]
            return StreamingResponse(iter(events), media_type="text/event-stream")


def _caller(scenario: Scenario, *lines: str) -> Scenario:
    """`scenario`'s clinic and checks, with a caller who says `lines` whatever it hears and
    hangs up after the last (a tiny model's words match no scenario's rules)."""
    rules = [ScriptRule(say=line, times=1) for line in lines[:-1]]
    script = Script(rules=[*rules, ScriptRule(say=lines[-1], end_call=True)])
    return scenario.model_copy(update={"script": script})


def clinic_judge(body: dict) -> str:
    """A deterministic judge: a call met its goal when the caller only asked about prices."""
    schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
    assert schema is not None, "only the judge calls this endpoint"
    met = "prices" in json.dumps(body["messages"])
    return json.dumps({name: {"probability": 0.9 if met else 0.1} for name in schema["properties"]})


@pytest.mark.slow
async def test_a_day_in_production_trains_on_its_scored_and_judged_calls_then_gates(
    tmp_path, tiny_dir, monkeypatch
):
    """The clinic bot with its recorder line and live adapter takes calls from scripted callers;
    QA posts scores for half through the service, the judge scores the rest; OPSD trains on
    them from the CLI, and the candidate is gated against the base on the held-out set."""
    from tests.fake_openai import serve_fake_openai
    from tests.service_helpers import clinic_copy

    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    heldout = ["heldout_terse_booking", "heldout_price_pressure"]
    clinic = clinic_copy(tmp_path, pool=["routine_booking", "price_question"], heldout=heldout)
    monkeypatch.syspath_prepend(str(clinic))
    live_bot = importlib.import_module("live_bot")
    pool = {s.id: s for s in load_scenarios([clinic / "handwritten" / "pool"])}
    booking = ("Hi, I'd like a checkup.", "Maria Lopez.", "Thanks, bye.")
    prices = ("Hi, what are your prices?", "Just the prices, please.", "OK, bye.")
    callers = {
        "call-qa-1": _caller(pool["routine_booking"], *booking),
        "call-qa-2": _caller(pool["price_question"], *prices),
        "call-nightly-1": _caller(pool["routine_booking"], *booking),
        "call-nightly-2": _caller(pool["price_question"], *prices),
    }
    path = tmp_path / "calls.db"
    cli = CliRunner()

    def run(*args: str, code: int = 0) -> dict:
        result = cli.invoke(app, [*args, "--ledger", str(path), "--json"])
        assert result.exit_code == code, result.output
        return json.loads(result.stdout)

    with StreamingTinyVLLM(tiny_dir) as vllm:
        calls = {
            call_id: await live_bot.take_call(
                scenario, call_id=call_id, llm_url=vllm.url, ledger=path
            )  # fmt: skip
            for call_id, scenario in callers.items()
        }
        for call in calls.values():
            said = [line.text for line in call.transcript if line.speaker == "caller"]
            assert call.end_reason == "caller_hung_up" and tuple(said) in (booking, prices)
        assert [calls[c].passed for c in callers] == [False, True, False, True]
        with Ledger(path) as ledger:  # what the recorder wrote, live, under the platform's ids
            for call_id in callers:
                session = ledger.session(call_id)
                assert (session.source, session.outcome, session.policy) == (
                    "live", "cancelled", "base")  # fmt: skip
                turns = ledger.turns(call_id)
                assert len(turns) >= 3 and all(t.token_exact and t.redacted for t in turns)
            assert ledger.stats()["live_sessions"] == {"unscored": 4, "scored": 0, "trainable": 0}

        settings = ServiceSettings(data_dir=tmp_path, ledger=path, token=TOKEN, poll_s=0.05)
        with TestClient(create_app(settings)) as client:  # QA reviews half the day's calls
            for call_id in ("call-qa-1", "call-qa-2"):
                call = calls[call_id]
                why = "; ".join(call.failed_checks()) or "every check of the clinic's records held"
                body = {"metric": "success", "value": "pass" if call.passed else "fail",
                        "source": "human", "explanation": why}  # fmt: skip
                r = client.post(f"/sessions/{call_id}/scores", json=body,
                                headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
                assert r.status_code == 201, r.text

        rubric = tmp_path / "rubric.yaml"
        rubric.write_text("success: The receptionist answered what the caller asked.\n")
        async with serve_fake_openai([], answer=clinic_judge) as judge_url:  # the nightly judge
            judged = await asyncio.to_thread(
                run, "judge", "--rubric", str(rubric), "--judge-llm-url", judge_url
            )
        assert sorted(c["session_id"] for c in judged["calls"]) == ["call-nightly-1",
                                                                    "call-nightly-2"]  # fmt: skip
        assert (judged["passed"], judged["failed"]) == (1, 1)
        stats = run("ledger", "stats")["live_sessions"]
        assert stats == {"unscored": 0, "scored": 4, "trainable": 0}  # not settled (1 h) yet
        with Ledger(path) as ledger:  # with no settling, all four, as training is told below
            trust = LiveTrust(sources=("human", "judge"), settle_s=0)
            assert ledger.stats(live=trust)["live_sessions"]["trainable"] == 4

        hints: list[tuple[str, int, str]] = []
        opsd_row = trainer_module.opsd_row

        def spy(turn, tok, hint, where):
            hints.append((turn.session_id, turn.index, hint))
            return opsd_row(turn, tok, hint, where)

        monkeypatch.setattr(trainer_module, "opsd_row", spy)
        trained = await asyncio.to_thread(
            run, "train", "--algo", "opsd", "--steps", "2", "--lr", "1e-3", "--model",
            str(tiny_dir), "--out", str(tmp_path / "adapters"), "--llm-url", vllm.url,
            "--live-since", "24h", "--live-settle", "0", "--live-sources", "human",
            "--live-sources", "judge",
        )  # fmt: skip
        assert sorted(trained["session_ids"]) == sorted(callers)
        assert trained["loaded"] and trained["metrics"]["grad_norm"] > 0
        with Ledger(path) as ledger:
            for call_id in callers:  # each call's scorer's explanation is its teacher's hint
                why = ledger.session(call_id).metadata["verdict"]["explanation"]
                assert all(why in hint for sid, _, hint in hints if sid == call_id)
        first = next(h for sid, i, h in hints if sid == "call-qa-1" and i == 0)
        assert f"The caller's next line will be: {booking[0]!r}." in first

        gated = await asyncio.to_thread(
            run, "gate", "--candidate", trained["adapter"], "--incumbent", "base",
            "--scenarios", str(clinic / "handwritten" / "heldout"), "--bot",
            str(clinic / "bot.py"), "--llm-url", vllm.url, "--persona", "scripted",
            "--mode", "text", "--repeats", "1", "--out", str(tmp_path / "receipt"), code=2,
        )  # fmt: skip
    assert gated["candidate"]["name"] == trained["adapter"] and gated["incumbent"]["name"] == "base"
    assert (gated["candidate"]["guard"], gated["candidate"]["training_sessions"]) == ("passed", 4)
    assert sorted(gated["input"]["scenario_hashes"]) == sorted(heldout)
    assert (gated["paired"]["n_pairs"], gated["repeats"]) == (2, 1)
    # a tiny random model helps no caller: equal runs, no evidence either way
    assert gated["verdict"] == "INCONCLUSIVE" and gated["paired"]["zero_width"]
    with Ledger(path) as ledger:  # the candidate's runs were served by the candidate
        policies = {s.policy for s in ledger.sessions(source="gate")}
    assert policies == {trained["adapter"], "base"}
