"""Held-out by meaning, twice: identity catches respellings, decontamination catches the rest.

Each kind of respelling a person (or a generator) makes of a held-out scenario is planted as a
pool scenario of a copy of the clinic: its hash is the held-out one, loading it beside the
held-out set is refused, and its recorded call is held out, so no turn of it reaches SFT's
rows. Where identity is bypassed on purpose (a session written under another scenario hash with
the held-out call's caller lines), decontamination removes it and counts it; a legitimately
different pool call that shares phrases stays.
"""

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.scenarios import identity
from pipecat_rl.scenarios.decontaminate import NGRAM, CallText, HeldoutIndex, contaminated
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
EXPERT = str(CLINIC / "expert.py")
SCRIPTED = SimulationConfig(persona="scripted", concurrency=4)
NAME = "heldout_routine_booking"
OTHER_HELDOUT = ("heldout_hesitant_booking", "heldout_misheard_name")
"""More held-out scenarios beside it: what several held-out calls share is common, not telling."""

BASE = """\
name: heldout_routine_booking
persona: Tom Baker, a retired teacher, courteous and unhurried.
goal: Book a routine cleaning at the first free time, get the confirmation number, then hang up.
success: The receptionist found Tom's record, booked the first free routine slot and read back \
the confirmation number.
max_turns: 8
facts: {name: Tom Baker, date_of_birth: "1961-01-20"}
world: !include ../world.yaml
verify:
  - exists: {table: appointments, where: {patient_id: 4, slot_id: 11, status: booked}}
  - unchanged: [patients]
script:
  rules:
    - {when: "full name|your name", say: "Tom Baker."}
    - {when: "book it", say: "Yes, that suits me."}
    - {when: "confirmation number is", say: "Splendid. Goodbye.", end_call: true}
    - {when: "help", say: "Good morning, I'd like to book a cleaning appointment.", times: 1}
"""
"""The clinic's routine held-out booking, its caller scripted by patterns (`when:`)."""


@pytest.fixture
def clinic(tmp_path) -> Path:
    """A copy of the clinic's world with three held-out scenarios: clinic/handwritten/heldout/."""
    root = tmp_path / "clinic"
    held = root / "handwritten" / "heldout"
    held.mkdir(parents=True)
    shutil.copy(CLINIC / "world.py", root / "world.py")
    shutil.copy(CLINIC / "handwritten" / "world.yaml", root / "handwritten" / "world.yaml")
    shutil.copy(CLINIC / "intents.yaml", root / "intents.yaml")  # the pack's shared intents
    (held / f"{NAME}.yaml").write_text(BASE)
    for name in OTHER_HELDOUT:
        shutil.copy(CLINIC / "handwritten" / "heldout" / f"{name}.yaml", held / f"{name}.yaml")
    return root


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


# -- the respellings -------------------------------------------------------------------------


def _unicode_forms(clinic: Path, text: str) -> str:
    """NFKC: full-width letters and a ligature."""
    text = _sub(text, "persona: Tom Baker,", "persona: \uff34\uff4f\uff4d Baker,")
    return _sub(text, "at the first free", "at the \ufb01rst free")


def _invisible_characters(clinic: Path, text: str) -> str:
    """A zero-width space, a non-breaking space and a BOM in the persona and the goal."""
    text = _sub(
        text,
        "persona: Tom Baker, a retired teacher, courteous and unhurried.",
        'persona: "Tom Baker, a re\\u200btired\\u00a0teacher, courteous and unhurried.\\ufeff"',
    )
    return _sub(
        text,
        "goal: Book a routine cleaning at the first free time, get the confirmation number, then "
        "hang up.",
        'goal: "\\ufeffBook a\\u2060 routine cleaning at the first free time, get the '
        'confirmation\\u200b number, then hang up."',
    )


def _pack_reformatted(clinic: Path, text: str) -> str:
    """The same pack code with comments, blank lines, another docstring and CRLF endings."""
    code = (clinic / "world.py").read_text()
    code = code.replace("\ndef ", "\n# a comment between functions\n\n\ndef ")
    code = code.replace('"""Cancel an appointment', '"""Cancels an appointment')
    (clinic / "world_reformatted.py").write_bytes(code.replace("\n", "\r\n").encode())
    world = (clinic / "handwritten" / "world.yaml").read_text()
    world = _sub(world, "pack: ../../world.py", "pack: ../../world_reformatted.py")
    (clinic / "handwritten" / "world_reformatted.yaml").write_text(world)
    return _sub(text, "../world.yaml", "../world_reformatted.yaml")


