from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import load_scenario_file
from pipecat_rl.scenarios.scenario import GUARDED_CHECKS, AsrNoise
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC
from pipecat_rl.simulator import World, load_scenarios
from pipecat_rl.simulator.asr_noise import AsrNoiseModel
from pipecat_rl.simulator.rewards import EpisodeEvidence, failure_labels, reward_parts

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "handwritten"


def scenario(name: str, folder: str = "pool"):
    return load_scenario_file(CLINIC / folder / f"{name}.yaml")[0]


def test_every_clinic_world_builds_and_verifies():
    for s in load_scenarios([CLINIC]):
        world = World(s)
        assert {"patients", "slots", "appointments", "handoffs"} <= set(world.tables())
        assert world.verify()  # every clinic scenario checks something


def test_reset_gives_identical_state_and_writes_never_leak():
    s = scenario("routine_booking")
    first, second = World(s, seed=1), World(s, seed=2)
    assert first.snapshot() == second.snapshot()
    booked = first.execute("book", {"patient_id": 1, "slot_id": 11})
    assert booked.ok and booked.state_diff["appointments"]["added"]
    assert first.snapshot() != second.snapshot()
    third = World(s, seed=1)
    assert third.snapshot() == second.snapshot() == second.initial
    assert [c.passed for c in first.verify()] == [True, True, True]
    assert [c.passed for c in third.verify()] == [False, False, True]


def test_fault_fires_exactly_on_the_configured_call():
    world = World(scenario("heldout_timeout_recovery", "heldout"))
    results = [world.execute("find_slots", {"kind": "routine"}) for _ in range(4)]
    assert [r.fault for r in results] == ["timeout", "timeout", None, None]
    assert [r.ok for r in results] == [False, False, True, True]
    assert "timed out" in results[0].error and results[0].state_diff == {}


def test_probabilistic_faults_are_seeded(tmp_path):
    path = tmp_path / "flaky.yaml"
    path.write_text(
        "name: flaky\npersona: A caller.\ngoal: Book a checkup.\nsuccess: Booked.\n"
        f"world: {{pack: {CLINIC.parent / 'world.py'}}}\n"
        "faults: [{tool: find_slots, kind: error, probability: 0.5}]\n"
    )
    s = load_scenario_file(path)[0]

    def pattern(seed):
        world = World(s, seed=seed)
        return [world.execute("find_slots", {}).ok for _ in range(20)]

    assert pattern(7) == pattern(7)
    assert pattern(7) != pattern(8)
    assert 0 < sum(pattern(7)) < 20


