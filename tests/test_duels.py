"""Duels: moments of recorded calls, two policies' replies, people's picks in the ledger and at
the service's /duels page (token, raters' own queues), and the CLI's make / export."""

import base64
import json

import httpx
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.duels.make import ServerSampler, find_moments, make_duels
from pipecat_rl.errors import ConfigError, NoTrainingSignalError
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.ledger.duels import DuelReply
from pipecat_rl.service.settings import ServiceSettings
from tests.service_helpers import ServiceThread

TOKEN = "duel-token"


def moment(sid: str, index: int, prompt: list[int]) -> TurnRecord:
    messages = [{"role": "system", "content": "You are the clinic."},
                {"role": "user", "content": f"<b>caller line {index}</b> of {sid}"}]  # fmt: skip
    return TurnRecord(
        session_id=sid, index=index, adapter="base", created_at=101.0 + index,
        request={"messages": messages}, prompt_token_ids=prompt, completion_token_ids=[9],
        logprobs=[-0.1], token_exact=True, usage={"completion_tokens": 1},
    )  # fmt: skip


def call(ledger: Ledger, sid: str, turns: int = 2, **kw) -> None:
    fields = {"source": "simulate", "started_at": 100.0, "ended_at": 160.0, "outcome": "pass"}
    ledger.write_session(
        SessionRecord(id=sid, **{**fields, **kw}),
        [moment(sid, i, [1, 2, 3 + i]) for i in range(turns)],
    )


class LengthSampler:
    """Policy `short` answers in 2 ids, `long` in 6, after the prompt it was given."""

    def __init__(self):
        self.seen: list[tuple[str, tuple[int, ...], int]] = []

    def __call__(self, policy: str, prompt_ids: list[int], seed: int) -> DuelReply:
        self.seen.append((policy, tuple(prompt_ids), seed))
        n = 2 if policy == "short" else 6
        return DuelReply(policy=policy, token_ids=[20 + i for i in range(n)],
                         text=f"{policy} <reply> " * n, logprobs=[-0.5] * n)  # fmt: skip


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


def test_both_policies_answer_the_same_recorded_prompt_with_the_same_seed(ledger):
    for sid in ("c1", "c2"):
        call(ledger, sid)
    sampler = LengthSampler()
    duels = make_duels(ledger, find_moments(ledger, ["c1", "c2"]), ("short", "long"), sampler,
                       n=3, seed=1)  # fmt: skip
    assert len(duels) == 3 and len({(d.session_id, d.turn_index) for d in duels}) == 3
    for d, (a, b) in zip(duels, zip(sampler.seen[::2], sampler.seen[1::2], strict=True),
                         strict=True):  # fmt: skip
        assert (a[0], b[0]) == ("short", "long") and a[1:] == b[1:]  # same ids, same seed
        assert list(a[1]) == d.prompt_token_ids == [1, 2, 3 + d.turn_index]
    assert ledger.duels() == duels  # stored as made, token ids and all
    assert duels[0].context[1]["content"].startswith("<b>caller")


def test_moments_come_from_sessions_or_scenario_files_and_bad_sources_are_named(ledger, tmp_path):
    call(ledger, "c1")
    with pytest.raises(ConfigError, match="'nope': neither a scenario file"):
        find_moments(ledger, ["nope"])
    ledger.write_session(SessionRecord(id="textonly", source="live", started_at=1.0), [])
    with pytest.raises(ConfigError, match="no turn with its prompt ids"):
        find_moments(ledger, ["textonly"])
    with pytest.raises(ConfigError, match="twice"):
        make_duels(ledger, find_moments(ledger, ["c1"]), ("a", "a"), LengthSampler(), n=1)


def test_each_rater_has_their_own_queue_and_a_revote_replaces_their_own(ledger):
    call(ledger, "c1", turns=3)
    duels = make_duels(ledger, find_moments(ledger, ["c1"]), ("short", "long"), LengthSampler(),
                       n=3)  # fmt: skip
    first = ledger.duel_queue("alice")[0]
    ledger.vote(first.id, "alice", "a")
    assert first.id not in [d.id for d in ledger.duel_queue("alice")]
    assert ledger.duel_queue("bob")[0].id == first.id  # bob's queue is his own
    ledger.vote(first.id, "alice", "tie", "hard to say")
    assert [(v.rater, v.choice, v.note) for v in ledger.votes()] == [
        ("alice", "tie", "hard to say")
    ]
    # Left or right by a hash of (duel, rater): over many duels both sides, about half each
    # (fixed ids, so the count is the same every run; this call's 3 random ids could all agree).
    sides = [duels[0].model_copy(update={"id": f"duel-{i}"}).left_for(r)
             for i in range(200) for r in ("alice", "bob")]  # fmt: skip
    assert 160 <= sides.count("a") <= 240
    assert first.left_for("alice") == ledger.duel(first.id).left_for("alice")  # stable


