"""`--executor ray` on a real two-node Ray cluster on loopback, against the local executor.

The clinic runs with its scripted expert and scripted callers (no model), so both executors
must give the same outcome per (scenario, repeat); and a node killed in the middle of a call
costs no episode and writes none twice. The cluster is `ray start` processes (a head and one
node per test, 1 CPU and a 100 MB object store each), torn down by process group. With two
calls in flight on two 1-CPU nodes, one of them runs on the test's node.
"""

import asyncio
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import Server, SimulationOptions, load_bot, load_scenarios, run
from pipecat_rl.simulator.executor import RayEpisodes, episode_runner
from pipecat_rl.simulator.runner import EpisodeResult, SimulationConfig
from tests.ray_doomed_bot import DOOM_ENV
from tests.ray_helpers import AUTH_OFF, alive, ray_head

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
POOL, HELDOUT = CLINIC / "handwritten" / "pool", CLINIC / "handwritten" / "heldout"
DOOMED_BOT = Path(__file__).resolve().with_name("ray_doomed_bot.py")


@pytest.fixture
def head(monkeypatch):
    """A fresh head per test: a node killed by one test stays registered with the head until
    its heartbeats time out, and calls sent to it meanwhile would starve the next test's node."""
    pytest.importorskip("ray", reason="Ray is the extra pipecat-rl[ray]")
    for name, value in AUTH_OFF.items():  # the driver, as the nodes
        monkeypatch.setenv(name, value)
    with ray_head() as cluster:
        yield cluster


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


def _scenarios():
    return load_scenarios([
        POOL / "routine_booking.yaml", POOL / "handoff_request.yaml",
        POOL / "booking_error_then_retry.yaml", HELDOUT / "heldout_terse_cancel.yaml",
    ])  # fmt: skip


def _simulate(bot: Path, ledger: Ledger, **options):
    options = SimulationOptions(persona="scripted", repeats=2, concurrency=2, seed=5, **options)
    return run(_scenarios(), load_bot(str(bot)), options, ledger, server=Server(needed=False))


def _outcomes(ledger: Ledger) -> dict[tuple[str, int], tuple]:
    """Per (scenario, repeat): what the episode was and how it went, as the ledger holds it."""
    out = {}
    for s in ledger.sessions():
        calls = [(c.name, c.arguments, c.error) for c in ledger.tool_calls(s.id)]
        spoken = [(line["speaker"], line["heard"]) for line in s.metadata["transcript"]]
        out[(s.scenario_id, s.repeat)] = (
            s.seed, s.split, s.heldout_set_id, s.outcome, s.reward, s.reward_parts,
            s.failure_labels, len(ledger.turns(s.id)), sorted(calls, key=str), spoken,
        )  # fmt: skip
    return out


def test_ray_gives_the_local_outcomes_per_scenario_and_repeat(head, tmp_path, no_keys):
    node = head.add_node()
    with Ledger(tmp_path / "local.db") as ledger:
        local = _simulate(CLINIC / "expert.py", ledger)
        expected = _outcomes(ledger)
    with Ledger(tmp_path / "ray.db") as ledger:
        on_ray = _simulate(CLINIC / "expert.py", ledger, executor="ray", ray_address=head.address)
        got = _outcomes(ledger)
        assert len(ledger.sessions()) == len(on_ray.episodes) == 8  # one session per episode
    head.kill(node)
    assert all(e.error is None for e in local.episodes + on_ray.episodes)
    assert expected[("heldout_terse_cancel", 1)][1] == "heldout"  # the held-out hash, both ways
    assert got == expected
    # The report agrees with the ledger, episode by episode.
    key = lambda e: (e.scenario_id, e.repeat)  # noqa: E731
    assert {key(e): (e.seed, e.outcome, e.reward) for e in on_ray.episodes} == {
        key(e): (e.seed, e.outcome, e.reward) for e in local.episodes
    }


def test_a_node_killed_mid_call_loses_no_episode_and_writes_none_twice(head, tmp_path, no_keys):
    doom = tmp_path / "doom"
    doom.mkdir()
    node = head.add_node(env={DOOM_ENV: str(doom)})
    with Ledger(tmp_path / "expected.db") as ledger:
        _simulate(DOOMED_BOT, ledger)  # no node here: the expert's outcomes
        expected = _outcomes(ledger)
    with Ledger(tmp_path / "ray.db") as ledger:
        report = _simulate(DOOMED_BOT, ledger, executor="ray", ray_address=head.address)
        sessions = ledger.sessions()
        got = _outcomes(ledger)
    killed_in = (doom / "killed").read_text()
    assert not alive(node)  # the node is gone: raylet, workers and all
    assert all(e.error is None for e in report.episodes)
    ids = Counter(s.id for s in sessions)
    assert killed_in in ids and ids[killed_in] == 1  # the call cut short ran again, once
    per_episode = Counter((s.scenario_id, s.repeat) for s in sessions)
    assert len(per_episode) == 8 and set(per_episode.values()) == {1}
    assert got == expected


def test_ray_not_installed_is_one_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pipecat-rl\[ray\]"):
        with episode_runner(SimulationOptions(executor="ray")):
            pass


def test_ray_flags_without_the_ray_executor_are_refused():
    with pytest.raises(ValueError, match="executor 'ray'"):
        SimulationOptions(ray_address="auto")


def test_the_driver_sends_each_episode_to_the_endpoint_with_the_fewest_in_flight(tmp_path):
    pytest.importorskip("ray", reason="Ray is the extra pipecat-rl[ray]")
    endpoints = ("http://gpu-1/v1", "http://gpu-2/v1")
    runner = RayEpisodes(endpoints)
    sent: asyncio.Queue[tuple[str, asyncio.Event]] = asyncio.Queue()

    class HeldTask:  # stands in for the Ray task: each episode ends when the test says so
        def remote(self, scenario, spec, shown_as, config, **kwargs):
            ends = asyncio.Event()
            sent.put_nowait((config.llm_url, ends))

            async def result():
                await ends.wait()
                return EpisodeResult(scenario.id, "pool", 0, 0, "", "pass"), None

            return result()

    runner._task = HeldTask()
    scenario = load_scenarios([POOL / "routine_booking.yaml"]).scenarios[0]
    bot = SimpleNamespace(spec="bot.py")
    config = SimulationConfig(executor="ray", ray_endpoints=endpoints)

    async def main(ledger: Ledger) -> list[str]:
        one = lambda: asyncio.create_task(runner(scenario, bot, config, ledger))  # noqa: E731
        first, second = one(), one()
        (url_1, ends_1), (url_2, ends_2) = await sent.get(), await sent.get()
        ends_2.set()  # the second episode ends; the first is still running
        await second
        third = one()
        url_3, ends_3 = await sent.get()
        ends_1.set()
        ends_3.set()
        await asyncio.gather(first, third)
        return [url_1, url_2, url_3]

    with Ledger(tmp_path / "ledger.db") as ledger:
        assert asyncio.run(main(ledger)) == [endpoints[0], endpoints[1], endpoints[1]]
