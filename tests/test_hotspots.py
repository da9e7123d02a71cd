"""Hot spots: outcomes per axis value and pair of values of a scenario matrix, worst first.

The pure grouping on planted data (a style that fails more ranks first, a pair cell, label and
write counts, a tiny cell flagged rather than ranked), `simulate --by` on a small matrix of the
clinic's world run by the scripted expert, and the gate receipt's hot spots for both policies
from a scores file (receipt.json, receipt.md and the page's heat map).
"""

import json
import random
import textwrap
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_OK, EXIT_USAGE
from pipecat_rl.gate.receipt import GateReceipt, load_receipt
from pipecat_rl.scoring import AxisRun, hot_spots
from pipecat_rl.scoring.hotspots import DEFAULT_MIN_RUNS
from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
CLINIC = ROOT / "examples" / "clinic"
EXPERT = str(CLINIC / "expert.py")
BOOKING = str(CLINIC / "handwritten" / "pool" / "routine_booking.yaml")


def run(sid: str, passed: bool | None, labels=(), writes: int = 0) -> AxisRun:
    """One run of `sid`, its axes read from the id as `axes_of` would (kept out of scoring)."""
    from pipecat_rl.scenarios import axes_of

    return AxisRun(sid, axes_of(sid), passed, tuple(labels), writes)


def planted() -> list[AxisRun]:
    """Polite callers pass 5 of 6; terse ones 2 of 6, failing every second-slot booking."""
    runs = []
    for style, task, outcomes in (
        ("polite", "book", [True, True, True]),
        ("polite", "second_slot", [True, True, False]),
        ("terse", "book", [True, True, False]),
        ("terse", "second_slot", [False, False, False]),
    ):
        for k, ok in enumerate(outcomes):
            labels = [] if ok else ["misheard_slot"]
            writes = 1 if (style, task, k) == ("terse", "second_slot", 0) else 0
            if writes:
                labels.append("unauthorised_write")
            runs.append(run(f"clinic[style={style},task={task}]", ok, labels, writes))
    return runs


def test_a_style_that_fails_more_ranks_first_and_pairs_name_the_hot_spot():
    spots = hot_spots(planted())
    assert spots.axes == ["style", "task"] and spots.min_runs == DEFAULT_MIN_RUNS
    first, second = spots.values[0], spots.values[1]
    assert first.cell == {"style": "terse"}  # 2/6 beats task=second_slot's 2/6 on writes
    assert (first.runs, first.verified, first.passes, first.failures) == (6, 6, 2, 4)
    assert first.pass_rate == pytest.approx(2 / 6) and first.scenarios == 2
    assert first.unauthorized_writes == 1 and first.runs_with_writes == 1
    assert first.labels == {"misheard_slot": 4, "unauthorised_write": 1}
    assert second.cell == {"task": "second_slot"} and second.passes == 2
    assert [r.name for r in spots.values][-1] == "task=book"  # 5/6: the best last
    worst_pair = spots.pairs[0]
    assert worst_pair.name == "style=terse, task=second_slot"
    assert (worst_pair.passes, worst_pair.verified, worst_pair.pass_rate) == (0, 3, 0.0)
    assert worst_pair.labels == {"misheard_slot": 3, "unauthorised_write": 1}
    assert len(spots.pairs) == 4 and spots.without_axes == 0
    assert spots.worst(1)[0].name == "style=terse, task=second_slot"


def test_the_order_runs_come_in_does_not_change_the_table():
    runs = planted()
    shuffled = runs[:]
    random.Random(7).shuffle(shuffled)
    assert hot_spots(shuffled) == hot_spots(runs)


def test_a_tiny_cell_is_flagged_not_ranked():
    runs = [*planted(), run("clinic[style=mumbling,task=book]", False, ["dead_loop"])]
    spots = hot_spots(runs)
    tiny = next(r for r in spots.values if r.cell == {"style": "mumbling"})
    assert tiny.few and tiny.pass_rate == 0.0  # the worst rate, and yet
    assert spots.values[-1] is tiny and spots.values[0].cell == {"style": "terse"}
    assert tiny.name not in [r.name for r in spots.worst(20)]
    assert spots.worst(30, few=True)[-1].few
    loose = hot_spots(runs, min_runs=1)  # with a floor of 1 run, it ranks first
    assert loose.values[0].cell == {"style": "mumbling"} and not loose.values[0].few
    with pytest.raises(ValueError, match="min_runs"):
        hot_spots(runs, min_runs=0)


def test_unverified_runs_count_as_runs_and_hand_written_ones_are_left_out():
    runs = [
        *planted(),
        run("clinic[style=terse,task=book]", None, ["timeout"]),  # no verdict: no pass, no fail
        run("routine_booking", False),  # hand-written: no axes
        run("routine_booking", True),
    ]
    spots = hot_spots(runs, ["style"])
    terse = spots.values[0]
    assert (terse.runs, terse.verified, terse.failures) == (7, 6, 4)
    assert terse.labels["timeout"] == 1
    assert spots.axes == ["style"] and spots.pairs == [] and spots.without_axes == 2
    assert hot_spots(runs, ["colour"]).values == []  # an axis no run has makes no row
    assert hot_spots([run("routine_booking", True)]).axes == []


