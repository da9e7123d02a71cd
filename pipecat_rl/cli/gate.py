"""`pipecat-rl gate`, `promote` and `rollback`: decide on a candidate adapter, then serve it.

Exit codes (`pipecat_rl.cli.common.EXIT_TABLE`): `gate` exits 0 for PROMOTE, 1 for REJECT and 2
for INCONCLUSIVE, and nothing else does; every other outcome exits with its code in that table (a
bad input file, scores, config, scenarios, receipt or a refused promotion, is EXIT_DATA).

Every receipt the gate writes is recorded in the ledger (`--ledger`, else $PIPECAT_RL_LEDGER,
else ./pipecat-rl.db), which `promote` checks it against; the scenario hashes of the held-out
runs it decided on are recorded there too, so they never train. A gate that fails before it
records anything leaves no new ledger file behind. The verdict goes to stdout; with `--json`
stdout holds only JSON, a refusal included. A receipt folder that already holds a receipt
(`--out`, or the default's name taken within the same second) is refused before the gate runs,
unless `--force` (`cli.output.output_folder`).

`--forks PATH` runs the pair on forks of recorded calls (`pipecat-rl ledger fork`) instead of
`--scenarios`: the same recorded prefix and the same seeds after it for both policies, and the
receipt page shows each fork's prefix and the two continuations side by side.
"""

import contextlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from pipecat_rl import defaults
from pipecat_rl.cli.common import (
    cli_errors,
    config_file,
    console,
    existing,
    new_ledger_kept_if_used,
    print_json,
    results,
    writable_folder,
)
from pipecat_rl.cli.executor import ExecutorOpt, RayAddressOpt, RayEndpointOpt, executor_fields
from pipecat_rl.cli.ledger import LedgerOpt, open_ledger
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.cli.output import output_folder
from pipecat_rl.cli.progress import CallProgress, ProgressMode, ProgressOpt
from pipecat_rl.cli.sampling import SampleByOpt, SampleOpt, sampled
from pipecat_rl.errors import ConfigError, GateError
from pipecat_rl.gate import (
    Evidence,
    FromLedger,
    FromScores,
    GateReceipt,
    LiveMove,
    Simulated,
    load_gate_config,
    promote,
    resolve_policy,
    rollback,
    run_gate,
)
from pipecat_rl.gate.lineage import live_note
from pipecat_rl.ledger import resolve_ledger_path
from pipecat_rl.scenarios import MAX_RUNS, load_scenarios
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.simulator.audio import check_transport
from pipecat_rl.simulator.options import GATE_REPEATS, MAX_SEED, SimulationOptions

_VERDICT_STYLE = {"PROMOTE": "green", "REJECT": "red", "INCONCLUSIVE": "yellow"}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--llm-url",
        help=f"Running vLLM server to load the adapter into (default: ${LLM_URL_ENV}; with "
        "neither, only the live pointer moves).",
        show_default=False,
    ),
]