def _pattern_case_and_order(clinic: Path, text: str) -> str:
    """A pattern in other letter case, its alternatives reordered and one repeated."""
    text = _sub(text, '"full name|your name"', '"YOUR Name|Full Name|your name"')
    return _sub(text, '"book it"', '"(?i)Book It"')


def _verify_equivalent(clinic: Path, text: str) -> str:
    """Values as strings, `exists` as `count` min 1, a repeated check, `unchanged` as a string."""
    return _sub(
        text,
        "  - exists: {table: appointments, where: {patient_id: 4, slot_id: 11, status: booked}}\n"
        "  - unchanged: [patients]\n",
        "  - unchanged: patients\n"
        '  - count: {table: appointments, min: 1, where: {patient_id: "4", slot_id: "11",'
        " status: booked}}\n"
        "  - exists: {table: appointments, where: {status: booked, slot_id: 11, patient_id: 4}}\n"
        "  - unchanged: [patients, patients]\n",
    )


def _state_defaults_inline(clinic: Path, text: str) -> str:
    """The world inline, not included: rows reversed, ids as text, schema defaults written out."""
    world = yaml.safe_load((clinic / "handwritten" / "world.yaml").read_text())
    for row in world["state"]["slots"]:
        row["free"] = 1  # the schema's DEFAULT 1
        row["id"] = str(row["id"])
    for row in world["state"]["appointments"]:
        row["status"] = "booked"  # the schema's DEFAULT 'booked'
    world["state"] = {t: list(reversed(rows)) for t, rows in world["state"].items()}
    world["state"]["handoffs"] = []  # an empty table listed
    inline = yaml.safe_dump({"world": world}, sort_keys=False, default_flow_style=False)
    return _sub(text, "world: !include ../world.yaml\n", inline)


def _options_that_change_nothing(clinic: Path, text: str) -> str:
    """Explicit defaults, a `times` an ending rule never reaches, a rule that can never fire."""
    text = _sub(text, 'say: "Tom Baker."}', 'say: "Tom Baker.", end_call: false}')
    text = _sub(text, "end_call: true}", "end_call: true, times: 3}")
    text = _sub(
        text,
        '    - {when: "help"',
        '    - {when: "BOOK IT", say: "never said: the rule above always answers first"}\n'
        '    - {when: "help"',
    )
    return text + "max_silence_s: 30\nchannel: {mode: text, asr_noise: {digits: 0.0}}\n"


def _yaml_style(clinic: Path, text: str) -> str:
    """Keys reordered, block instead of flow style, trailing spaces, a tab and comments."""
    text = _sub(
        text,
        'facts: {name: Tom Baker, date_of_birth: "1961-01-20"}\n',
        '# who the caller is   \nfacts:   \n  date_of_birth: "1961-01-20"   \n  name: Tom Baker\n',
    )
    text = _sub(text, "persona: Tom Baker, a retired", 'persona: "Tom\\tBaker,  a retired')
    text = _sub(text, "courteous and unhurried.\n", 'courteous and unhurried.  "\n')
    head, _, script = text.partition("script:\n")
    return "script:\n" + script + head.replace("max_turns: 8\n", "") + "max_turns: 8\n"


VARIANTS = [
    _unicode_forms,
    _invisible_characters,
    _pack_reformatted,
    _pattern_case_and_order,
    _verify_equivalent,
    _state_defaults_inline,
    _options_that_change_nothing,
    _yaml_style,
]


