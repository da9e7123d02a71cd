"""Held-out sets frozen by content: every leak route is refused or excluded from training."""

import shutil
from pathlib import Path

import pytest
from loguru import logger

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.scenarios.heldout import session_split
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
EXPERT = str(CLINIC / "expert.py")
SCRIPTED = SimulationConfig(persona="scripted", concurrency=2)
NAME = "heldout_routine_booking"


@pytest.fixture
def clinic(tmp_path) -> Path:
    """A copy of the clinic's world and one held-out scenario: clinic/handwritten/heldout/x.yaml."""
    root = tmp_path / "clinic"
    (root / "handwritten" / "heldout").mkdir(parents=True)
    shutil.copy(CLINIC / "world.py", root / "world.py")
    shutil.copy(CLINIC / "handwritten" / "world.yaml", root / "handwritten" / "world.yaml")
    shutil.copy(CLINIC / "intents.yaml", root / "intents.yaml")  # the pack's shared intents
    shutil.copy(
        CLINIC / "handwritten" / "heldout" / f"{NAME}.yaml",
        root / "handwritten" / "heldout" / f"{NAME}.yaml",
    )
    return root


def heldout_file(clinic: Path) -> Path:
    return clinic / "handwritten" / "heldout" / f"{NAME}.yaml"


def put(clinic: Path, folder: str, text: str | None = None, name: str = f"{NAME}.yaml") -> Path:
    """Write a scenario under clinic/handwritten/<folder>/ (default: the held-out file's text)."""
    target = clinic / "handwritten" / folder / name
    target.parent.mkdir(parents=True, exist_ok=True)
    depth = len(Path(folder).parts) - 1  # keep the world include and pack reachable
    body = text if text is not None else heldout_file(clinic).read_text()
    for included in ("../world.yaml", "../intents.yaml"):
        body = body.replace(included, "../" * depth + included)
    target.write_text(body)
    return target


def test_a_split_that_contradicts_its_folder_is_an_error_naming_file_and_line(clinic):
    text = heldout_file(clinic).read_text() + "split: pool\n"
    heldout_file(clinic).write_text(text)
    with pytest.raises(ScenarioError) as e:
        load_scenarios([clinic / "handwritten" / "heldout"])
    line = text.splitlines().index("split: pool") + 1
    assert f"{heldout_file(clinic)}: line {line}: split: 'pool' contradicts" in str(e.value)
    pool = put(clinic, "pool", text.replace("split: pool", "split: heldout"))
    with pytest.raises(ScenarioError, match="'heldout' contradicts its folder pool/"):
        load_scenarios([pool])


def test_a_file_nested_deep_under_heldout_is_held_out(clinic):
    nested = put(clinic, "heldout/extra/deeper", name="deep.yaml")
    heldout_file(clinic).unlink()
    (scenario,) = load_scenarios([nested]).scenarios
    assert scenario.split == "heldout"


@pytest.mark.parametrize("folder", ["held_out", "Held-Out", "holdout", "heldout_v2", "pools"])
def test_a_folder_that_looks_like_a_split_but_is_not_one_is_an_error(clinic, folder):
    path = put(clinic, folder)
    with pytest.raises(ScenarioError, match=f"the folder '{folder}' looks like a split"):
        load_scenarios([path])


def test_the_hash_ignores_split_and_name_and_covers_the_pack_code(clinic):
    (held,) = load_scenarios([heldout_file(clinic)]).scenarios
    text = heldout_file(clinic).read_text().replace(f"name: {NAME}", "name: renamed_copy")
    (copy,) = load_scenarios([put(clinic, "pool", text, name="copy.yaml")]).scenarios
    assert copy.split == "pool" and copy.id == "renamed_copy"
    before = held.content_hash()
    assert copy.content_hash() == before
    pack = clinic / "world.py"
    pack.write_text(pack.read_text() + "\n# a comment is not code\n")
    (commented,) = load_scenarios([heldout_file(clinic)]).scenarios
    assert commented.content_hash() == before  # the pack is its code, not its bytes
    pack.write_text(pack.read_text() + "\nCHANGED = True\n")
    (again,) = load_scenarios([heldout_file(clinic)]).scenarios
    assert again.content_hash() != before


