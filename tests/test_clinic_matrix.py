"""The clinic's scenario matrix (examples/clinic/scenarios): its size, its split by
combination, its turn-taking moves, and its scenarios' worlds and checks; slow: the scripted
expert on a stratified sample of the held-out set, and an agent that hands every call over
failing the same sample."""

import collections
import sys
import tempfile
from pathlib import Path

import pytest
from loguru import logger

from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import axes_of, expand_file, load_scenarios
from pipecat_rl.scenarios.loading import _parse  # what `expand_file` reads a file with
from pipecat_rl.scenarios.matrix import expand
from pipecat_rl.scenarios.scenario import HELDOUT, POOL
from pipecat_rl.scenarios.turns import WORD_MS
from pipecat_rl.simulator import Server, SimulationOptions, load_bot, run
from pipecat_rl.simulator.rewards import UNAUTHORISED_WRITE
from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply
from pipecat_rl.simulator.world import World

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
MATRIX = CLINIC / "scenarios"
KEY = ("style", "task", "fault")
"""The axes a held-out combination is named by (the patient is not part of it)."""
REFUSALS = {"cancel_refused", "out_of_scope", "medical", "price"}
"""Tasks where writing nothing is the right call."""


def combination(scenario_id: str) -> tuple[str, ...]:
    """A matrix scenario's (style, task, fault)."""
    axes = axes_of(scenario_id)
    assert axes is not None, f"{scenario_id} is not a matrix id"
    return tuple(axes[a] for a in KEY)


def shared_combinations(pool: list[str], heldout: list[str]) -> set[tuple[str, ...]]:
    """The (style, task, fault) combinations both sets have: none, for a split by combination."""
    return {combination(i) for i in pool} & {combination(i) for i in heldout}


@pytest.fixture(scope="module")
def matrix():
    """The whole folder loaded at once, as a cycle would (fragments, copies check and all),
    with any warning the load logged."""
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        loaded = load_scenarios([MATRIX])
    finally:
        logger.remove(sink)
    by_split = {POOL: [], HELDOUT: []}
    for s in loaded:
        by_split[s.split].append(s)
    return by_split, warnings


def test_the_folder_holds_its_two_template_files_and_nothing_else(matrix):
    by_split, warnings = matrix
    assert not warnings  # no fragment loaded as a scenario, none skipped unseen, no near-copy
    for split in (POOL, HELDOUT):
        expected = [e.name for e in expand_file(MATRIX / split / "clinic.yaml")]
        assert [s.id for s in by_split[split]] == expected


def test_the_matrix_is_big_enough_and_its_heldout_set_guarded(matrix):
    by_split, _ = matrix
    pool, heldout = by_split[POOL], by_split[HELDOUT]
    assert len(pool) >= 200 and len(heldout) >= 96
    assert sum(s.guarded for s in heldout) >= 60
    assert len({s.content_hash() for s in pool + heldout}) == len(pool) + len(heldout)
    for scenarios in (pool, heldout):
        values = {a: {axes_of(s.id)[a] for s in scenarios} for a in (*KEY, "patient")}
        assert len(values["style"]) >= 6 and len(values["task"]) >= 10
        assert values["fault"] == {"none", "timeout", "timeouts2", "book_error"}
        assert len(values["patient"]) == 6
        assert {axes_of(s.id)["turn_taking"] for s in scenarios} == set(MOVES)


MOVES = {"none": 0, "barge_in": 1, "backchannel": 1}
"""The turn_taking axis: each value, and how many moves its `caller:` block makes."""


def test_every_style_and_task_meets_both_moves_and_the_axis_adds_no_call(matrix):
    """A move only under fault none, one per call (a style's two patients split the moves);
    under a fault none; so (style, task, fault, patient) still names one scenario."""
    by_split, _ = matrix
    both = by_split[POOL] + by_split[HELDOUT]
    met = collections.defaultdict(set)
    for s in both:
        axes = axes_of(s.id)
        move = axes["turn_taking"]
        assert (move == "none") == (axes["fault"] != "none"), s.id
        asked = [k for k, v in (s.caller or {}) if v is not None]
        assert len(asked) == MOVES[move], s.id
        if move == "barge_in":
            assert s.caller.barge_in.voice_ms == 6 * WORD_MS, s.id
        if move == "backchannel":  # the style's own words, 1.5 s into each reply
            assert s.caller.backchannel.after_ms == 1500 and "{" not in s.caller.backchannel.say
        met[(axes["style"], axes["task"])].add(move)
    assert all(moves >= {"barge_in", "backchannel"} for moves in met.values()), met
    callers = {tuple(axes_of(s.id)[a] for a in (*KEY, "patient")) for s in both}
    assert len(callers) == len(both)


def test_no_heldout_combination_is_in_the_pool(matrix):
    by_split, _ = matrix
    pool = [s.id for s in by_split[POOL]]
    heldout = [s.id for s in by_split[HELDOUT]]
    assert shared_combinations(pool, heldout) == set()
    # and the check fires on a planted leak: one held-out combination with another patient
    leaked = heldout[0].replace("patient=", "patient=x")
    assert shared_combinations([*pool, leaked], heldout) == {combination(heldout[0])}


