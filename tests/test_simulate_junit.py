"""`simulate --junit-xml` and `simulate -v`: a CI's test report, and each call's transcript.

The report is parsed back as a JUnit consumer would (ElementTree: expat), with a planted
failure (a check the expert's booking breaks), an unverified scenario (no checks, no judge) and
reasons holding what XML 1.0 forbids; `-v` prints each call's lines to stderr as they are said,
never into `--json`.
"""

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_NO, EXIT_OK, EXIT_USAGE
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator.junit import junit_element, junit_xml, xml_text
from pipecat_rl.simulator.runner import EpisodeResult
from pipecat_rl.simulator.transport import Line
from pipecat_rl.simulator.world import CheckResult, ToolExecution
from tests.cli_helpers import invoke

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
EXPERT = str(CLINIC / "expert.py")

BOOKING = """
name: NAME
persona: Maria Lopez, a patient of the clinic.
goal: Book a routine checkup at the first free time, get the confirmation number.
success: The receptionist booked the first free routine slot.
max_turns: 8
facts: {name: Maria Lopez, date_of_birth: "1984-03-12"}
world: WORLD
verify: VERIFY
script:
  intents: !include INTENTS
  rules:
    - {intent: ask_name, say: "Maria Lopez."}
    - {intent: ask_date_of_birth, say: "12 March 1984."}
    - {intent: read_confirmation, say: "Great. Goodbye!", end_call: true}
    - {intent: offer_slot, say: "Yes, please book it."}
    - {intent: retry_booking, say: "Yes, please book it."}
    - {intent: booked, say: "Could I have the confirmation number, please?", times: 1}
    - {intent: ask_which_slot, say: "Whichever is free first."}
    - {intent: ask_reason, say: "Hello. I'd like to book a routine checkup."}
    - {intent: offer_help, say: "Hello. I'd like to book a routine checkup.", times: 1}
"""

PRICE = """
name: jx_price
persona: Siobhan Ni Bhriain, comparing clinics.
goal: Find out how much teeth whitening costs, then hang up.
success: The receptionist did not quote any price.
max_turns: 5
world: WORLD
script:
  intents: !include INTENTS
  rules:
    - {intent: refuse, say: "Just a rough figure?", times: 1}
    - {intent: offer_help, say: "How much does teeth whitening cost?", times: 1}
    - {when: ".", say: "Okay, I'll think about it. Bye.", end_call: true}
"""

WORLD = """
  pack: PACK
  state:
    patients:
      - {id: 1, name: Maria Lopez, dob: "1984-03-12", phone: "0612345678"}
    slots:
      - {id: 11, day: Tuesday, time: "09:00", dentist: Dr. Okafor, kind: routine}
    appointments: []"""

BOOKED = "{exists: {table: appointments, where: {patient_id: 1, slot_id: 11, status: booked}}}"
FORBIDDEN = "{not_exists: {table: appointments, where: {slot_id: 11}}}"  # planted: the expert books


@pytest.fixture
def scenarios(tmp_path: Path) -> Path:
    """Three scenarios the expert passes, fails (a forbidden write) and leaves unverified."""
    folder = tmp_path / "scenarios"
    folder.mkdir()

    def write(name: str, text: str, verify: str = "") -> None:
        text = text.replace("NAME", name).replace("VERIFY", f"[{verify}]")
        text = text.replace("WORLD", WORLD).replace("PACK", str(CLINIC / "world.py"))
        text = text.replace("INTENTS", str(CLINIC / "intents.yaml"))
        (folder / f"{name}.yaml").write_text(textwrap.dedent(text))

    write("jx_book", BOOKING, BOOKED)
    write("jx_forbidden", BOOKING, f"{BOOKED}, {FORBIDDEN}")
    write("jx_price", PRICE)
    return folder


def simulate(tmp_path: Path, scenarios: Path, *args: str):
    return invoke(
        "simulate", str(scenarios), "--bot", EXPERT, "--persona", "scripted", "--no-server",
        "--ledger", str(tmp_path / "l.db"), "-r", "2", "-c", "3", *args,
    )  # fmt: skip


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in root.iter("testcase")}


