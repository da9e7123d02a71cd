"""The service stays inside its data directory, and a malformed request is a 4xx, never a 500.

Paths come from the request and from the files it names (a loop file's `out:`, a scenario's
`!include` or world pack): each must resolve inside `--data-dir`, symlinks and `..` resolved,
or nothing is queued. Bodies are read strictly: a key named twice, NaN, a NUL byte are 422s.
"""

import json
from pathlib import Path
from urllib.parse import urlencode

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from pipecat_rl.service.app import create_app
from pipecat_rl.service.jobs import JobWorker
from pipecat_rl.service.settings import ServiceSettings

TOKEN = "confined"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
TEXT = {**AUTH, "Content-Type": "text/plain; charset=latin-1"}
FORM = {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}

SCENARIO = """\
name: {name}
persona: A caller who wants an appointment on Tuesday.
goal: Book a Tuesday slot.
success: The agent booked a Tuesday slot.
"""

PACK_THAT_LEAVES_A_MARK = """\
from pathlib import Path

Path({marker!r}).write_text("imported")
"""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A data directory holding a bot, one scenario folder and a world pack, all inside."""
    root = tmp_path / "data"
    (root / "scenarios").mkdir(parents=True)
    (root / "scenarios" / "tiny.yaml").write_text(SCENARIO.format(name="tiny"))
    (root / "bot.py").write_text("async def run_bot(transport, runner_args):\n    pass\n")
    (root / "world.py").write_text("PACK = None\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the data directory: nothing a request names may reach it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


@pytest.fixture
def client(data, monkeypatch):
    # No worker: a job that got through stays queued, where the test can see it.
    monkeypatch.setattr(JobWorker, "start", lambda self: None)
    monkeypatch.setattr(JobWorker, "stop", lambda self, timeout=5.0: None)
    settings = ServiceSettings(data_dir=data, ledger=data / "ledger.db", token=TOKEN)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def queued(client: TestClient) -> list[dict]:
    r = client.get("/jobs", headers=AUTH)
    assert r.status_code == 200
    return r.json()


def simulate(scenarios: str = "scenarios", **kw) -> dict:
    return {"kind": "simulate", "scenarios": [scenarios], "bot": "bot.py", **kw}


def refused(client: TestClient, body: dict, status: int, *named: str) -> str:
    """Post `body` to /jobs; assert the status, that the answer names each of `named`, and
    that nothing was queued. Returns the answer's text."""
    r = client.post("/jobs", json=body, headers=AUTH)
    assert r.status_code == status, r.text
    for word in named:
        assert word in r.text, (word, r.text)
    assert queued(client) == []
    return r.text


# --- what the request's own paths name ----------------------------------------------------------


def test_inside_paths_are_queued_and_the_checks_refuse_only_what_escapes(client, data):
    folder = data / "scenarios"
    (data / "parts").mkdir()
    (data / "parts" / "facts.yaml").write_text("day: Tuesday\n")
    (folder / "with_include.yaml").write_text(
        SCENARIO.format(name="with-include")
        + "facts: !include ../parts/facts.yaml\nworld:\n  pack: ../world.py\n"
    )
    r = client.post("/jobs", json=simulate(), headers=AUTH)
    assert r.status_code == 202, r.text
    assert len(queued(client)) == 1


def test_a_symlink_inside_the_data_dir_that_points_out_is_refused(client, data, outside):
    (outside / "stolen.yaml").write_text(SCENARIO.format(name="stolen"))
    (outside / "evil.py").write_text("async def run_bot(transport, runner_args):\n    pass\n")
    (data / "scenarios" / "stolen.yaml").symlink_to(outside / "stolen.yaml")
    refused(client, simulate(), 403, "scenarios.0", "stolen.yaml", "outside")
    (data / "scenarios" / "stolen.yaml").unlink()
    (data / "elsewhere").symlink_to(outside, target_is_directory=True)
    refused(client, simulate("elsewhere"), 403, "scenarios.0", "outside")
    refused(client, simulate(bot="elsewhere/evil.py"), 403, "bot", "outside")
    (outside / "receipt.json").write_text("{}")
    (data / "receipts" / "r1").mkdir(parents=True)
    (data / "receipts" / "r1" / "receipt.json").symlink_to(outside / "receipt.json")
    refused(client, {"kind": "promote", "receipt": "receipts/r1"}, 403, "receipt", "outside")
    r = client.post("/live", json={"action": "promote", "receipt": "receipts/r1"}, headers=AUTH)
    assert r.status_code == 403 and "receipt" in r.text
    assert queued(client) == []