def plant(clinic: Path, variant) -> Path:
    """`variant` of the held-out scenario, renamed, written as a pool scenario."""
    text = variant(clinic, BASE).replace(f"name: {NAME}", f"name: {variant.__name__[1:]}")
    path = clinic / "handwritten" / "pool" / f"{variant.__name__[1:]}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _held(clinic: Path):
    return next(s for s in load_scenarios([clinic / "handwritten" / "heldout"]) if s.id == NAME)


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.__name__[1:] for v in VARIANTS])
def test_a_respelled_heldout_scenario_has_its_hash_and_is_refused_beside_it(clinic, variant):
    held = _held(clinic)
    path = plant(clinic, variant)
    assert path.read_text() != BASE
    (copy,) = load_scenarios([path]).scenarios
    assert copy.split == "pool" and copy.id != held.id
    assert copy.content_hash() == held.content_hash(), variant.__doc__
    with pytest.raises(ScenarioError, match="has the content of the held-out scenario"):
        load_scenarios([clinic / "handwritten"])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("slot_id: 11", "slot_id: 12"),  # another check
        ('"book it"', '"book it|another"'),  # a pattern that matches more
        ('"full name|your name"', r'"full name|your \\w+"'),  # an escape is not a letter
        ("times: 1}", "times: 2}"),  # a limit that can bind
        ("max_turns: 8", "max_turns: 9"),
    ],
)
def test_a_change_of_meaning_changes_the_hash(clinic, old, new):
    held = _held(clinic)
    path = clinic / "handwritten" / "pool" / "changed.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(_sub(BASE, old, new).replace(f"name: {NAME}", "name: changed"))
    (changed,) = load_scenarios([path]).scenarios
    assert changed.content_hash() != held.content_hash()


def test_the_pack_is_its_code(tmp_path):
    code = (
        b'"""A pack."""\nSCHEMA = "CREATE TABLE t (id INTEGER PRIMARY KEY)"\n\n'
        b"def f(db):\n    return 1\n"
    )
    same = code.replace(b"\n", b"\r\n").replace(b"return 1", b"return 1  # one") + b"\n\n"
    assert identity.pack_form(same) == identity.pack_form(code)
    assert identity.pack_form(code.replace(b"A pack", b"The pack")) == identity.pack_form(code)
    assert identity.pack_form(code.replace(b"return 1", b"return 2")) != identity.pack_form(code)
    reads_doc = code + b"HELP = f.__doc__\n"
    assert identity.pack_form(reads_doc.replace(b"A pack", b"The pack")) != identity.pack_form(
        reads_doc
    )  # a pack that reads its docstrings: they are behaviour


def test_patterns_normalise_only_what_the_matcher_ignores():
    form = identity.pattern_form
    assert form("Your Name|FULL NAME") == form("full name|your name") == "full name|your name"
    assert form("(?i)a(?#note)(b|A)") == "a(a|b)"
    assert form(r"\D+") != form(r"\d+")  # escapes keep their case
    assert form("[A-z]") == "[A-z]"  # a range across cases is kept as written
    assert form(r"(a)x|(b)\1") == r"(a)x|(b)\1"  # backreferences: order can matter
    assert form("") == form(".*") == form("^") == ".*"


def test_near_duplicates_are_refused_and_a_different_scenario_is_not(clinic):
    near = _sub(BASE, "a retired teacher", "a retired builder").replace(
        f"name: {NAME}", "name: near"
    )
    pool = clinic / "handwritten" / "pool"
    pool.mkdir(parents=True)
    (pool / "near.yaml").write_text(near)
    with pytest.raises(ScenarioError, match="near-duplicate of the held-out scenario") as e:
        load_scenarios([clinic / "handwritten"])
    assert "near.yaml" in str(e.value) and f"{NAME}.yaml" in str(e.value)
    (pool / "near.yaml").unlink()
    shutil.copy(CLINIC / "handwritten" / "pool" / "routine_booking.yaml", pool / "routine.yaml")
    assert len(load_scenarios([clinic / "handwritten"])) == 4  # the same world, another test


# -- recorded: none of it trains ---------------------------------------------------------------


def _pool_call(ledger: Ledger, sid: str, turns: list[TurnRecord], scenario_hash: str) -> None:
    """A finished, passing pool session with `turns` (as if recorded under `scenario_hash`)."""
    ledger.write_session(
        SessionRecord(
            id=sid, source="simulate", started_at=9e9, ended_at=9e9 + 1, split="pool",
            scenario_id=sid, scenario_hash=scenario_hash, outcome="pass",
            reward_parts={"verifier": 1.0},
        ),
        [t.model_copy(update={"session_id": sid}) for t in turns],
    )  # fmt: skip