def test_votes_that_train_exclude_ties_both_bad_and_held_out_calls(ledger):
    call(ledger, "pool")
    call(ledger, "held", split="heldout")
    make_duels(ledger, find_moments(ledger, ["pool", "held"]), ("short", "long"),
               LengthSampler(), n=4)  # fmt: skip
    by_session = {}
    for d in ledger.duels():
        by_session.setdefault(d.session_id, []).append(d)
    pool, held = by_session["pool"], by_session["held"]
    ledger.vote(pool[0].id, "alice", "a")
    ledger.vote(pool[0].id, "bob", "tie")
    ledger.vote(pool[1].id, "alice", "both_bad")
    ledger.vote(held[0].id, "alice", "b")
    selection = ledger.trainable_votes()
    assert [(v.duel_id, v.rater) for v in selection.votes] == [(pool[0].id, "alice")]
    assert selection.kept_out == {"tie": 1, "both_bad": 1, "call_not_trainable": 1,
                                  "heldout_overlap": 0}  # fmt: skip
    ledger.vote(pool[0].id, "alice", "tie")
    with pytest.raises(NoTrainingSignalError, match="2 tie, 1 both_bad, 1 call_not_trainable"):
        ledger.trainable_votes().require()


def test_a_duel_whose_call_replays_a_held_out_call_never_trains(ledger):
    call(ledger, "held", split="heldout")
    ledger.write_session(
        SessionRecord(id="copy", source="simulate", started_at=100.0, ended_at=160.0,
                      outcome="pass"),
        [t.model_copy(update={"session_id": "copy"}) for t in ledger.turns("held")],
    )  # fmt: skip
    (duel,) = make_duels(ledger, find_moments(ledger, ["copy"]), ("short", "long"),
                         LengthSampler(), n=1)  # fmt: skip
    ledger.vote(duel.id, "alice", "a")
    assert ledger.trainable_votes().kept_out["heldout_overlap"] == 1