def test_a_distill_teacher_is_a_url_or_a_file_inside_the_data_dir(client, data, outside):
    (data / "expert.py").write_text("def policy(messages):\n    return None\n")
    (outside / "evil.py").write_text("def policy(messages):\n    return None\n")
    online = {"kind": "train", "algo": "distill", "scenarios": ["scenarios"], "bot": "bot.py"}
    refused(client, {**online, "teacher": "../outside/evil.py:policy"}, 403, "teacher", "outside")
    refused(client, {**online, "teacher": "nowhere.py:policy"}, 422, "teacher", "no such file")
    refused(client, online, 422, "teacher is for algo distill, which needs one")
    refused(client, {**online, "algo": "grpo", "teacher": "expert.py:policy"}, 422, "teacher")
    refused(client, {"kind": "train", "algo": "rft"}, 422, "algo rft rolls the parent out")
    for teacher in ("expert.py:policy", "http://gpu-box:8000/v1"):
        r = client.post("/jobs", json={**online, "teacher": teacher}, headers=AUTH)
        assert r.status_code == 202, r.text
    kept = [job["params"]["teacher"] for job in queued(client)]
    assert sorted(kept) == sorted([f"{data.resolve() / 'expert.py'}:policy",
                                   "http://gpu-box:8000/v1"])  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("scenarios", "scenarios/\u0000tiny.yaml"), ("bot", "bot.py\u0000:run_bot")],
)
def test_a_nul_byte_in_a_path_is_a_422_naming_the_field(client, field, value):
    body = simulate()
    body[field] = [value] if field == "scenarios" else value
    r = client.post("/jobs", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", field]
    assert "NUL" in r.text
    assert queued(client) == []


@pytest.mark.parametrize(
    "path",
    ["a" * 5000, "/".join(["abcdefgh"] * 600), "scenarios/" + "n" * 256],
    ids=["5000-characters", "over-4096-bytes-in-short-names", "one-name-over-255-bytes"],
)
def test_an_over_long_path_is_a_422_naming_the_field(client, path):
    for body in (simulate(path), {"kind": "cycle", "config": path}):
        r = client.post("/jobs", json=body, headers=AUTH)
        assert r.status_code == 422, r.text
        field = "scenarios" if body["kind"] == "simulate" else "config"
        assert field in json.dumps(r.json()["detail"][0]["loc"])
        assert "limit" in r.text
    r = client.post("/live", json={"action": "promote", "receipt": path}, headers=AUTH)
    assert r.status_code == 422 and "receipt" in r.text
    assert queued(client) == []


def test_a_loop_of_symlinks_is_a_422_not_a_500(client, data):
    (data / "loop-a").symlink_to(data / "loop-b")
    (data / "loop-b").symlink_to(data / "loop-a")
    refused(client, simulate("loop-a"), 422, "scenarios", "loop of symbolic links")


# --- what the files it names name ---------------------------------------------------------------


def loop_file(**paths: str) -> str:
    """A loop.yaml whose every path is inside the data directory, save those in `paths`."""
    values = {"bot": "bot.py", "pool": "scenarios", "heldout": "scenarios", "out": "cycle"}
    values.update(paths)
    return "\n".join(f"{k}: {v}" for k, v in values.items()) + "\n"


@pytest.mark.parametrize(
    ("key", "paths"),
    [
        ("out", {"out": "../outside/cycle"}),
        ("pool", {"pool": "../outside"}),
        ("heldout", {"heldout": "../outside"}),
        ("bot", {"bot": "../outside/evil.py"}),
        ("expert_bot", {"expert_bot": "../outside/evil.py:run_bot"}),
        ("drafts", {"drafts": "../outside/drafts"}),
        ("gate.config", {"gate": "{config: ../outside/gate.yaml}"}),
        ("model", {"model": "/etc"}),
    ],
)
def test_a_path_in_a_loop_file_that_leaves_the_data_dir_is_refused(
    client, data, outside, key, paths
):
    (data / "loop.yaml").write_text(loop_file(**paths))
    named = f"config: loop.yaml: {key}"
    text = refused(client, {"kind": "cycle", "config": "loop.yaml"}, 403, named)
    assert text.count("outside the service's data directory") == 1
    assert list(outside.iterdir()) == []  # nothing was written there


def test_a_cycle_whose_out_leaves_the_data_dir_writes_nothing_there(client, data, outside):
    (data / "loop.yaml").write_text(loop_file(out="../outside/cycle"))
    refused(client, {"kind": "cycle", "config": "loop.yaml"}, 403, "config: loop.yaml: out")
    (data / "cycles").symlink_to(outside, target_is_directory=True)
    (data / "loop.yaml").write_text(loop_file(out="cycles/night-1"))
    refused(client, {"kind": "cycle", "config": "loop.yaml"}, 403, "config: loop.yaml: out")
    assert list(outside.iterdir()) == []
    # The same file with its paths inside is queued: the check refuses only the escape.
    (data / "loop.yaml").write_text(loop_file(out="cycle"))
    r = client.post("/jobs", json={"kind": "cycle", "config": "loop.yaml"}, headers=AUTH)
    assert r.status_code == 202, r.text


def test_a_loop_file_that_is_no_loop_file_is_a_422_naming_it(client, data):
    (data / "loop.yaml").write_text(loop_file(out='"a\\0b"'))
    refused(client, {"kind": "cycle", "config": "loop.yaml"}, 422, "config")
    (data / "loop.yaml").write_text(loop_file(pool="missing"))
    refused(client, {"kind": "cycle", "config": "loop.yaml"}, 422, "config: loop.yaml: pool")


INCLUDES = {
    "plain": "facts: !include {target}\n",
    "quoted": 'facts: !include "{target}"\n',
    "verbatim tag": "facts: !<!include> {target}\n",
    "tag directive": "facts: !x!include {target}\n",
    "in a list": "facts:\n  days: [Monday, !include {target}]\n",
}
"""Spellings of one `!include`: YAML gives the tag the same meaning in each."""


@pytest.mark.parametrize("spelling", INCLUDES)
def test_an_include_that_leaves_the_data_dir_is_refused_however_it_is_spelt(
    client, data, outside, spelling
):
    (outside / "secret.yaml").write_text("day: Tuesday\n")
    text = SCENARIO.format(name="leaky") + INCLUDES[spelling].format(
        target="../../outside/secret.yaml"
    )
    if spelling == "tag directive":
        text = "%TAG !x! !\n---\n" + text
    (data / "scenarios" / "leaky.yaml").write_text(text)
    refused(client, simulate(), 403, "scenarios.0: scenarios/leaky.yaml: !include", "outside")


def test_an_include_of_an_include_that_leaves_is_refused(client, data, outside):
    (outside / "secret.yaml").write_text("day: Tuesday\n")
    (data / "parts").mkdir()
    (data / "parts" / "middle.yaml").write_text("extra: !include ../../outside/secret.yaml\n")
    (data / "scenarios" / "leaky.yaml").write_text(
        SCENARIO.format(name="leaky") + "facts: !include ../parts/middle.yaml\n"
    )
    refused(client, simulate(), 403, "scenarios.0: parts/middle.yaml: !include", "outside")


EVIL_PACK = "../../outside/evil_world.py"
PACK_WAYS = {
    "world.pack": {"evil.yaml": SCENARIO.format(name="evil") + f"world:\n  pack: {EVIL_PACK}\n"},
    "included world": {
        "evil.yaml": SCENARIO.format(name="evil") + "world: !include world.yaml\n",
        "world.yaml": f"pack: {EVIL_PACK}\n",
    },
    "file-level default": {
        "evil.yaml": f"name: evil-set\nworld:\n  pack: {EVIL_PACK}\nscenarios:\n"
        "  - name: one\n    persona: A caller.\n    goal: Book.\n    success: Booked.\n",
    },
}
"""Ways a scenario file inside the data directory can name a world pack outside it."""


@pytest.mark.parametrize("way", PACK_WAYS)
def test_a_world_pack_outside_the_data_dir_is_refused_and_never_imported(
    client, data, outside, way
):
    marker = outside / "imported.txt"
    (outside / "evil_world.py").write_text(PACK_THAT_LEAVES_A_MARK.format(marker=str(marker)))
    folder = "scenarios"
    for name, text in PACK_WAYS[way].items():
        (data / folder / name).write_text(text)
    refused(client, simulate(folder), 403, "scenarios.0", "evil.yaml", "world.pack", "outside")
    for body in (
        {"kind": "gate", "candidate": "v1", "scenarios": folder, "bot": "bot.py"},
        {"kind": "train", "algo": "grpo", "scenarios": [folder], "bot": "bot.py"},
    ):
        refused(client, body, 403, "world.pack")
    (data / "loop.yaml").write_text(loop_file(pool=folder))
    refused(client, {"kind": "cycle", "config": "loop.yaml"}, 403, "loop.yaml: pool", "world.pack")
    assert not marker.exists()  # checking a scenario never runs its pack


def test_a_world_pack_linked_from_inside_to_outside_is_refused(client, data, outside):
    marker = outside / "imported.txt"
    (outside / "evil_world.py").write_text(PACK_THAT_LEAVES_A_MARK.format(marker=str(marker)))
    (data / "world_link.py").symlink_to(outside / "evil_world.py")
    (data / "scenarios" / "linked.yaml").write_text(
        SCENARIO.format(name="linked") + "world:\n  pack: ../world_link.py\n"
    )
    refused(client, simulate(), 403, "linked.yaml: world.pack: '../world_link.py'", "outside")
    assert not marker.exists()


def test_a_recording_outside_the_data_dir_is_refused(client, data, outside):
    import numpy as np
    import soundfile

    soundfile.write(outside / "ask.wav", np.zeros(2400, dtype=np.int16), 24000)
    (data / "scenarios" / "recorded.yaml").write_text(
        "name: recorded\nuser: {modality: audio}\nscenarios:\n  - name: ask\n    turns:\n"
        "      - user: Book a table, please.\n        audio: ../../outside/ask.wav\n"
    )
    refused(client, simulate(), 403, "recorded.yaml: turn 1: audio", "outside")


# --- bodies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "body", "key"),
    [
        ("/jobs", b'{"kind": "promote", "kind": "rollback"}', "kind"),
        ("/jobs", b'{"kind": "rollback", "kind": "rollback"}', "kind"),
        ("/jobs", b'{"kind": "simulate", "scenarios": ["scenarios"], "bot": "bot.py", '
                  b'"bot": "x.py"}', "bot"),
        ("/live", b'{"action": "promote", "action": "rollback"}', "action"),
        ("/sessions/call-1/scores", b'{"metric": "success", "value": 1, "source": "coval", '
                                    b'"value": 0}', "value"),
    ],
)  # fmt: skip
def test_a_key_given_twice_is_a_422_naming_it_and_nothing_is_queued(client, url, body, key):
    r = client.post(url, content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", key]
    assert f"duplicate key {key!r}" in r.text
    assert queued(client) == []


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_a_number_that_is_not_finite_is_a_422(client, number):
    score = f'{{"metric": "success", "value": {number}, "source": "coval"}}'.encode()
    r = client.post("/sessions/call-1/scores", content=score, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "value"]
    assert "not a finite number" in r.text
    for body in (
        f'{{"kind": "train", "algo": "sft", "lr": {number}}}',
        f'{{"kind": "cycle", "config": "loop.yaml", "budget_s": {number}}}',
    ):
        r = client.post("/jobs", content=body.encode(), headers=JSON)
        assert r.status_code == 422, r.text
    assert queued(client) == []


# --- the sweep ------------------------------------------------------------------------------------

BASE_BODIES: dict[str, list[dict]] = {
    "/jobs": [
        simulate(),
        {"kind": "train", "algo": "grpo", "scenarios": ["scenarios"], "bot": "bot.py"},
        {"kind": "gate", "candidate": "v1", "scenarios": "scenarios", "bot": "bot.py",
         "config": "gate.yaml"},
        {"kind": "promote", "receipt": "receipts/r1"},
        {"kind": "rollback"},
        {"kind": "cycle", "config": "loop.yaml", "budget_s": 10, "stop_after": "filter"},
    ],
    "/live": [{"action": "promote", "receipt": "receipts/r1"}, {"action": "rollback"}],
    "/sessions/{call_id}/scores": [
        {"metric": "success", "value": 0.5, "source": "coval", "explanation": "why",
         "external_id": "e1"},
    ],
    "/duels/{duel_id}/vote": [{"pick": "left", "note": "why", "rater": "alice"}],
}  # fmt: skip
"""A body each POST route takes, to spoil one field at a time (a new route must be added)."""

FORM_ROUTES = {"/duels/{duel_id}/vote"}
"""Routes a browser's form posts to: swept urlencoded too."""

HOSTILE_VALUES = [
    "\u0000", "a\u0000b", "\ud800", "a" * 5000, "/".join(["x"] * 3000), "../" * 40,
    "/etc/passwd", "", ".", "loop-a", "n" * 300, "%00", "\\", "~", 1e308, -1, 0,
    10**30, -(10**30), True, None, [], {}, ["\u0000"], [[[]]], {"a": "\ud800"},
]  # fmt: skip

RAW_BODIES = [
    b"", b"null", b"[]", b'"x"', b"1", b"NaN", b"{", b"\xff\xfe\x00", b"[" * 5000 + b"]" * 5000,
    b'{"kind": "' + b"\xed\xa0\x80" + b'"}', b'{"a": ' + b"9" * 5000 + b"}",
    b'{"kind": "simulate", "kind": "simulate"}', b'{"\\u0000": 1}', b'{"value": -Infinity}',
]  # fmt: skip


def _post_routes(client: TestClient) -> list[str]:
    return sorted(
        r.path for r in client.app.routes if isinstance(r, APIRoute) and "POST" in r.methods
    )


def _dumps(body: object) -> bytes:
    return json.dumps(body).encode()  # NaN and lone surrogates are written as JSON permits


def _form(body: dict) -> bytes:
    """`body` urlencoded as a browser's form posts it (lone surrogates kept as bytes)."""
    return urlencode(body, errors="surrogatepass").encode()


def test_no_hostile_body_on_any_post_route_is_a_500(client, data):
    (data / "loop.yaml").write_text(loop_file())
    (data / "gate.yaml").write_text("alpha: 0.05\n")
    (data / "receipts" / "r1").mkdir(parents=True)
    (data / "loop-a").symlink_to(data / "loop-b")
    (data / "loop-b").symlink_to(data / "loop-a")
    routes = _post_routes(client)
    assert set(routes) == set(BASE_BODIES), "a new POST route needs a base body in the sweep"
    sent = 0
    for route in routes:
        url = route.replace("{call_id}", "call-1").replace("{duel_id}", "duel-1")
        encode = _form if route in FORM_ROUTES else _dumps
        bodies = [_dumps(b) for b in BASE_BODIES[route]] + RAW_BODIES
        for base in BASE_BODIES[route]:
            for key in base:
                for value in HOSTILE_VALUES:
                    bodies.append(_dumps({**base, key: value}))
                    bodies.append(encode({**base, key: value}))
                bodies.append(_dumps(base).replace(b"}", f', "{key}": 1}}'.encode(), 1))
            bodies.append(_dumps({**base, "extra": float("nan")}))
        for body in bodies:
            for headers in (JSON, AUTH, TEXT, FORM):  # JSON, none, another one, a form's
                r = client.post(url, content=body, headers=headers)
                assert r.status_code < 500, (route, body[:200], r.status_code, r.text[:300])
                sent += 1
    for call_id in ("a%00b", "x" * 300, "..%2F..", "%ED%A0%80", "%FF"):
        r = client.post(f"/sessions/{call_id}/scores", content=_dumps(BASE_BODIES[
            "/sessions/{call_id}/scores"][0]), headers=JSON)  # fmt: skip
        assert r.status_code < 500, (call_id, r.text)
    assert sent > 500
    assert all(j["state"] == "queued" for j in queued(client))  # nothing ran, nothing broke
