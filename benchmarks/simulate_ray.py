"""Simulated calls per minute, local executor vs Ray at equal cores, and the Ray hop's overhead.

The scripted clinic (its expert bot and the scenarios' scripted callers: no model, so the
episodes are CPU work in Pipecat pipelines) runs `--scenarios` pool scenarios once each per run
through `simulator.run`, on a Ray cluster of `ray start` nodes on loopback (tests.ray_helpers:
1 CPU and a 100 MB object store each). Each level interleaves the two executors, `--rounds`
times, so both see the same machine load:

- `hop`: one core each, one episode at a time: the local executor at concurrency 1 against Ray
  with one 1-CPU node at concurrency 1. With episodes in sequence, a run's wall time minus the
  time spent inside its episodes (`EpisodeResult.duration_s`, timed where the episode ran) is
  what surrounds them; Ray's minus local's, per episode, is the hop (task dispatch and
  serialisation, the node's scratch ledger, the rows' trip back and the driver's write):
  `hop_ms_per_episode`. The wall-time ratio is reported beside it, with each side's mean
  episode time, because the episodes themselves need not take equally long in the two
  processes.
- `equal_cores`: two cores each: the local executor at concurrency 2 (one process, one event
  loop) against Ray with two 1-CPU nodes at concurrency 2.

The driver stays connected to the cluster across runs (connecting is measured once, apart),
and a warm-up run per level is discarded (each worker imports Pipecat and the bot once). The
projection per added node takes the measured per-node rate (Ray, one node, `hop` level) times
N, capped by the driver's write ceiling (60 s / the median time the driver spends writing one
episode's rows): linear in nodes until the one writer saturates. It is a projection, not a
measurement: on this machine every node shares the same cores, so only one and two nodes are
measured. Prints JSON, and writes it with --out.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLINIC = ROOT / "examples" / "clinic"


def _run(executor: str, address: str, concurrency: int, scenarios: Any) -> dict[str, Any]:
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.simulator import Server, SimulationOptions, load_bot, run

    extra = {"executor": "ray", "ray_address": address} if executor == "ray" else {}
    options = SimulationOptions(persona="scripted", repeats=1, concurrency=concurrency, **extra)
    with tempfile.TemporaryDirectory() as folder, Ledger(Path(folder) / "ledger.db") as ledger:
        start = time.perf_counter()
        report = run(scenarios, load_bot(str(CLINIC / "expert.py")), options, ledger,
                     server=Server(needed=False))  # fmt: skip
        wall = time.perf_counter() - start
        sessions = len(ledger.sessions())
    errors = [e.error for e in report.episodes if e.error]
    if errors or sessions != len(report.episodes):
        raise RuntimeError(f"{executor}: {len(errors)} errors ({errors[:1]}), {sessions} sessions")
    in_episodes = sum(e.duration_s for e in report.episodes)
    return {
        "wall_s": round(wall, 3),
        "episodes": len(report.episodes),
        "calls_per_min": round(len(report.episodes) / wall * 60, 2),
        "episode_s_mean": round(in_episodes / len(report.episodes), 3),
        "outside_episodes_s": round(wall - in_episodes, 3),
    }


def _level(name: str, address: str, concurrency: int, scenarios: Any, rounds: int) -> dict:
    _run("ray", address, concurrency, scenarios)  # warm-up: every worker imports the bot once
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    for _ in range(rounds):
        for executor in ("local", "ray"):
            runs[executor].append(_run(executor, address, concurrency, scenarios))
            logger.info(f"{name} {executor}: {runs[executor][-1]}")
    pairs = zip(runs["local"], runs["ray"], strict=True)
    ratios = [on_ray["wall_s"] / here["wall_s"] for here, on_ray in pairs]
    def median(executor: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[executor])

    out = {
        "concurrency": concurrency,
        "local_calls_per_min": median("local", "calls_per_min"),
        "ray_calls_per_min": median("ray", "calls_per_min"),
        "ray_over_local_wall": round(statistics.median(ratios), 3),
        "local_episode_s": median("local", "episode_s_mean"),
        "ray_episode_s": median("ray", "episode_s_mean"),
    }
    if concurrency == 1:  # episodes one after another: what is not an episode is the hop's
        extra = [
            (on_ray["outside_episodes_s"] - here["outside_episodes_s"]) / on_ray["episodes"]
            for here, on_ray in zip(runs["local"], runs["ray"], strict=True)
        ]
        out["hop_ms_per_episode"] = round(statistics.median(extra) * 1000, 1)
    return {**out, "rounds": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=10, help="Pool scenarios per run.")
    parser.add_argument("--rounds", type=int, default=3, help="Runs of each executor per level.")
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="INFO", filter=lambda r: r["name"] == "__main__")

    import ray

    from pipecat_rl.simulator import load_scenarios
    from pipecat_rl.simulator.executor import EpisodeRows
    from tests.ray_helpers import AUTH_OFF, ray_head

    os.environ.update(AUTH_OFF)
    os.environ["LOGURU_LEVEL"] = "WARNING"  # the nodes' workers log as little as the driver
    # Ray renices its workers (+15) under the node's own processes; on a dedicated node that
    # costs nothing, but here they would share two cores with the driver at its priority.
    os.environ["RAY_worker_niceness"] = "0"
    pool = load_scenarios([CLINIC / "handwritten" / "pool"])
    scenarios = pool.model_copy(update={"scenarios": list(pool)[: args.scenarios]})
    write_s: list[float] = []
    write = EpisodeRows.write

    def timed_write(rows: EpisodeRows, ledger: Any) -> bool:  # the driver's write, timed
        start = time.perf_counter()
        try:
            return write(rows, ledger)
        finally:
            write_s.append(time.perf_counter() - start)

    EpisodeRows.write = timed_write  # type: ignore[method-assign]
    load_before = os.getloadavg()
    with ray_head() as cluster:
        start = time.perf_counter()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        connect_s = time.perf_counter() - start
        hop = _level("hop", cluster.address, 1, scenarios, args.rounds)
        cluster.add_node()
        equal = _level("equal_cores", cluster.address, 2, scenarios, args.rounds)
        ray.shutdown()
    per_node = hop["ray_calls_per_min"]
    write_median = statistics.median(write_s)
    ceiling = 60 / write_median
    out = {
        "benchmark": "simulate_ray",
        "workload": f"clinic pool, first {len(scenarios)} scenarios x 1, scripted expert and "
        "scripted callers (no model)",
        "nodes": "ray start on loopback, 1 CPU and a 100 MB object store each",
        "cpu_count": os.cpu_count(),
        "ray_connect_s": round(connect_s, 3),
        "hop": hop,
        "equal_cores": equal,
        "driver_write_ms": {
            "median": round(write_median * 1000, 3),
            "max": round(max(write_s) * 1000, 3),
            "writes": len(write_s),
        },
        "projection": {
            "how": "per-node rate (Ray, 1 node, concurrency 1) x N nodes, capped by the driver's "
            "write ceiling (60 s / median driver write per episode); not measured past 2 nodes",
            "per_node_calls_per_min": per_node,
            "driver_write_ceiling_calls_per_min": round(ceiling, 1),
            "calls_per_min_by_nodes": {
                str(n): round(min(n * per_node, ceiling), 1) for n in (1, 2, 4, 8, 16, 32)
            },
        },
        "load_average_1m": {
            "before": round(load_before[0], 1),
            "after": round(os.getloadavg()[0], 1),
        },
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