async def test_recorded_respellings_never_reach_sft_and_a_bypass_is_decontaminated(
    clinic, tmp_path
):
    ledger = Ledger(tmp_path / "ledger.db")
    bot = load_bot(EXPERT)
    held_set = load_scenarios([clinic / "handwritten" / "heldout"])
    held = await simulate(held_set, bot, SCRIPTED, ledger)
    held_sid = next(e.session_id for e in held.episodes if e.scenario_id == NAME)
    assert ledger.turns(held_sid)
    for variant in VARIANTS:
        plant(clinic, variant)
    shutil.copy(
        CLINIC / "handwritten" / "pool" / "routine_booking.yaml",
        clinic / "handwritten" / "pool" / "routine_booking.yaml",
    )  # a legitimately different pool scenario: the same world, its own caller
    pool_set = load_scenarios([clinic / "handwritten" / "pool"])
    report = await simulate(pool_set, bot, SCRIPTED, ledger)
    by_id = {e.scenario_id: e for e in report.episodes}
    assert len(by_id) == len(VARIANTS) + 1
    for variant in VARIANTS:
        episode = by_id[variant.__name__[1:]]
        assert episode.error is None, episode.error
        assert ledger.turns(episode.session_id)  # recorded, token for token ...
        assert ledger.session(episode.session_id).split == "heldout"  # ... and held out
    legit = by_id["routine_booking"].session_id
    sft = ledger.training_selection(purpose="sft")
    assert {t.session_id for t in sft.turns} == {legit}  # 0 held-out rows; the legit call stays
    assert sft.removed == 0  # identity did it all

    # identity bypassed: the held-out call's turns under another scenario's hash
    _pool_call(ledger, "bypass", ledger.turns(held_sid), "s9-0000000000000000")
    sft = ledger.training_selection(purpose="sft")
    assert set(sft.heldout_overlap) == {"bypass"} and sft.removed == 1
    twin = ledger.session(sft.heldout_overlap["bypass"].heldout_id)  # the call or a respelling
    assert twin.scenario_hash == ledger.session(held_sid).scenario_hash
    assert {t.session_id for t in sft.turns} == {legit}
    assert ledger.training_turns(purpose="sft") == sft.turns
    ledger.close()


# -- decontamination itself ------------------------------------------------------------------


HELD_CALLS = [
    CallText("h1", ("(The phone rings.)", "Good morning, I'd like to book a cleaning appointment.",
                    "Tom Baker.", "Yes, that suits me.", "Splendid. Goodbye."), scenario="A"),
    CallText("h2", ("(The phone rings.)", "Hi, I need to cancel an appointment.",
                    "DX 48213 77065.", "Thanks, goodbye."), scenario="B"),
    CallText("h3", ("(The phone rings.)", "My face is swollen and it's really painful, it's an "
                    "emergency.", "Siobhan Ni Bhriain.", "Yes, please.", "Thanks, goodbye."),
             scenario="C"),
]  # fmt: skip


def test_a_copy_is_contaminated_however_spelled_or_padded():
    spelled = CallText("c1", ("(THE PHONE RINGS)", "good  morning - I\u2019d like to book a "
                              "cleaning appointment!", "tom baker", "yes that suits me",
                              "splendid, goodbye"))  # fmt: skip
    padded = CallText("c2", HELD_CALLS[0].caller_lines + (
        "Oh, and one more thing about parking: is there a car park near the clinic?",
        "And do you take cards?", "Lovely, thanks again for your help today.",
    ))  # fmt: skip
    found = contaminated([spelled, padded], HELD_CALLS)
    assert set(found) == {"c1", "c2"} and {o.heldout_id for o in found.values()} == {"h1"}


def test_a_different_call_sharing_phrases_is_not_contaminated():
    sharing = CallText("d1", (
        "(The phone rings.)",  # the bot's own line, in every held-out call: common
        "Hi, I'd like to book a cleaning appointment for my daughter, she is seven.",
        "Maria Lopez.", "Is the dentist good with children? She is nervous.",
        "Thanks, goodbye.",  # in two held-out calls: common
    ))  # fmt: skip
    short = CallText("d2", ("Tom Baker.", "Yes, that suits me."))  # too little to tell
    half = CallText("d3", sharing.caller_lines + ("Yes, that suits me.",))
    assert contaminated([sharing, short, half], HELD_CALLS) == {}
    index = HeldoutIndex(HELD_CALLS)
    assert index.best(sharing).share == pytest.approx(1 / 3, abs=1e-3)  # 1 of its 3 telling lines
    assert index.best(half).share == 0.5  # half is not most: it stays


