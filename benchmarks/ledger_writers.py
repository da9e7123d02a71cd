"""Recorder writes into one ledger from 1, 4 and 16 bot processes at once: SQLite vs Postgres.

Each writer process records calls as the recorder does, through the recorder's own writer thread
(`processors.writer.acquire_writer`): per call a session, then per turn a token-exact turn and
its latency row, then the end. It measures what a call pays to hand a write over (`submit_us`,
the pipeline's side: it never waits for the ledger), how long each write takes on the writer
thread (`write_ms`), the writes per second of all writers together, and the writes dropped
(`failed`: the recorder's dropped-write count). The processes start together on one signal.
Postgres runs on a throwaway local cluster (tests.postgres_helpers), so both ledgers share this
machine's disk and cores. Each level runs `--repeats` times, SQLite and Postgres taking turns,
and reports every run and the median run (by writes per second), with the load average: on a
shared machine the other processes' load moves these numbers more than the ledger does. Prints
JSON, and writes it with --out.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WRITERS = (1, 4, 16)
CALLS = 10
"""Calls per writer process."""
TURNS = 6
"""Turns per call: each is two writes (the turn and its latency row)."""


def _quantiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 3), "p95": round(cuts[94], 3), "p99": round(cuts[98], 3)}


def worker(target: str, name: str) -> None:
    """One bot process: open the ledger, say ready, wait for go, record CALLS calls, report."""
    from pipecat_rl.ledger import LatencyRecord, SessionRecord, TurnRecord
    from pipecat_rl.ledger.liveness import writer_identity
    from pipecat_rl.recording.writer import acquire_writer

    writer = acquire_writer(target)
    writer.flush_sync()  # the connection is open before the clock starts
    submit_us: list[float] = []
    write_ms: list[float] = []

    def submit(op: Any, what: str, sid: str) -> None:
        def timed(ledger: Any) -> None:
            start = time.perf_counter()
            op(ledger)
            write_ms.append((time.perf_counter() - start) * 1000)

        start = time.perf_counter()
        writer.submit(timed, what, session_id=sid)
        submit_us.append((time.perf_counter() - start) * 1e6)

    print("ready", flush=True)
    sys.stdin.readline()
    began = time.perf_counter()
    for call in range(CALLS):
        sid = f"{name}-{call}"
        session = SessionRecord(
            id=sid, source="live", started_at=time.time(), metadata={"writer": writer_identity()}
        )
        submit(lambda ledger, s=session: ledger.add_session(s), "session", sid)
        for k in range(TURNS):
            turn = TurnRecord(
                session_id=sid, index=k, adapter="clinic-v1", created_at=time.time(),
                request={"model": "clinic-v1", "messages": [{"role": "user", "content": "hi"}]},
                prompt_token_ids=list(range(200)), completion_token_ids=list(range(40)),
                logprobs=[-0.5] * 40, token_exact=True, generated_text="hello " * 20,
                usage={"prompt_tokens": 200, "completion_tokens": 40},
            )  # fmt: skip
            latency = LatencyRecord(session_id=sid, user_turn=k, v2v_ms=640.0, llm_ttft_ms=90.0)
            submit(lambda ledger, t=turn: ledger.add_turn(t), "turn", sid)
            submit(lambda ledger, lat=latency: ledger.put_latency(lat), "latency", sid)
        end = time.time()
        submit(lambda ledger, s=sid, e=end: ledger.end_session(s, ended_at=e), "end", sid)
    writer.flush_sync(timeout=600)
    wall = time.perf_counter() - began
    writer.release()
    print(json.dumps({"submit_us": submit_us, "write_ms": write_ms, "wall_s": wall,
                      "failed": writer.failed}), flush=True)  # fmt: skip


def level(target: str, writers: int) -> dict[str, Any]:
    """Run `writers` processes at once against `target`; their writes, summed and in quantiles."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", target, f"w{writers}-{i}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for i in range(writers)
    ]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reports = [json.loads(p.communicate(timeout=900)[0].strip().splitlines()[-1]) for p in procs]
    wall = max(r["wall_s"] for r in reports)  # from the signal until the last one drained
    writes = sum(len(r["write_ms"]) for r in reports)
    return {
        "writers": writers,
        "writes": writes,
        "failed": sum(r["failed"] for r in reports),
        "wall_s": round(wall, 3),
        "writes_per_s": round(writes / wall, 1),
        "write_ms": _quantiles([x for r in reports for x in r["write_ms"]]),
        "submit_us": _quantiles([x for r in reports for x in r["submit_us"]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("TARGET", "NAME"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    parser.add_argument("--writers", type=int, nargs="+", default=list(WRITERS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    import psycopg

    from pipecat_rl.ledger import Ledger
    from tests.postgres_helpers import server_binaries, throwaway_cluster

    binaries = server_binaries()
    if binaries is None:
        sys.exit("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    results: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgres": []}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder, throwaway_cluster(*binaries) as server:
        for n in args.writers:
            runs: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgres": []}
            for r in range(args.repeats):
                path = Path(folder) / f"writers-{n}-{r}.db"
                Ledger(path).close()  # created and migrated before the clock starts
                runs["sqlite"].append(level(str(path), n))
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE writers_{n}_{r}")
                url = server.rsplit("/", 1)[0] + f"/writers_{n}_{r}"
                Ledger(url).close()
                runs["postgres"].append(level(url, n))
            for backend, done in runs.items():
                median = sorted(done, key=lambda x: x["writes_per_s"])[len(done) // 2]
                results[backend].append({**median, "runs_writes_per_s": [
                    x["writes_per_s"] for x in done]})  # fmt: skip
            print(json.dumps({"writers": n, **{b: v[-1] for b, v in results.items()}}),
                  file=sys.stderr)  # fmt: skip
    out = {
        "benchmark": "ledger_writers",
        "calls_per_writer": CALLS,
        "turns_per_call": TURNS,
        "writes_per_call": 2 + 2 * TURNS,
        "cpus": os.cpu_count(),
        "load_average_1m": {
            "before": round(load_before[0], 1),
            "after": round(os.getloadavg()[0], 1),
        },
        "results": results,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