def test_the_set_id_changes_with_includes_and_pack_code(clinic):
    folder = clinic / "handwritten" / "heldout"
    first = load_scenarios([folder]).heldout_set_id
    assert load_scenarios([folder]).heldout_set_id == first
    world = clinic / "handwritten" / "world.yaml"
    world.write_text(world.read_text() + "\n# a comment in the included file\n")
    second = load_scenarios([folder]).heldout_set_id
    assert second != first
    (clinic / "world.py").write_text((clinic / "world.py").read_text() + "\nCHANGED = True\n")
    assert load_scenarios([folder]).heldout_set_id not in (first, second)


async def test_a_heldout_copy_in_pool_is_simulated_as_heldout_and_never_trains(clinic, tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    held = load_scenarios([clinic / "handwritten" / "heldout"])
    await simulate(held, load_bot(EXPERT), SCRIPTED, ledger)
    (row,) = ledger.heldout_hashes().values()
    assert row["scenario_id"] == NAME and row["heldout_set_id"] == held.heldout_set_id
    # the same file copied into pool/ (and so labelled pool) is held out by its content
    pool = load_scenarios([put(clinic, "pool")])
    assert pool.scenarios[0].split == "pool"
    report = await simulate(pool, load_bot(EXPERT), SCRIPTED, ledger)
    (episode,) = report.episodes
    session = ledger.session(episode.session_id)
    assert (episode.split, session.split) == ("heldout", "heldout")
    assert session.heldout_set_id == held.heldout_set_id
    assert ledger.training_turns(require_token_exact=False) == []
    ledger.close()


def test_a_pool_labelled_session_of_a_heldout_hash_is_excluded_from_training(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        for sid, scenario_hash in (("a", "h-held"), ("b", "h-pool")):
            ledger.write_session(
                SessionRecord(id=sid, source="simulate", started_at=1.0, ended_at=2.0, split="pool",
                              scenario_id=sid, scenario_hash=scenario_hash),
                turns=[TurnRecord(session_id=sid, index=0, adapter="base", created_at=1.0,
                                  request={})],
            )  # fmt: skip
        assert {t.session_id for t in ledger.training_turns(require_token_exact=False)} == {
            "a", "b"
        }  # fmt: skip
        assert ledger.record_heldout_hashes([("h-held", "a", None)]) == 1
        assert ledger.record_heldout_hashes([("h-held", "a", "other")]) == 0  # first kept
        assert {t.session_id for t in ledger.training_turns(require_token_exact=False)} == {"b"}
        assert ledger.stats()["eligible_turns"]["rl"] == 0  # neither turn is token-exact


async def test_one_id_with_two_contents_is_an_error_before_any_episode(clinic, tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    (held,) = load_scenarios([heldout_file(clinic)]).scenarios
    ledger.record_heldout_hashes([(held.content_hash(), held.id, "heldout-x")])
    edited = heldout_file(clinic).read_text().replace("max_turns: 8", "max_turns: 9")
    pool = load_scenarios([put(clinic, "pool", edited)])
    with pytest.raises(ScenarioError, match=f"scenario '{NAME}' was held out with other content"):
        await simulate(pool, load_bot(EXPERT), SCRIPTED, ledger)
    assert ledger.sessions() == []
    ledger.close()


def test_session_split_records_heldout_hashes(clinic, tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        (held,) = load_scenarios([heldout_file(clinic)]).scenarios
        assert session_split(ledger, held, "heldout-x") == ("heldout", "heldout-x")
        assert set(ledger.heldout_hashes()) == {held.content_hash()}


def _pack_path_spelled_otherwise(clinic: Path, text: str) -> str:
    """The held-out text, its world pack named through `clinic/../clinic/world.py`."""
    world = (clinic / "handwritten" / "world.yaml").read_text()
    spelled = world.replace("pack: ../../world.py", "pack: ../../../clinic/world.py")
    assert spelled != world
    (clinic / "handwritten" / "world_spelled.yaml").write_text(spelled)
    return text.replace("../world.yaml", "../world_spelled.yaml")


def _verify_reordered(clinic: Path, text: str) -> str:
    del clinic
    lines = text.splitlines(keepends=True)
    i = lines.index("verify:\n")
    lines[i + 1], lines[i + 2] = lines[i + 2], lines[i + 1]
    assert lines[i + 1].startswith("  - unchanged:")
    return "".join(lines)


def _persona_spaced_and_renamed(clinic: Path, text: str) -> str:
    del clinic
    spaced = text.replace("Tom Baker, a retired", "Tom Baker,  a retired ")
    assert spaced != text
    return spaced.replace(f"name: {NAME}", "name: a_new_name")


ROUTES = pytest.mark.parametrize(
    "route",
    [_pack_path_spelled_otherwise, _verify_reordered, _persona_spaced_and_renamed],
    ids=["pack-path-spelled-otherwise", "verify-reordered", "persona-spaced-and-renamed"],
)


@ROUTES
async def test_heldout_content_by_another_route_never_becomes_an_rl_row(clinic, tmp_path, route):
    ledger = Ledger(tmp_path / "ledger.db")
    held = load_scenarios([clinic / "handwritten" / "heldout"])
    await simulate(held, load_bot(EXPERT), SCRIPTED, ledger)
    pool = load_scenarios([put(clinic, "pool", route(clinic, heldout_file(clinic).read_text()))])
    assert pool.scenarios[0].split == "pool"
    assert pool.scenarios[0].content_hash() == held.scenarios[0].content_hash()
    (episode,) = (await simulate(pool, load_bot(EXPERT), SCRIPTED, ledger)).episodes
    assert episode.error is None, episode.error
    assert (episode.split, ledger.session(episode.session_id).split) == ("heldout", "heldout")
    assert ledger.training_turns(require_token_exact=False) == []
    ledger.close()


@ROUTES
def test_heldout_content_by_another_route_is_never_pooled_beside_it(clinic, route):
    text = route(clinic, heldout_file(clinic).read_text()).replace(f"name: {NAME}", "name: copy")
    put(clinic, "pool", text, name="copy.yaml")  # another name, or it fails as a duplicate name
    with pytest.raises(ScenarioError, match="has the content of the held-out scenario"):
        load_scenarios([clinic / "handwritten"])


def test_a_near_duplicate_of_a_heldout_scenario_is_an_error_naming_both(clinic):
    text = heldout_file(clinic).read_text()
    near = text.replace(f"name: {NAME}", "name: near").replace("a retired teacher", "a builder")
    put(clinic, "pool", near, name="near.yaml")
    with pytest.raises(ScenarioError, match="is a near-duplicate of the held-out") as e:
        load_scenarios([clinic / "handwritten"])
    assert "near.yaml" in str(e.value) and f"{NAME}.yaml" in str(e.value)


def test_a_scenario_sharing_only_world_goal_and_facts_is_a_warning_naming_both(clinic):
    text = heldout_file(clinic).read_text()
    head, _, _ = text.partition("script:")
    other = head.replace(f"name: {NAME}", "name: other").replace(
        "a retired teacher, courteous and unhurried", "a plumber in a hurry who mumbles"
    ) + (
        "script:\n  rules:\n"
        '    - {when: "who|name", say: "It is Tom, Tom Baker, from the garage on Elm street."}\n'
        '    - {when: "slot|time", say: "Fine, whatever you have first, I am on a job."}\n'
        '    - {when: "number", say: "Right, got it, cheers.", end_call: true}\n'
    )
    put(clinic, "pool", other, name="other.yaml")
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        loaded = load_scenarios([clinic / "handwritten"])
    finally:
        logger.remove(sink)
    assert len(loaded) == 2  # a warning, not an error
    (warning,) = [w for w in warnings if "world, goal and facts" in w]
    assert "other.yaml" in warning and f"{NAME}.yaml" in warning


def test_a_heldout_copy_loaded_beside_it_is_an_error(clinic):
    text = heldout_file(clinic).read_text().replace(f"name: {NAME}", "name: sneaky")
    put(clinic, "pool", text, name="sneaky.yaml")
    with pytest.raises(ScenarioError, match="has the content of the held-out scenario"):
        load_scenarios([clinic / "handwritten"])