def test_the_cli_exports_every_duel_with_its_votes_as_jsonl(tmp_path, ledger):
    call(ledger, "c1")
    made = make_duels(ledger, find_moments(ledger, ["c1"]), ("short", "long"), LengthSampler(),
                      n=2)  # fmt: skip
    ledger.vote(made[0].id, "alice", "b", "too long")
    out = tmp_path / "duels.jsonl"
    result = CliRunner().invoke(app, ["duels", "export", "--ledger", str(ledger.path), "--out",
                                      str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [d.id for d in made]
    assert rows[0]["prompt_token_ids"] == made[0].prompt_token_ids
    assert rows[0]["reply_a"]["token_ids"] == [20, 21] and len(rows[0]["reply_b"]["token_ids"]) == 6
    assert [(v["rater"], v["choice"], v["note"]) for v in rows[0]["votes"]] == [
        ("alice", "b", "too long")
    ]
    assert rows[1]["votes"] == []


def test_duels_make_refuses_a_policy_the_server_does_not_serve(tmp_path, ledger, monkeypatch):
    call(ledger, "c1")
    monkeypatch.setattr(ServerSampler, "check", lambda self, p: (_ for _ in ()).throw(
        ConfigError("--policies: nope not served by http://x")))  # fmt: skip
    result = CliRunner().invoke(app, ["duels", "make", "--policies", "base", "nope", "--from",
                                      "c1", "--llm-url", "http://127.0.0.1:9", "--ledger",
                                      str(ledger.path)])  # fmt: skip
    assert result.exit_code == 64 and "nope not served" in result.output
    assert ledger.duels() == []


def _voted(ledger: Ledger, sid: str) -> list:
    made = make_duels(ledger, find_moments(ledger, [sid]), ("short", "long"), LengthSampler(),
                      n=2)  # fmt: skip
    ledger.vote(made[0].id, "alice", "a", "shorter")
    ledger.vote(made[0].id, "bob", "tie")
    ledger.vote(made[1].id, "alice", "both_bad")
    return made


def test_ledger_stats_count_duels_and_votes(ledger):
    call(ledger, "c1")
    _voted(ledger, "c1")
    assert {k: ledger.stats()["counts"][k] for k in ("duels", "duel_votes")} == {
        "duels": 2, "duel_votes": 3,
    }  # fmt: skip
    shown = CliRunner().invoke(app, ["ledger", "stats", "--ledger", str(ledger.path), "--json"])
    assert shown.exit_code == 0, shown.output
    counts = json.loads(shown.stdout)["counts"]
    assert (counts["duels"], counts["duel_votes"]) == (2, 3)
    text = CliRunner().invoke(app, ["ledger", "stats", "--ledger", str(ledger.path)]).output
    assert [line.split() for line in text.splitlines() if line.lstrip().startswith("duel")] == [
        ["duels", "2"], ["duel_votes", "3"],
    ]  # fmt: skip


def test_a_ledger_copy_carries_duels_and_votes_but_not_those_of_a_conflicting_call(tmp_path):
    from pipecat_rl.ledger.transfer import copy_ledger

    with Ledger(tmp_path / "from.db") as source, Ledger(tmp_path / "to.db") as dest:
        call(source, "c1")
        call(source, "c2")
        kept = _voted(source, "c1")
        _voted(source, "c2")
        copied = copy_ledger(source, dest)
        assert dest.duels() == source.duels() and dest.votes() == source.votes()
        assert copied.tables["duels"] == {"source": 4, "copied": 4, "present": 0}
        assert copied.tables["duel_votes"] == {"source": 6, "copied": 6, "present": 0}
        again = copy_ledger(source, dest)  # idempotent: all present, nothing doubled
        assert again.tables["duel_votes"] == {"source": 6, "copied": 0, "present": 6}
        # a destination holding c2 with other content keeps its call, and none of c2's duels
        with Ledger(tmp_path / "other.db") as other:
            call(other, "c2", turns=1)
            skipped = copy_ledger(source, other, on_conflict="skip")
            assert skipped.conflicts == ["c2"]
            assert [d.id for d in other.duels()] == [d.id for d in kept]
            assert {v.duel_id for v in other.votes()} == {kept[0].id, kept[1].id}


@pytest.fixture
def service(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        call(store, "c1", turns=3)
        make_duels(store, find_moments(store, ["c1"]), ("short", "long"), LengthSampler(), n=3)
    settings = ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN)
    with ServiceThread(settings) as svc:
        svc.ledger_path = settings.ledger
        yield svc


def basic(rater: str, token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{rater}:{token}".encode()).decode()}


def test_the_page_is_behind_the_token_and_a_stranger_gets_401(service):
    with httpx.Client(base_url=service.url) as stranger:
        refused = stranger.get("/duels")
        assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert stranger.get("/duels", headers=basic("alice", "wrong")).status_code == 401
        assert stranger.post("/duels/x/vote", content="pick=left").status_code == 401


def test_a_pick_posted_by_the_plain_form_lands_in_the_ledger_as_the_reply_shown(service):
    with httpx.Client(base_url=service.url, headers=basic("alice")) as alice:
        page = alice.get("/duels")
        assert page.status_code == 200 and "<script>" in page.text
        assert "&lt;b&gt;caller line" in page.text  # the call's lines, escaped
        assert "3 duel(s) left in your queue" in page.text
        duel_id = page.text.split("action='/duels/")[1].split("/vote'")[0]
        voted = alice.post(f"/duels/{duel_id}/vote", content="pick=left&note=shorter+is+better",
                           headers={"Content-Type": "application/x-www-form-urlencoded"},
                           follow_redirects=False)  # fmt: skip
        assert voted.status_code == 303 and voted.headers["location"] == "/duels?rater=alice"
        assert "2 duel(s) left" in alice.get("/duels").text
        bad = alice.post(f"/duels/{duel_id}/vote", content="pick=sideways")
        assert bad.status_code == 422 and "pick" in bad.text
    with Ledger(service.ledger_path) as ledger:
        (vote,) = ledger.votes()
        duel = ledger.duel(duel_id)
    assert (vote.rater, vote.note, vote.shown_left) == ("alice", "shorter is better",
                                                        duel.left_for("alice"))  # fmt: skip
    assert vote.choice == duel.left_for("alice")  # "left" is the reply alice saw on the left
    # bob, by bearer token and ?rater=, still has the whole queue
    bob = service.client.get("/duels", params={"rater": "bob"})
    assert "3 duel(s) left in your queue" in bob.text
    assert service.client.get("/duels", params={"rater": "Bob Smith"}).status_code == 422