def test_a_fault_on_a_tool_the_world_lacks_is_refused_before_any_call(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(
        "name: typo\npersona: A caller.\ngoal: Book a checkup.\nsuccess: Booked.\n"
        f"world: {{pack: {CLINIC.parent / 'world.py'}}}\n"
        "faults: [{tool: find_slot, kind: timeout, on_call: 1}]\n"  # find_slots, misspelt
    )
    s = load_scenario_file(path)[0]
    with pytest.raises(ScenarioError, match=r"typo.yaml: faults.0: no tool 'find_slot'.*slots"):
        World(s)


def test_tool_errors_bad_arguments_and_unknown_tools_are_failed_executions():
    world = World(scenario("routine_booking"))
    assert "no patient" in world.execute("lookup_patient", {"name": "Nobody"}).error
    assert "bad arguments" in world.execute("book", {"patient": 1}).error
    assert "unknown tool" in world.execute("teleport", {}).error
    assert world.snapshot() == world.initial


def test_world_errors_name_the_scenario_field(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "name: w\npersona: p\ngoal: g\nsuccess: s\n"
        f"world: {{pack: {CLINIC.parent / 'world.py'}, state: {{dragons: [{{id: 1}}]}}}}\n"
    )
    with pytest.raises(ScenarioError, match=r"world\.state\.dragons.*no table 'dragons'"):
        World(load_scenario_file(path)[0])


def test_labels_and_reward_parts():
    s = scenario("tool_timeout_recovery")
    world = World(s)
    world.execute("lookup_patient", {"name": "Maria Lopes"})  # one letter off the fact
    world.execute("find_slots", {"kind": "routine"})  # injected timeout
    world.execute("find_slots", {"kind": "routine"})
    evidence = EpisodeEvidence(s, world.executions, world.verify(), [], "agent_hung_up")
    parts = reward_parts(evidence)
    goals = [c for c in evidence.checks if not c.check.startswith(GUARDED_CHECKS)]
    held = sum(c.passed for c in goals) / len(goals)
    assert parts == {
        "verifier": 0.0, "checks_held": round(held, 6), "violations": 0.0, "tool_credit": -0.1
    }  # fmt: skip
    assert failure_labels(evidence) == [
        "misheard_slot",
        "tool_error",
        "premature_hangup",
        "recovered",
    ]


def test_a_transfer_the_scenario_forbids_is_a_broken_hard_check_in_the_reward():
    s = scenario("out_of_scope")
    world = World(s)
    world.execute("transfer", {"reason": "car insurance"})
    evidence = EpisodeEvidence(s, world.executions, world.verify(), [], "caller_hung_up")
    parts = reward_parts(evidence)
    assert parts["verifier"] == 0.0 and parts["violations"] == 1.0
    assert "unauthorised_write" in failure_labels(evidence)
    # The successful transfer earns no tool credit in the training reward: the call failed.
    assert parts["tool_credit"] == 0.1
    assert DEFAULT_RUBRIC.reward(parts) < 0.0
    clean = reward_parts(EpisodeEvidence(s, [], World(s).verify(), [], "caller_hung_up"))
    assert clean == {"verifier": 1.0, "checks_held": 0.0, "violations": 0.0, "tool_credit": 0.0}


def test_a_fact_the_agent_did_not_hear_is_a_misheard_slot_even_with_no_tool_call():
    from pipecat_rl.simulator.transport import Line

    s = scenario("cancel_long_confirmation")
    said = "It's DX-48213-77065."

    def labels(heard: str, calls: list[dict]) -> list[str]:
        world = World(s)
        transcript = [Line("caller", said, heard, 10.0)]
        for arguments in calls:
            world.execute("cancel", arguments)
        world.executions[:] = [
            e.__class__(**{**vars(e), "started_at": 20.0}) for e in world.executions
        ]  # after the line was said
        return failure_labels(EpisodeEvidence(s, world.executions, [], transcript, "silence"))

    # Heard as written (digits, separators and case aside): nothing misheard.
    assert "misheard_slot" not in labels("it's DX 48213 77065", [])
    # A digit lost in the agent's STT, and no tool call at all: still a misheard slot.
    assert labels("It's DX482377065.", []) == ["misheard_slot", "timeout"]
    assert labels("", []) == ["misheard_slot", "timeout"]  # the agent heard none of it
    # Asked again, the agent got the fact to the tool right: the mishearing was recovered.
    right = labels("It's DX482377065.", [{"confirmation": "DX-48213-77065"}])
    assert right[0] == "misheard_slot" and "misheard_recovered" in right


def test_unauthorised_write_and_dead_loop_labels():
    s = scenario("insistent_unauthorised_cancel")
    world = World(s)
    world.execute("cancel", {"confirmation": "XX-1"})
    world.execute("cancel", {"confirmation": "XX-1"})
    world.execute("cancel", {"confirmation": "DX-48213-77065"})
    labels = failure_labels(EpisodeEvidence(s, world.executions, world.verify(), [], "max_turns"))
    assert labels == ["tool_error", "dead_loop", "unauthorised_write", "timeout", "recovered"]


def test_asr_noise_is_seeded_and_confuses_spelled_things():
    noisy = AsrNoise(digits=0.5, letters=0.5)
    line = "My number is DX-48213-77065 and my name is S I O B H A N"
    assert AsrNoiseModel(noisy, 3)(line) == AsrNoiseModel(noisy, 3)(line)
    outs = {AsrNoiseModel(noisy, seed)(line) for seed in range(10)}
    assert len(outs) > 1
    assert all(o.startswith("My number is") for o in outs)  # ordinary words are kept
    assert AsrNoiseModel(AsrNoise(), 1)(line) == line


def _exiting_world(tmp_path: Path, body: str) -> Path:
    pack = tmp_path / "exiting_pack.py"
    pack.write_text(
        "import sys\nfrom pipecat_rl.simulator.world import WorldPack\n"
        + body
        + "\nPACK = WorldPack(schema='CREATE TABLE t (id INTEGER);', tools={'quit': quit_tool})\n"
    )
    path = tmp_path / "exiting.yaml"
    path.write_text(
        "name: exiting\npersona: A caller.\ngoal: Ask.\nsuccess: Answered.\n"
        f"world: {{pack: {pack}}}\n"
    )
    return path


@pytest.mark.parametrize(
    ("raise_it", "said"),
    [("sys.exit(0)", "sys.exit(0)"), ("raise KeyboardInterrupt", "KeyboardInterrupt")],
)
def test_a_pack_that_ends_the_process_is_a_harness_error_not_an_exit(tmp_path, raise_it, said):
    path = _exiting_world(tmp_path, f"def quit_tool(db):\n    {raise_it}\n")
    world = World(load_scenario_file(path)[0])
    execution = world.execute("quit", {})
    assert not execution.ok and "world pack broke" in execution.error
    (error,) = world.harness_errors
    assert "exiting.yaml" in error and "'quit'" in error and said in error


def test_a_pack_that_exits_on_import_is_a_scenario_error_naming_it(tmp_path):
    path = _exiting_world(tmp_path, "sys.exit(0)\ndef quit_tool(db):\n    pass\n")
    with pytest.raises(ScenarioError, match=r"exiting.yaml: world.pack: cannot import .*sys.exit"):
        World(load_scenario_file(path)[0])