def test_the_goal_counts_where_both_calls_have_one():
    goal = "Book a routine cleaning at the first free time, get the confirmation number."
    held = [CallText("h", ("(The phone rings.)", "Tom Baker."), goal=goal, scenario="A")]
    same_goal = CallText("g", ("Hello.", "Tom Baker."), goal=goal)
    assert contaminated([same_goal], held) != {}
    assert contaminated([CallText("g", ("Hello.", "Tom Baker."))], held) == {}
    assert NGRAM == 8


def test_every_training_path_reports_what_it_removed(tmp_path):
    from pipecat_rl.training.config import TrainConfig
    from pipecat_rl.training.trainer import HELDOUT_OVERLAP, _step_rows, rl_rows, sft_rows

    lines = HELD_CALLS[0].caller_lines

    def turns(sid: str, said: tuple[str, ...]) -> list[TurnRecord]:
        messages = [{"role": "user", "content": line} for line in said]
        return [TurnRecord(
            session_id=sid, index=0, adapter="base", created_at=1.0,
            request={"model": "base", "messages": messages}, prompt_token_ids=[1, 2],
            completion_token_ids=[3], logprobs=[-0.1], token_exact=True,
            usage={"completion_tokens": 1},
        )]  # fmt: skip

    with Ledger(tmp_path / "l.db") as ledger:
        ledger.write_session(
            SessionRecord(id="held", source="gate", started_at=1.0, ended_at=2.0,
                          split="heldout", scenario_hash="s2-held", heldout_set_id="heldout-x"),
            turns("held", lines),
        )  # fmt: skip
        _pool_call(ledger, "copy", turns("copy", lines), "s2-other")
        _pool_call(ledger, "legit", turns("legit", HELD_CALLS[1].caller_lines), "s2-legit")
        config = TrainConfig(algo="grpo")
        fresh, _, _, removed = rl_rows(ledger, {"base"}, None, config)
        assert {t.session_id for t in fresh} == {"legit"} and removed == 1
        *_, sampling = _step_rows(ledger, None, None, "base", config, 1, {"base"})
        assert sampling[HELDOUT_OVERLAP] == 1
        ledger.update_session("legit", reward_parts={})  # not passed: SFT renders no row
        _, _, info = sft_rows(ledger, SimpleNamespace(tokenizer=None), TrainConfig(algo="sft"))
        assert info[HELDOUT_OVERLAP] == 1 and info["eligible_sessions"] == 1


# -- the clinic, as users run it ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.shares_machine
def test_on_the_clinic_no_legitimate_pool_call_is_removed(tmp_path):
    """Every clinic scenario recorded once with the scripted expert: the share of legitimate
    pool calls decontamination removes is 0, and most held-out calls copied are recognised."""
    scenarios = CLINIC / "handwritten"
    with Ledger(tmp_path / "l.db") as ledger:
        for folder in ("heldout", "pool"):
            asyncio.run(simulate(load_scenarios([scenarios / folder]), load_bot(EXPERT),
                                 SCRIPTED, ledger))  # fmt: skip
        pool = [s for s in ledger.sessions() if s.split == "pool"]
        held = [s for s in ledger.sessions() if s.split == "heldout"]
        assert len(pool) == len(list((scenarios / "pool").glob("*.yaml")))
        selection = ledger.training_selection(purpose="sft")
        assert selection.removed == 0  # the share of legitimate pool calls dropped: 0
        assert {t.session_id for t in selection.turns} == {s.id for s in pool}
        for s in held:  # each held-out call, replayed under another scenario
            _pool_call(ledger, f"copy-{s.id}", ledger.turns(s.id), "s9-copy")
        removed = ledger.training_selection(purpose="sft").removed
        assert removed >= 0.75 * len(held), f"{removed} of {len(held)} copies recognised"