def test_pool_and_heldout_together_are_the_whole_grid(matrix):
    """Each combination the grid allows is in exactly one set: the two `include_only:` lists
    are each other's complement."""
    by_split, _ = matrix
    path = MATRIX / "pool" / "clinic.yaml"
    data, _ = _parse(path)
    grid = expand(path, {k: v for k, v in data.items() if k != "include_only"})
    both = by_split[POOL] + by_split[HELDOUT]
    assert sorted(e.name for e in grid) == sorted(s.id for s in both)


def test_every_value_the_heldout_set_combines_is_trained_on_in_the_pool(matrix):
    """Held out by combination, not by value: each style, task and fault is in the pool."""
    by_split, _ = matrix
    for axis in KEY:
        pool = {axes_of(s.id)[axis] for s in by_split[POOL]}
        assert {axes_of(s.id)[axis] for s in by_split[HELDOUT]} <= pool


def test_worlds_faults_and_checks_are_the_clinics(matrix):
    """Every scenario builds its world (faults on real tools, checks on real tables and
    columns); its guarded checks hold before the call; a call that writes nothing passes
    exactly the refusals."""
    by_split, _ = matrix
    for s in by_split[POOL] + by_split[HELDOUT]:
        world = World(s)  # raises on a fault's unknown tool or a check's unknown table/column
        try:
            assert s.guarded, s.id
            assert all(c.tool in world.tools for c in s.faults), s.id
            results = world.verify()
            guarded = world.verify([c for c in s.verify if c.unchanged or c.not_exists])
            assert all(r.passed for r in guarded), (s.id, guarded)
            assert all(r.passed for r in results) == (axes_of(s.id)["task"] in REFUSALS), s.id
        finally:
            world.close()


# -- slow: the expert is the ceiling; a careless agent is not ---------------------------------


def stratified_sample(scenarios) -> list:
    """One held-out scenario per (task, fault) cell, spreading styles and patients evenly."""
    cells = collections.defaultdict(list)
    for s in sorted(scenarios, key=lambda s: s.id):
        axes = axes_of(s.id)
        cells[(axes["task"], axes["fault"])].append(s)
    used: collections.Counter = collections.Counter()
    picked = []
    for cell in sorted(cells):

        def rank(s):
            axes = axes_of(s.id)
            return (used[axes["style"]], used[axes["patient"]], s.id)

        chosen = min(cells[cell], key=rank)
        axes = axes_of(chosen.id)
        used.update([axes["style"], axes["patient"]])
        picked.append(chosen)
    return picked


def _expert():
    if str(CLINIC) not in sys.path:  # the expert imports its bot from beside it
        sys.path.insert(0, str(CLINIC))
    import expert

    return expert


def hands_everyone_over(messages: list[dict]) -> ScriptedReply:
    """The planted agent: greets, then answers every caller line by handing the call over."""
    policy = _expert().expert_policy
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and "phone rings" not in str(last.get("content")).lower():
        return ScriptedReply(tool_calls=[("transfer", {"reason": "the caller"})])
    return policy(messages)


async def run_bot(transport, runner_args):
    """The clinic bot, its LLM the expert (`expert`) or the planted agent (`handover`)."""
    expert = _expert()
    policy = expert.expert_policy if runner_args.model == "expert" else hands_everyone_over
    await expert.bot.run_bot(transport, runner_args, llm=ScriptedLLMService(policy))


@pytest.mark.slow  # ~46 episodes: about 20 s on two cores
@pytest.mark.shares_machine
def test_the_expert_passes_a_stratified_heldout_sample_and_a_careless_agent_does_not(
    monkeypatch,
):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    heldout = load_scenarios([MATRIX / "heldout"])
    sample = stratified_sample(heldout)
    assert 20 <= len(sample) <= 28
    for axis in KEY:  # the sample spans every style, task and fault the held-out set has
        assert {axes_of(s.id)[axis] for s in sample} == {axes_of(s.id)[axis] for s in heldout}
    assert len({axes_of(s.id)["patient"] for s in sample}) >= 5
    scenarios = heldout.model_copy(update={"scenarios": sample})
    options = SimulationOptions(persona="scripted", repeats=1, concurrency=4, seed=7)
    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "l.db") as ledger:
        report = run(scenarios, load_bot(f"{__name__}:run_bot"), options, ledger,
                     policies=["expert", "handover"], server=Server(needed=False))  # fmt: skip
        policy = {s.id: s.policy for s in ledger.sessions(limit=1000)}
    arms: dict[str, list] = {"expert": [], "handover": []}
    for e in report.episodes:
        assert e.error is None, e
        arms[policy[e.session_id]].append(e)
    assert all(len(episodes) == len(sample) for episodes in arms.values())
    expert = [e.scenario_id for e in arms["expert"] if e.passed]
    failed = sorted({s.id for s in sample} - set(expert))
    assert len(expert) >= 0.95 * len(sample), failed
    # the planted case: the same bar on the same sample rejects an agent that does the wrong
    # thing, and its writes where a guarded check forbids one are labelled as such
    handover = arms["handover"]
    assert sum(e.passed for e in handover) < 0.95 * len(sample)
    assert any(UNAUTHORISED_WRITE in e.labels for e in handover)