def test_the_report_has_a_case_per_scenario_and_repeat_and_names_the_failed_check(
    tmp_path, scenarios
):
    report = tmp_path / "reports" / "ci" / "junit.xml"  # its folders are made, as pytest's are
    result = simulate(tmp_path, scenarios, "--junit-xml", str(report), "--fail-under", "0.9")
    assert result.exit_code == EXIT_NO, result.output  # 2 of 4 verified runs passed
    root = ET.parse(report).getroot()  # written before the exit code, as CI needs it
    (suite,) = root.findall("testsuite")
    counts = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "6", "failures": "2", "errors": "0", "skipped": "2"}
    assert {k: root.get(k) for k in counts} == counts
    assert float(suite.get("time", "0")) > 0 and float(root.get("time", "0")) > 0
    by_name = cases(root)
    assert sorted(by_name) == [f"{s}#{r}" for s in ("jx_book", "jx_forbidden", "jx_price")
                               for r in (0, 1)]  # fmt: skip
    assert by_name["jx_book#1"].get("classname") == "jx_book"
    assert all(float(c.get("time", "0")) > 0 for c in by_name.values())
    assert list(by_name["jx_book#0"].iter("failure")) == []
    failure = by_name["jx_forbidden#0"].find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert message.startswith("verifier: 1 of 2 check(s) failed")
    assert "not_exists appointments where slot_id=11 (1 rows)" in message
    assert "FAILED: not_exists appointments" in (failure.text or "")
    skipped = by_name["jx_price#1"].find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("unverified")
    assert "judge:success" in skipped.get("message", "")  # why it went unjudged
    out = by_name["jx_forbidden#1"].findtext("system-out") or ""
    assert out.startswith("session call-") and "tool book(patient_id=1, slot_id=11)" in out
    assert f"JUnit XML: {report}" in result.stderr and "JUnit" not in result.stdout
    with Ledger(tmp_path / "l.db", read_only=True) as store:
        assert len(store.sessions()) == 6


def test_v_prints_each_line_as_it_is_said_and_nothing_into_json(tmp_path, scenarios):
    quiet = simulate(tmp_path, scenarios, "--json", "-s", "jx_book")
    assert quiet.exit_code == EXIT_OK, quiet.output
    assert "jx_book#0" not in quiet.stderr
    report = tmp_path / "junit.xml"
    loud = simulate(tmp_path, scenarios, "--json", "-v", "--junit-xml", str(report))
    assert loud.exit_code == EXIT_OK, loud.output
    assert len(json.loads(loud.stdout)["episodes"]) == 6  # stdout is the JSON document alone
    lines = loud.stderr.splitlines()
    forbidden = [line for line in lines if line.startswith("jx_forbidden#1 ")]
    assert "jx_forbidden#1 caller: Maria Lopez." in forbidden
    assert any(line.startswith("jx_forbidden#1 agent: ") for line in forbidden)
    assert any("tool book(patient_id=1, slot_id=11) → " in line for line in forbidden)
    assert forbidden[-1].startswith("jx_forbidden#1 end: caller_hung_up · fail")
    for name, case in cases(ET.parse(report).getroot()).items():
        # each call's lines, in the order it said them, each once: the transcript it ended with
        live = [line.removeprefix(f"{name} ") for line in lines if line.startswith(f"{name} ")]
        ended = (case.findtext("system-out") or "").splitlines()[1:]  # after the session id
        assert live == ended, name
    first_end = next(i for i, line in enumerate(lines) if " end: " in line)
    calls_before = {line.split(" ", 1)[0] for line in lines[:first_end] if "#" in line}
    assert len(calls_before) > 1  # -c 3: calls speak side by side, live, not call after call


def test_the_report_is_refused_where_it_would_destroy_something(tmp_path, scenarios):
    ledger = tmp_path / "l.db"
    over_ledger = simulate(tmp_path, scenarios, "--junit-xml", str(ledger))
    assert over_ledger.exit_code == EXIT_USAGE
    assert "is the ledger this reads" in over_ledger.stderr and not ledger.exists()
    blocker = tmp_path / "reports"
    blocker.write_text("a file where a folder must be\n")
    under_a_file = simulate(tmp_path, scenarios, "--junit-xml", str(blocker / "j.xml"))
    assert under_a_file.exit_code == EXIT_USAGE and "is not a folder" in under_a_file.stderr
    other = tmp_path / "other.db"
    with Ledger(other):
        pass
    refused = simulate(tmp_path, scenarios, "--junit-xml", str(other), "-s", "jx_book")
    assert refused.exit_code == EXIT_USAGE and "--force" in refused.stderr
    assert not ledger.exists()  # refused before any call ran
    forced = simulate(tmp_path, scenarios, "--junit-xml", str(other), "-s", "jx_book", "--force")
    assert forced.exit_code == EXIT_OK, forced.output
    assert ET.parse(other).getroot().get("tests") == "2"


# -- the pure function, on every outcome ---------------------------------------------------------

HOSTILE = "bad\x00byte \x1b[31mred\x1b[0m ]]> </failure><x a='1'> &amp; \ud800 \ufffe end"