def _default_out(candidate: str, incumbent: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{stamp}-{candidate}-vs-{incumbent}")
    return Path("receipts") / name


def _evidence(
    *,
    scenarios: Path | None,
    forks: bool,
    bot: str | None,
    from_ledger: bool,
    scores: Path | None,
    heldout_set: str | None,
    source: Literal["gate", "simulate"] | None,
    mode: Literal["text", "audio"] | None,
    transport: Literal["local", "webrtc"],
    options: SimulationOptions,
    llm_url: str | None,
    progress_mode: ProgressMode,
    sample: int | None = None,
    sample_by: list[str] | None = None,
) -> tuple[Evidence, CallProgress | None]:
    """What the gate decides from: a scores file, the ledger, or its own paired runs.

    Its own runs come with their progress, after a line saying how many calls, on which channel.
    """
    if scenarios is not None:
        existing(scenarios, "--forks" if forks else "--scenarios")
    if (sample is not None or sample_by) and (scores is not None or from_ledger):
        raise typer.BadParameter(
            "--sample chooses the scenarios the gate runs: use it with --scenarios PATH --bot BOT",
            param_hint="--sample",
        )
    if scores is not None:
        return FromScores(existing(scores, "--scores"), files=scenarios), None
    if from_ledger:
        return FromLedger(heldout_set=heldout_set, source=source, files=scenarios), None
    if scenarios is None or bot is None:
        raise ConfigError(
            "to run the paired simulations name the held-out scenarios and the bot with "
            "--scenarios PATH --bot BOT, or decide from recorded runs with --from-ledger or "
            "--scores FILE.jsonl."
        )
    if mode is None and forks:  # a fork replays what the agent heard as text
        mode = "text"
    if mode is None:  # the gate's own runs: audio when it can, so latency has evidence
        from pipecat_rl.simulator.audio.services import audio_available

        mode = "audio" if audio_available() else "text"
    check_transport([mode], transport)  # before the server starts
    from pipecat_rl.simulator import Server, load_bot  # imports Pipecat: only to simulate
    from pipecat_rl.simulator.runner import total_episodes

    loaded = sampled(load_scenarios([scenarios]), sample, sample_by)
    not_forks = [s.id for s in loaded if s.fork is None] if forks else []
    if not_forks:
        raise ConfigError(
            f"--forks {scenarios}: {', '.join(not_forks[:5])} is no fork of a recorded call; "
            "write forks with `pipecat-rl ledger fork`, or pass plain scenarios to --scenarios"
        )
    pool = [s.id for s in loaded if s.split != "heldout"] if forks else []
    if pool:
        raise ConfigError(
            f"--forks {scenarios}: {', '.join(pool[:5])} is not held out (its call was not): "
            "the gate decides on held-out runs only; compare a pool fork's policies with "
            "`pipecat-rl simulate FORK --adapter NAME`"
        )
    options = options.model_copy(update={"mode": mode, "transport": transport})
    calls = 2 * total_episodes(loaded, options)
    what = (
        "audio: the full pipeline, the bot's own STT, LLM and TTS, as callers hear it"
        if mode == "audio"
        else "text: the LLM stages only, no voice-to-voice latency"
    )
    console.print(
        f"gate: {calls} calls ({len(loaded)} held-out scenario(s) x "
        f"{options.repeats or 'their own'} run(s) x 2 policies), in {what}"
        + (" (--mode text for a quicker, LLM-only gate)" if mode == "audio" else ""),
        markup=False, soft_wrap=True,
    )  # fmt: skip
    shown = CallProgress(calls, "gate", progress_mode)
    return Simulated(
        scenarios=loaded, bot=load_bot(bot), options=options, server=Server(url=llm_url),
        files=scenarios, on_episode=shown.ended,
    ), shown  # fmt: skip


def gate(
    candidate: Annotated[str, typer.Option(help="Adapter to gate (or `base`).")],
    incumbent: Annotated[
        str, typer.Option(help="Adapter to beat: a name, `base`, or `live` (the live pointer).")
    ] = "live",
    scenarios: Annotated[
        Path | None,
        typer.Option(help="Held-out scenario file or folder (run it, or hash it into receipts)."),
    ] = None,
    forks: Annotated[
        Path | None,
        typer.Option(
            "--forks", metavar="PATH",
            help="Held-out forks (`ledger fork` files, or their folder) to run both policies on.",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(min=1, max=MAX_RUNS, help=f"Runs per scenario and policy (<= {MAX_RUNS})."),
    ] = GATE_REPEATS,
    sample: SampleOpt = None,
    sample_by: SampleByOpt = None,
    bot: Annotated[
        str | None,
        typer.Option(help="The bot to simulate (as for `pipecat-rl simulate --bot`)."),
    ] = None,
    llm_url: Annotated[
        str | None,
        typer.Option(
            "--llm-url", envvar=LLM_URL_ENV,
            help="Server to simulate against; without it the embedded vLLM is started.",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Simulated calls at once.")
    ] = defaults.CONCURRENCY,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Cap the agent's replies if its bot sets none.")
    ] = None,
    persona: Annotated[
        Literal["llm", "scripted"], typer.Option(help="LLM persona, or the scenarios' scripts.")
    ] = "llm",
    mode: Annotated[
        Literal["text", "audio"] | None,
        typer.Option(help="Simulation channel (default: audio when the audio extra is installed)."),
    ] = None,
    transport: Annotated[
        Literal["local", "webrtc"],
        typer.Option(
            help="Audio transport of the gate's own runs: the local paced pair, or SmallWebRTC "
            "over loopback (webrtc: Opus and jitter buffers, as a browser caller hears it)."
        ),
    ] = "local",
    from_ledger: Annotated[
        bool, typer.Option("--from-ledger", help="Decide from held-out runs in the ledger.")
    ] = False,
    scores: Annotated[
        Path | None, typer.Option(help="Decide from a scores JSONL file (one line per run).")
    ] = None,
    ledger: LedgerOpt = None,
    heldout_set: Annotated[
        str | None, typer.Option(help="Held-out set id to read from the ledger.")
    ] = None,
    source: Annotated[
        Literal["gate", "simulate"] | None,
        typer.Option(help="Only ledger sessions of this source."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML/JSON file of thresholds and prices (see docs).")
    ] = None,
    min_delta: Annotated[
        float | None, typer.Option(help="CI lower bound must exceed this. (default 0.02)")
    ] = None,
    tie_band: Annotated[
        float | None, typer.Option(help="|delta| within this is a tie. (default 0.05)")
    ] = None,
    max_regressions: Annotated[
        int | None, typer.Option(help="Most scenarios the candidate may lose. (default 1)")
    ] = None,
    p95_budget_ms: Annotated[
        float | None, typer.Option(help="Absolute v2v P95 budget. (default 1500)")
    ] = None,
    p95_margin_ms: Annotated[
        float | None, typer.Option(help="Allowed P95 slowdown vs incumbent. (default 100)")
    ] = None,
    regression_alpha: Annotated[
        float | None,
        typer.Option(help="Family level of the per-scenario regression tests. (default 0.05)"),
    ] = None,
    resamples: Annotated[
        int | None,
        typer.Option(help="Latency bootstrap resamples, 10000..200000. (default 10000)"),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(min=0, max=MAX_SEED, help="Bootstrap seed. (default 0)")
    ] = None,
    require_guard: Annotated[
        bool | None,
        typer.Option(
            "--require-guard/--no-require-guard",
            help="Fail when no training guard can be read. (default: no)",
            show_default=False,
        ),
    ] = None,
    require_latency: Annotated[
        bool | None,
        typer.Option(
            "--require-latency/--no-require-latency",
            help="Without v2v samples, latency checks cannot pass. (default: yes)",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for receipt.json/.md/.html (default ./receipts/…)")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace the receipt in an --out folder that already holds one."
        ),
    ] = False,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_endpoints: RayEndpointOpt = None,
    progress_mode: ProgressOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Decide PROMOTE / REJECT / INCONCLUSIVE for a candidate on held-out scenarios."""
    with cli_errors(json_out):
        settings = load_gate_config(
            config if config is None else config_file(config, "--config"),
            min_delta=min_delta,
            tie_band=tie_band,
            max_regressions=max_regressions,
            regression_alpha=regression_alpha,
            p95_budget_ms=p95_budget_ms,
            p95_margin_ms=p95_margin_ms,
            resamples=resamples,
            seed=seed,
            require_guard=require_guard,
            require_latency=require_latency,
        )
        if from_ledger and scores is not None:
            raise ConfigError("choose one input: --from-ledger or --scores FILE, not both.")
        if forks is not None and (scenarios is not None or from_ledger or scores is not None):
            raise ConfigError(
                "--forks runs the pair on forks: it takes neither --scenarios, --from-ledger "
                "nor --scores"
            )
        if out is not None:  # refused before the gate runs, not after
            output_folder(
                writable_folder(out, "--out"), "--out", force=force,
                ledger=resolve_ledger_path(ledger),
            )  # fmt: skip
        evidence, shown = _evidence(
            scenarios=forks or scenarios, forks=forks is not None, bot=bot,
            from_ledger=from_ledger, scores=scores,
            heldout_set=heldout_set, source=source, mode=mode, transport=transport,
            options=SimulationOptions(
                persona=persona, seed=settings.seed, repeats=repeats,
                concurrency=concurrency, max_tokens=max_tokens,
                **executor_fields(executor, ray_address, ray_endpoints),
            ),
            llm_url=llm_url, progress_mode="none" if json_out else progress_mode,
            sample=sample, sample_by=sample_by,
        )  # fmt: skip
        path = resolve_ledger_path(ledger)
        opened = open_ledger(ledger) if from_ledger else new_ledger_kept_if_used(path)
        with opened as store:
            names = [resolve_policy(store, n) for n in (candidate, incumbent)]
            for flag, requested in (("--candidate", candidate), ("--incumbent", incumbent)):
                if (note := live_note(store, flag, requested)) is not None:
                    console.print(note, markup=False, soft_wrap=True)
            folder = out or output_folder(_default_out(*names), "the default --out", force=force)
            with shown or contextlib.nullcontext():
                done = run_gate(store, candidate, incumbent, evidence, settings, folder)
    receipt, paths = done.receipt, done.paths
    _report(receipt, paths["json"].parent, json_out)
    raise typer.Exit(receipt.exit_code)


def _report(receipt: GateReceipt, folder: Path, json_out: bool) -> None:
    """The verdict's sentence, the reasons of the checks that held it back, and where it lies."""
    style = _VERDICT_STYLE[receipt.verdict]
    out = results(json_out)
    rest = receipt.reason.removeprefix(f"{receipt.verdict}:")
    out.print(f"[bold {style}]{receipt.verdict}[/bold {style}]:{escape(rest)}")
    held = {"fail", "uncertain"}
    for check, reason in zip(receipt.checks, receipt.reasons, strict=False):
        if check.status in held:
            out.print(f"  - {reason}", markup=False)
    out.print(f"receipt: {folder}/receipt.json, receipt.md, receipt.html", markup=False)
    if json_out:
        print_json(receipt.model_dump(mode="json"))


def _admin(llm_url: str | None) -> VLLMAdmin | None:
    url = llm_url or os.environ.get(LLM_URL_ENV)
    return VLLMAdmin(url) if url else None


def _report_move(verb: str, move: LiveMove, json_out: bool) -> None:
    results(json_out).print(
        f"[green]{verb}[/green] live: {move.previous or 'nothing'} -> {move.adapter}"
        + (
            f" (LLM server not touched: pass --llm-url or set {LLM_URL_ENV} to load it there)"
            if move.server == "not_touched"
            else f" (server: {move.server.replace('_', ' ')})"
        )
    )
    if json_out:
        print_json(move.model_dump(mode="json"))


def promote_command(
    receipt: Annotated[Path, typer.Argument(help="A receipt.json (or its folder) saying PROMOTE.")],
    ledger: LedgerOpt = None,
    llm_url: UrlOpt = None,
    allow_scores_receipt: Annotated[
        bool,
        typer.Option(
            "--allow-scores-receipt",
            help="Promote a receipt gated from a --scores file (results the gate did not run).",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Load a gated candidate into the running server and make it live."""
    with cli_errors(json_out), open_ledger(ledger) as store:
        move = promote(
            existing(receipt, "RECEIPT"), store, _admin(llm_url),
            allow_scores_receipt=allow_scores_receipt,
        )  # fmt: skip
    _report_move("promoted", move, json_out)


def rollback_command(
    ledger: LedgerOpt = None, llm_url: UrlOpt = None, json_out: JsonOpt = False
) -> None:
    """Make the previously live adapter live again (loading it into the server if needed)."""
    with cli_errors(json_out), open_ledger(ledger) as store:
        target = store.rollback_target()
        try:
            move = rollback(store, _admin(llm_url))
        except GateError as e:
            if target is None:  # nothing to roll back to: the
                raise ConfigError(str(e)) from e  # verb does not apply, no file is wrong
            raise
    _report_move("rolled back", move, json_out)


def register(app: typer.Typer) -> None:
    """Add `gate`, `promote` and `rollback` to the top-level app."""
    app.command("gate")(gate)
    app.command("promote")(promote_command)
    app.command("rollback")(rollback_command)