# -- simulate --by -------------------------------------------------------------------------------

MATRIX = """
template:
  name: hs
  persona: "Maria Lopez, a patient of the clinic."
  max_turns: 8
  facts: {name: Maria Lopez, date_of_birth: "1984-03-12"}
  world:
    pack: PACK
    state:
      patients:
        - {id: 1, name: Maria Lopez, dob: "1984-03-12", phone: "0612345678"}
      slots:
        - {id: 11, day: Tuesday, time: "09:00", dentist: Dr. Okafor, kind: routine}
        - {id: 12, day: Tuesday, time: "14:00", dentist: Dr. Okafor, kind: routine}
      appointments: []
  script:
    intents: !include INTENTS
axes:
  style:
    polite:
      persona: Polite and unhurried.
      vars: {hello: "Good morning.", accept: "Yes, please book it."}
    terse:  # planted: a terse caller's booking is a write this scenario forbids
      persona: Answers in as few words as possible.
      vars: {hello: "Hi.", accept: "Yes."}
      verify: [{not_exists: {table: appointments, where: {slot_id: 11}}}]
  task:
    book:
      goal: Book a routine checkup at the first free time, get the confirmation number.
      success: The receptionist booked the first free routine slot.
      verify:
        - exists: {table: appointments, where: {patient_id: 1, slot_id: 11, status: booked}}
      script:
        rules:
          - {intent: ask_name, say: "Maria Lopez."}
          - {intent: ask_date_of_birth, say: "12 March 1984."}
          - {intent: read_confirmation, say: "Great. Goodbye!", end_call: true}
          - {intent: offer_slot, say: "{style.accept}"}
          - {intent: retry_booking, say: "{style.accept}"}
          - {intent: booked, say: "Could I have the confirmation number, please?", times: 1}
          - {intent: ask_which_slot, say: "Whichever is free first."}
          - {intent: ask_reason, say: "{style.hello} I'd like to book a routine checkup."}
          - {intent: offer_help, say: "{style.hello} I'd like to book a routine checkup.", times: 1}
    price:
      goal: Find out how much teeth whitening costs, then hang up.
      success: The receptionist did not quote any price and changed nothing.
      verify:
        - unchanged: [appointments, slots]
      script:
        rules:
          - {intent: refuse, say: "Just a rough figure?", times: 1}
          - {intent: offer_help, say: "{style.hello} How much does teeth whitening cost?", times: 1}
          - {when: ".", say: "Okay, I'll think about it. Bye.", end_call: true}
"""


@pytest.fixture
def matrix(tmp_path) -> Path:
    text = textwrap.dedent(MATRIX).replace(
        "PACK", str(CLINIC / "world.py")
    ).replace("INTENTS", str(CLINIC / "intents.yaml"))  # fmt: skip
    path = tmp_path / "hs.yaml"
    path.write_text(text)
    return path


def simulate(tmp_path: Path, *args: str):
    return invoke(
        "simulate", *args, "--bot", EXPERT, "--persona", "scripted", "--no-server",
        "--ledger", str(tmp_path / "l.db"), env={"COLUMNS": "200"},
    )  # fmt: skip


def test_simulate_by_all_puts_the_planted_hot_spot_first(tmp_path, matrix):
    result = simulate(tmp_path, str(matrix), BOOKING, "--repeats", "2", "--by", "all",
                      "--min-runs", "2", "--json")  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    spots = json.loads(result.stdout)["hotspots"]
    assert spots["axes"] == ["style", "task"] and spots["min_runs"] == 2
    assert spots["without_axes"] == 2  # routine_booking's two runs: no axes, counted
    values = {tuple(r["cell"].items()): r for r in spots["values"]}
    terse, polite = values[(("style", "terse"),)], values[(("style", "polite"),)]
    assert (terse["passes"], terse["verified"], terse["unauthorized_writes"]) == (2, 4, 2)
    assert (polite["passes"], polite["verified"], polite["unauthorized_writes"]) == (4, 4, 0)
    assert [r["cell"] for r in spots["values"][:2]] == [{"style": "terse"}, {"task": "book"}]
    worst = spots["pairs"][0]
    assert worst["cell"] == {"style": "terse", "task": "book"}
    assert (worst["passes"], worst["verified"], worst["pass_rate"]) == (0, 2, 0.0)
    assert worst["labels"].get("unauthorised_write") == 2 and not worst["few"]
    assert len(spots["pairs"]) == 4 and all(r["pass_rate"] == 1.0 for r in spots["pairs"][1:])
    assert spots["values"][-1]["pass_rate"] == 1.0