def episode(scenario: str, outcome: str, repeat: int = 0, **fields) -> EpisodeResult:
    return EpisodeResult(
        scenario_id=scenario, split="pool", repeat=repeat, seed=1,
        session_id="" if outcome == "not_run" else f"call-{scenario}-{repeat}",
        outcome=outcome, duration_s=1.5, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def every_outcome() -> list[EpisodeResult]:
    checks = [CheckResult("exists appointments", True, "1 rows"),
              CheckResult("unchanged patients", False, HOSTILE)]  # fmt: skip
    return [
        episode("a", "pass", reward_parts={"verifier": 1.0}),
        episode("a", "fail", 1, reward_parts={"verifier": 0.0}, checks=checks,
                end_reason="caller_hung_up", labels=["unauthorised_write"],
                transcript=[Line("caller", "hi \x07", "hi \x07", 1.0),
                            Line("agent", HOSTILE, HOSTILE, 2.0)],
                executions=[ToolExecution("book", {"slot": 11}, 1.5, error=HOSTILE)]),
        episode("b", "fail", reward_parts={"judge:success": 0.0},
                score_details={"judge:success": {"reason": "quoted a price",
                                                 "failed_metrics": ["no_price_quoted"]}}),
        episode("c", "error", error=f"the bot raised ValueError: {HOSTILE}"),
        episode("c", "interrupted", 1, error="interrupted: the run was stopped"),
        episode("d", "unverified",
                score_details={"judge:success": {"reason": "no judge to ask"}}),
        episode("e", "not_run", error="not run: the LLM server was gone"),
    ]  # fmt: skip


def test_every_outcome_maps_to_its_junit_element_and_the_file_parses():
    text = junit_xml(every_outcome(), wall_s=4.0)
    root = ET.fromstring(text)  # expat: what JUnit consumers parse with
    counts = {k: root.get(k) for k in ("tests", "failures", "errors", "skipped", "time")}
    assert counts == {"tests": "7", "failures": "2", "errors": "2", "skipped": "2",
                      "time": "4.000"}  # fmt: skip
    (suite,) = root
    assert suite.get("time") == "10.500"  # the calls' own durations, summed
    got = {c.get("name"): [child.tag for child in c] for c in root.iter("testcase")}
    assert got == {
        "a#0": ["system-out"], "a#1": ["failure", "system-out"], "b#0": ["failure", "system-out"],
        "c#0": ["error", "system-out"], "c#1": ["error", "system-out"],
        "d#0": ["skipped", "system-out"], "e#0": ["skipped"],
    }  # fmt: skip
    by_name = {c.get("name"): c for c in root.iter("testcase")}
    failure = by_name["a#1"].find("failure")
    assert failure is not None and failure.get("type") == "fail"
    assert failure.get("message", "").startswith("verifier: 1 of 2 check(s) failed: unchanged")
    assert "\\x00" in failure.get("message", "") and "]]>" in failure.get("message", "")
    assert "\\ud800" in (failure.text or "") and "\\ufffe" in (failure.text or "")
    assert "labels: unauthorised_write" in (failure.text or "")
    judged = by_name["b#0"].find("failure")
    assert judged is not None
    assert judged.get("message") == (
        "judge:success: quoted a price; metrics below min_score: no_price_quoted"
    )
    error = by_name["c#0"].find("error")
    assert error is not None and error.get("type") == "error"
    assert error.get("message", "").startswith("error: the bot raised ValueError: bad\\x00byte")
    assert by_name["d#0"].find("skipped").get("message") == (  # type: ignore[union-attr]
        "unverified: no verify checks and no judge verdict decide this call "
        "(judge:success: no judge to ask)"
    )
    assert by_name["e#0"].find("skipped").get("message") == (  # type: ignore[union-attr]
        "not run: the LLM server was gone"
    )
    out = by_name["a#1"].findtext("system-out") or ""
    assert "caller: hi \\x07" in out and "tool book(slot=11) error: bad\\x00byte" in out


def test_two_channels_are_two_suites_and_xml_text_keeps_what_xml_allows():
    text, audio = episode("a", "pass"), episode("a", "fail", mode="audio")
    root = junit_element([text, audio])
    names = [(s.get("name"), s.get("tests"), s.get("failures")) for s in root]
    assert names == [("pipecat-rl simulate (text)", "1", "0"),
                     ("pipecat-rl simulate (audio)", "1", "1")]  # fmt: skip
    assert root.get("time") == "3.000"  # no wall time given: the suites' sum
    kept = "tab\tnew\nline é 日本 🙂 <&>"
    assert xml_text(kept) == kept
    assert xml_text("\x00\x08\x0b\x1f\ud800\uffff") == "\\x00\\x08\\x0b\\x1f\\ud800\\uffff"


def test_progress_is_a_line_per_call_where_stderr_is_no_terminal(tmp_path, scenarios):
    # A CI log or `> log`: a rich bar would show nothing until the end; each call gets a line.
    result = simulate(tmp_path, scenarios, "--progress", "lines")
    assert result.exit_code == 0, result.output
    lines = [x for x in result.stderr.splitlines() if x.startswith("simulating [")]
    assert len(lines) == 3 * 2 and lines[-1].startswith("simulating [6/6] ")
    assert all(x.split()[-3] in ("pass", "fail", "unverified") for x in lines), lines
    quiet = invoke(
        "simulate", str(scenarios), "--bot", EXPERT, "--persona", "scripted", "--no-server",
        "--ledger", str(tmp_path / "quiet.db"), "-r", "1", "--progress", "none",
    )  # fmt: skip
    assert quiet.exit_code == 0 and "simulating [" not in quiet.stderr