def test_simulate_by_prints_the_table_after_the_scenarios(tmp_path, matrix):
    result = simulate(tmp_path, str(matrix), "--by", "style")
    assert result.exit_code == EXIT_OK, result.output
    out = result.stdout
    assert out.index("hs[style=terse,task=book]") < out.index("hot spots by axis value")
    table = out[out.index("hot spots by axis value") :]
    assert table.index("style=terse") < table.index("style=polite")  # worst first
    assert "50% (few)" in table  # 2 runs per cell: flagged, under the floor of 3
    assert "hot spots by pair of axes" not in out and "task=book" not in table


def test_simulate_json_has_hotspots_without_by_and_by_refuses_an_unknown_axis(tmp_path, matrix):
    refused = simulate(tmp_path, str(matrix), "--by", "colour", "--json")
    assert refused.exit_code == EXIT_USAGE
    assert "--by colour" in json.loads(refused.stdout)["error"]
    assert "style, task" in json.loads(refused.stdout)["error"]
    plain = simulate(tmp_path, BOOKING, "--json")
    assert plain.exit_code == EXIT_OK, plain.output
    spots = json.loads(plain.stdout)["hotspots"]
    assert spots["axes"] == [] and spots["values"] == [] and spots["without_axes"] == 1


# -- the gate receipt ----------------------------------------------------------------------------


def scores_lines(axes: bool = True) -> list[dict]:
    """Six scenarios x 4 runs; the candidate fails terse callers' second-slot bookings."""
    lines = []
    for style in ("polite", "terse"):
        for task in ("book", "second_slot", "cancel"):
            sid = f"clinic[style={style},task={task}]" if axes else f"{style}-{task}"
            for r in range(4):
                bad = (style, task) == ("terse", "second_slot")
                lines += [
                    {"scenario": sid, "policy": "cand", "run": r,
                     "reward": 0.0 if bad and r < 3 else 1.0,
                     "unauthorized_writes": int(bad and r == 0)},
                    {"scenario": sid, "policy": "inc", "run": r, "reward": float(r != 3)},
                ]  # fmt: skip
    return lines


def gate(tmp_path: Path, lines: list[dict]) -> Path:
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "receipt"
    result = invoke("gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
                    "--no-require-latency", "--out", str(out),
                    "--ledger", str(tmp_path / "l.db"))  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    return out


def test_the_receipt_holds_both_arms_hot_spots_and_renders_them(tmp_path):
    out = gate(tmp_path, scores_lines())
    receipt = load_receipt(out)
    h = receipt.hotspots
    assert h is not None and h.candidate.axes == ["style", "task"]
    task, style = h.candidate.values[:2]
    assert task.cell == {"task": "second_slot"} and (task.passes, task.verified) == (5, 8)
    assert style.cell == {"style": "terse"} and (style.passes, style.verified) == (9, 12)
    assert task.unauthorized_writes == style.unauthorized_writes == 1
    pair = h.candidate.pairs[0]
    assert pair.name == "style=terse, task=second_slot" and (pair.passes, pair.runs) == (1, 4)
    inc = next(r for r in h.incumbent.pairs if r.name == pair.name)
    assert (inc.passes, inc.runs, inc.unauthorized_writes) == (3, 4, 0)
    assert all(r.labels == {} for r in h.candidate.values)  # a scores line carries none
    md = (out / "receipt.md").read_text()
    section = md[md.index("## Hot spots") : md.index("## Lineage")]
    assert "| style=terse, task=second_slot | 1/4 (25%) | 3/4 (75%) | 1 / 0 | 1 |" in section
    page = (out / "receipt.html").read_text()
    hot = page[page.index('<h2 id="hotspots">') :]
    assert "<svg" in hot[: hot.index("<h2>Lineage")]
    assert "style=terse, task=second_slot" in hot and "Pass rate per axis value" in hot


def test_a_receipt_without_axes_has_none_and_an_older_receipt_still_loads(tmp_path):
    out = gate(tmp_path, scores_lines(axes=False))
    receipt = load_receipt(out)
    assert receipt.hotspots is None
    assert "## Hot spots" not in (out / "receipt.md").read_text()
    assert 'id="hotspots"' not in (out / "receipt.html").read_text()
    older = json.loads((out / "receipt.json").read_text())
    del older["hotspots"]  # written before hot spots existed
    assert GateReceipt.model_validate(older).hotspots is None


def test_both_channels_json_carry_their_hot_spots(capsys):
    from types import SimpleNamespace

    from pipecat_rl.cli import simulate as simulate_cli

    empty = SimpleNamespace(episodes=[], to_json=dict)
    text, audio = hot_spots(planted()), hot_spots(planted()[:6])
    simulate_cli._report_gap(empty, empty, None, json_out=True, spots=(text, audio))
    printed = json.loads(capsys.readouterr().out)
    assert printed["text"]["hotspots"] == text.model_dump()
    assert printed["audio"]["hotspots"]["values"][0]["cell"] == {"task": "second_slot"}
