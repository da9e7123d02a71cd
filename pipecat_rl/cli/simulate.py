"""`pipecat-rl simulate`: run the user's bot against persona callers and record every call.

Exit codes (`cli.common.EXIT_TABLE`): 0 when the harness ran every episode (whatever the agent
scored), unless `--fail-under RATE` is given and the pass rate is below it (1, for CI, as a
failed test run); 64 for bad flags, a path that does not exist, a `simulator:`/`judge:` block we
cannot reach offline, or a bot LLM service that cannot be served; 65 for bad scenario files; 69
when the LLM server failed or went away mid-run (the episodes not yet started are reported
`not_run`), or nothing answers at `--bot-url` when the run starts; 70 when episodes could not
run to their end (harness errors, or a session the ledger could not fully write). The result
table goes to stdout, the progress bar to stderr.

`--bot-url URL` calls a bot that already runs (a deployment, or Pipecat's runner: `python bot.py
-t websocket` or `-t webrtc`) instead of importing `--bot`: audio calls over its WebSocket (ws://)
or SmallWebRTC (http://), recorded from the caller's side only, its world unverified, never
trained on (`simulator.remote`).

`--by AXIS` (repeatable; `all`: every axis) adds the hot-spot tables of a scenario matrix after
the per-scenario table: pass rate, failures, unauthorised writes (hard checks broken) and labels
per value of each axis and per pair of values (`scoring.hot_spots`; runs of scenarios without
axes are left out and counted). `--json` always carries `hotspots`: by `--by`, else every axis.

For CI, as pytest and `pipecat eval` do: `--junit-xml FILE` writes one test case per scenario x
repeat (`simulator.junit`), through `cli.output` (atomic, never over the ledger; a symlink, device
or SQLite file needs `--force`), even when the run then exits non-zero; `-v` prints each call's
transcript (caller and agent lines, tool calls, its end) to stderr as the call ends, each line
prefixed with its scenario and repeat, so stdout keeps the table or `--json`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipecat_rl import defaults
from pipecat_rl.cli import common
from pipecat_rl.cli.common import (
    EXIT_FAILURE,
    EXIT_NO,
    EXIT_UNAVAILABLE,
    cli_errors,
    console,
    error_line,
    existing,
    print_json,
    print_table,
    results,
    writable_folder,
)
from pipecat_rl.cli.executor import ExecutorOpt, RayAddressOpt, RayEndpointOpt, executor_fields
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.cli.output import output_file, written
from pipecat_rl.cli.progress import CallProgress, ProgressMode, ProgressOpt
from pipecat_rl.cli.sampling import SampleByOpt, SampleOpt, sampled
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, resolve_ledger_path
from pipecat_rl.scenarios import MAX_RUNS, ScenarioSet, axes_of, load_scenarios
from pipecat_rl.scenarios.loading import select_scenarios
from pipecat_rl.scoring import (
    VIOLATIONS,
    AxisRun,
    HotSpots,
    SessionOutcome,
    hot_spots,
    turntaking,
)
from pipecat_rl.scoring.hotspots import DEFAULT_MIN_RUNS, axes_seen
from pipecat_rl.simulator.audio import check_recording, check_transport
from pipecat_rl.simulator.junit import call_lines, case_name, junit_xml
from pipecat_rl.simulator.options import DEFAULT_JUDGE_TIMEOUT_S, MAX_SEED, SimulationOptions
from pipecat_rl.simulator.world import World

if TYPE_CHECKING:  # the runner imports Pipecat: only when a simulation really runs
    from pipecat_rl.simulator.lines import CallLine
    from pipecat_rl.simulator.runner import EpisodeResult, SimulationReport
    from pipecat_rl.simulator.simulation import Server


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _table(report: "SimulationReport", mode: str = "") -> Table:
    caption = turntaking.summary([e.turn_taking for e in report.episodes])
    table = Table(
        title=f"simulation {mode}".strip(), title_justify="left",
        caption=caption, caption_justify="left",  # audio calls' turn-taking, pooled
    )  # fmt: skip
    for column in ("scenario", "split", "pass", "score", "P50 ms", "P95 ms", "labels"):
        table.add_column(
            column, justify="right" if column in ("pass", "score") else "left",
            no_wrap=column != "labels",  # ids and numbers are copied whole
        )  # fmt: skip
    for s in report.summaries:
        rate = "—" if s.pass_rate is None else f"{s.passes}/{s.verified}"
        labels = ", ".join(f"{k}×{v}" for k, v in sorted(s.labels.items())) or ""
        if s.errors:
            labels = f"[red]error×{s.errors}[/red] " + labels
        score = "—" if s.mean_score is None else f"{s.mean_score:.2f}"
        table.add_row(
            escape(s.scenario_id), s.split, rate, score,  # an id may hold [axis=value]
            _ms(s.latency_p50_ms), _ms(s.latency_p95_ms), labels,
        )  # fmt: skip
    return table


def _hot_spots(report: "SimulationReport", by: list[str] | None, min_runs: int) -> HotSpots:
    """The report's runs per axis value and pair (unauthorised writes: hard checks broken)."""
    return hot_spots(
        (
            AxisRun(
                e.scenario_id,
                axes_of(e.scenario_id),
                e.passed,
                e.labels,
                unauthorized_writes=int(e.reward_parts.get(VIOLATIONS, 0)),
            )
            for e in report.episodes
            if e.outcome != SessionOutcome.NOT_RUN  # never started: no figure counts it
        ),
        by,
        min_runs=min_runs,
    )


def _hot_spot_tables(spots: HotSpots, mode: str = "") -> list[Table]:
    """One table per axis value, one per pair of values: worst first, `few` cells last."""
    tables = []
    for kind, rows in (("axis value", spots.values), ("pair of axes", spots.pairs)):
        if not rows:
            continue
        table = Table(title=f"hot spots by {kind} {mode}".strip(), title_justify="left")
        for column in ("cell", "pass", "rate", "fail", "writes", "scenarios", "labels"):
            table.add_column(
                column, justify="left" if column in ("cell", "labels") else "right",
                no_wrap=column != "labels",
            )  # fmt: skip
        for r in rows:
            rate = "—" if r.pass_rate is None else f"{r.pass_rate:.0%}"
            table.add_row(
                escape(r.name), f"{r.passes}/{r.verified}",
                f"[dim]{rate} (few)[/dim]" if r.few else rate, str(r.failures),
                f"[red]{r.unauthorized_writes}[/red]" if r.unauthorized_writes else "0",
                str(r.scenarios), escape(", ".join(f"{k}×{v}" for k, v in r.labels.items())),
            )  # fmt: skip
        tables.append(table)
    return tables


def _print_hot_spots(out: Console, spots: HotSpots, mode: str = "") -> None:
    if not spots.axes:
        out.print(f"hot spots: no scenario came from a matrix ({spots.without_axes} runs)")
        return
    for table in _hot_spot_tables(spots, mode):
        print_table(out, table)
    left_out = f"; {spots.without_axes} run(s) of scenarios without axes left out"
    out.print(
        f"hot spots: worst first; cells under {spots.min_runs} verified runs are marked few and "
        f"listed last{left_out if spots.without_axes else ''}"
    )


def _by_axes(by: list[str], scenarios: ScenarioSet) -> list[str] | None:
    """`--by` as the axes to group by (None: every axis), each one a scenario has."""
    known = axes_seen(AxisRun(s.id, axes_of(s.id), None) for s in scenarios)
    if not by or "all" in by:
        return None
    unknown = [a for a in by if a not in known]
    if unknown:
        have = f"their axes: {', '.join(known)}" if known else "none came from a matrix"
        raise ConfigError(
            f"--by {unknown[0]}: no scenario has that axis ({have}); name one of theirs, or all"
        )
    return by


def _positive(seconds: float) -> float:
    if not seconds > 0:  # NaN included
        raise typer.BadParameter(f"{seconds:g} is not a number of seconds above 0")
    return seconds


def _say(case: str, mode: str, text: str) -> None:
    """-v: one line of a call on stderr, saying whose call it is (calls run side by side)."""
    prefix = case + ("" if mode == "text" else f" ({mode})")
    console.print(f"{prefix} {text}", markup=False, highlight=False, soft_wrap=True)


def _run(
    scenarios: ScenarioSet,
    bot: "str | _Remote",
    options: SimulationOptions,
    policy: str,
    ledger_path: Path | str,
    server: "Server",
    progress_mode: ProgressMode,
) -> "SimulationReport":
    from pipecat_rl.simulator import load_bot, run
    from pipecat_rl.simulator.remote import RemoteBot
    from pipecat_rl.simulator.runner import total_episodes

    entry = RemoteBot(bot.url) if isinstance(bot, _Remote) else load_bot(bot)
    if server.needed and server.url is None:
        console.print("no --llm-url: starting the embedded vLLM server…")
    progress = CallProgress(total_episodes(scenarios, options), "simulating", progress_mode)
    verbose = common.verbosity >= 1  # read now: the app's callback sets it
    heard: set[str] = set()  # calls whose lines came live (not those run on Ray)

    def said(line: "CallLine") -> None:
        heard.add(line.case)
        _say(line.case, line.mode, line.text)

    with Ledger(ledger_path) as ledger, progress:

        def ended(episode: "EpisodeResult") -> None:
            progress.ended(episode)
            if verbose:  # the call's end, or the whole call where none of it came live
                case = case_name(episode)
                for text in call_lines(episode)[-1 if case in heard else 0 :]:
                    _say(case, episode.mode, text)

        return run(
            scenarios, entry, options, ledger, policies=[policy], server=server,
            on_episode=ended, on_line=said if verbose else None,
        )  # fmt: skip


def simulate_command(
    scenarios: Annotated[
        list[Path],
        typer.Argument(
            metavar="SCENARIO", help="Scenario files or folders (searched recursively)."
        ),
    ],
    bot: Annotated[
        str | None,
        typer.Option(
            "--bot", show_default=False,
            help="The bot: path/to/bot.py or package.module, with :function (default run_bot).",
        ),
    ] = None,
    bot_url: Annotated[
        str | None,
        typer.Option(
            "--bot-url", metavar="URL", show_default=False,
            help="Instead of --bot: call a bot already running at this URL, as an audio call "
            "recorded from the caller's side only; its world is not verified and its sessions "
            "never train. Pipecat's runner serves ws://HOST:7860/ws-client (-t websocket) and "
            "http://HOST:7860/api/offer (-t webrtc: SmallWebRTC, a bot on this machine).",
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats", "-r", min=1, max=MAX_RUNS,
            help=f"Runs per scenario, at most {MAX_RUNS} (default: its `runs`).",
        ),
    ] = None,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario", "-s", metavar="NAME",
            help="Run only this scenario (an id, or a template's name); repeatable.",
        ),
    ] = None,
    pattern: Annotated[
        list[str] | None,
        typer.Option(
            "--pattern", "-p", metavar="GLOB",
            help="Run only scenarios whose id matches this glob (e.g. '*cancel*'); repeatable.",
        ),
    ] = None,
    sample: SampleOpt = None,
    sample_by: SampleByOpt = None,
    retired_k: Annotated[
        str | None, typer.Option("-k", hidden=True, help="Retired: -r is repeats.")
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, max=256, help="Episodes at once.")
    ] = defaults.CONCURRENCY,
    adapter: Annotated[
        str | None, typer.Option("--adapter", help="Adapter the agent is served (default base).")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode", show_default=False,
            help="Channel: text (the default), audio (paced speech, offline Whisper + Piper), or "
            "text,audio (both, same seeds, and the channel gap per failure label); --bot-url "
            "calls are audio.",
        ),
    ] = None,
    transport: Annotated[
        Literal["local", "webrtc"],
        typer.Option(
            "--transport",
            help="Audio transport: the in-process paced pair (local), or SmallWebRTC over "
            "loopback (webrtc: Opus, jitter buffer; needs the [webrtc] extra).",
        ),
    ] = "local",
    stt: Annotated[
        Literal["whisper", "deepgram"] | None,
        typer.Option("--stt", help="Audio: who hears the caller (deepgram: DEEPGRAM_API_KEY)."),
    ] = None,
    tts: Annotated[
        Literal["piper", "cartesia"] | None,
        typer.Option("--tts", help="Audio: who speaks (cartesia: CARTESIA_API_KEY)."),
    ] = None,
    record_audio: Annotated[
        Path | None,
        typer.Option(
            "--record-audio", metavar="DIR", show_default=False,
            help="Audio: write each call as a stereo WAV in DIR (created), caller left, agent "
            "right, as heard on the line; `ledger show` names the file.",
        ),
    ] = None,
    gap_html: Annotated[
        Path | None,
        typer.Option(
            "--gap-html", show_default=False,
            help="With --mode text,audio: write the channel-gap page here (default: none).",
        ),
    ] = None,
    persona: Annotated[
        Literal["llm", "scripted"],
        typer.Option("--persona", help="LLM persona, or the scenarios' script: rules."),
    ] = "llm",
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="Run seed; episodes derive theirs.")
    ] = 0,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", min=1, help="Cap the agent's replies if its bot sets none."),
    ] = None,
    llm_url: Annotated[
        str | None,
        typer.Option(
            "--llm-url",
            envvar=LLM_URL_ENV,
            help="A running OpenAI-compatible server; without it the embedded vLLM is started.",
        ),
    ] = None,
    no_server: Annotated[
        bool,
        typer.Option(
            "--no-server",
            help="Start no LLM server (a scripted persona and a bot that needs no served model).",
        ),
    ] = False,
    model: Annotated[
        str, typer.Option("--model", help="Model the embedded server serves.")
    ] = defaults.MODEL,
    persona_llm_url: Annotated[
        str | None,
        typer.Option(
            "--persona-llm-url",
            help="OpenAI-compatible server for the LLM persona (overrides `simulator:` blocks).",
        ),
    ] = None,
    persona_model: Annotated[
        str | None,
        typer.Option("--persona-model", help="The persona's model (default base / the block's)."),
    ] = None,
    judge_llm_url: Annotated[
        str | None,
        typer.Option(
            "--judge-llm-url",
            help="OpenAI-compatible server for the judge (overrides `judge.eval:` blocks).",
        ),
    ] = None,
    judge_model: Annotated[
        str | None,
        typer.Option("--judge-model", help="The judge's model (default base / the block's)."),
    ] = None,
    judge_timeout: Annotated[
        float,
        typer.Option(
            "--judge-timeout", callback=_positive, metavar="SECONDS",
            help="How long the judge may take over each answer; one it misses is unscored.",
        ),
    ] = DEFAULT_JUDGE_TIMEOUT_S,
    fail_under: Annotated[
        float | None,
        typer.Option(
            "--fail-under", min=0, max=1, metavar="RATE", show_default=False,
            help="Exit 1 when the pass rate (passes over verified runs) is below RATE, as CI "
            "wants a failed evaluation to fail.",
        ),
    ] = None,
    ledger: Annotated[
        str | None,  # a Path would fold postgresql:// into postgresql:/
        typer.Option("--ledger", help="Ledger file or URL (default: $PIPECAT_RL_LEDGER)."),
    ] = None,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_endpoints: RayEndpointOpt = None,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by", metavar="AXIS", show_default=False,
            help="After the table: pass rate, failures and writes per value of a scenario "
            "matrix's axis, and per pair of the axes given (repeatable; all: every axis).",
        ),
    ] = None,
    min_runs: Annotated[
        int,
        typer.Option(
            "--min-runs", min=1,
            help="Hot-spot cells with fewer verified runs are marked few, not ranked.",
        ),
    ] = DEFAULT_MIN_RUNS,
    junit: Annotated[
        Path | None,
        typer.Option(
            "--junit-xml", metavar="FILE", show_default=False,
            help="Also write a JUnit XML report for CI: one test case per scenario x repeat "
            "(a failed verdict a failure, a harness error an error, an unverified run skipped).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write --junit-xml even where it names a symlink (the file it names is "
            "replaced), a device or FIFO, or a SQLite file; never over the ledger, or a folder.",
        ),
    ] = False,
    progress_mode: ProgressOpt = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Simulate calls to BOT for every scenario, write them to the ledger, print a table.

    With -v, each call's transcript goes to stderr line by line as the call goes.
    """
    with cli_errors(json_out):
        target = _target(bot, bot_url, mode, transport, executor)
        modes = _modes(mode or ("audio" if bot_url else "text"), transport)
        if gap_html is not None:
            writable_folder(gap_html, "--gap-html")
        if junit is not None:  # refused before any call runs, not after an hour of them
            junit = output_file(
                writable_folder(junit, "--junit-xml"), "--junit-xml", force=force,
                ledger=resolve_ledger_path(ledger),
            )  # fmt: skip
        if retired_k is not None:  # pytest's -k filters; ours was repeats: say so, run nothing
            raise ConfigError(
                "-k is retired: -r/--repeats N sets runs per scenario, and -s/--scenario NAME or "
                "-p/--pattern GLOB chooses scenarios"
            )
        loaded = sampled(select_scenarios(
            load_scenarios([existing(path, "SCENARIO") for path in scenarios]),
            scenario or (), pattern or (),
        ), sample, sample_by)  # fmt: skip
        axes = _by_axes(by or [], loaded)
        for scenario in loaded:  # a world that cannot be built is a bad file: say so up front
            World(scenario).close()
        from pipecat_rl.simulator import Server
        from pipecat_rl.simulator.runner import check_endpoints

        record_audio = check_recording(modes, record_audio)  # made and writable, before any call
        options = SimulationOptions(
            persona=persona, mode=modes[0], seed=seed, repeats=repeats, concurrency=concurrency,
            max_tokens=max_tokens, persona_llm_url=persona_llm_url, persona_model=persona_model,
            judge_llm_url=judge_llm_url, judge_model=judge_model, judge_timeout_s=judge_timeout,
            stt=stt, tts=tts, record_audio=record_audio,
            **executor_fields(executor, ray_address, ray_endpoints),
        )  # fmt: skip
        check_endpoints(loaded, options, llm_url)  # before any server starts: fail fast
        server = Server(url=llm_url, model=model, needed=not (no_server or bot_url))
        if bot_url:
            from pipecat_rl.simulator.remote import announce

            console.print(announce(bot_url), markup=False, soft_wrap=True)
        reports = []
        for channel in modes:  # text first, then audio: same scenarios, seeds and adapter
            run_options = options.model_copy(
                update={"mode": channel, "transport": transport if channel == "audio" else "local"}
            )
            path = resolve_ledger_path(ledger)
            shown: ProgressMode = "none" if json_out else progress_mode
            reports.append(
                _run(loaded, target, run_options, adapter or "base", path, server, shown)
            )
            if reports[-1].server_gone:
                break  # no second channel against a server that is gone
        if junit is not None:  # before any exit code below: a red run is when CI needs it
            _write_junit(junit, reports)
    spots = [_hot_spots(r, axes, min_runs) for r in reports]
    if len(reports) == 2:  # --mode text,audio: both tables and the channel gap
        _report_gap(
            reports[0], reports[1], gap_html, json_out, (spots[0], spots[1]), shown=bool(by)
        )
    elif json_out:
        print_json({**reports[0].to_json(), "hotspots": spots[0].model_dump()})
    else:
        out = results()
        print_table(out, _table(reports[0]))
        if by:
            _print_hot_spots(out, spots[0])
        if loaded.heldout_set_id:
            out.print(f"held-out set: {loaded.heldout_set_id}")
        out.print(f"{len(reports[0].episodes)} episodes in {reports[0].wall_s:.1f} s")
    gone = next((r for r in reports if r.server_gone), None)
    if gone is not None:
        error_line(
            f"{gone.server_gone}; {gone.not_run} episode(s) not run (nothing was written "
            "for them); once the server answers again, re-run"
        )  # the first part says what to fix: a dead server, or a judge that is misnamed
        raise typer.Exit(EXIT_UNAVAILABLE)
    failed = [e for r in reports for e in r.episodes if e.outcome == SessionOutcome.ERROR]
    if failed:
        console.print(
            f"[red]{len(failed)} episode(s) could not run[/red]; first: "
            f"{failed[0].scenario_id}: {failed[0].error}"
        )
        raise typer.Exit(EXIT_FAILURE)
    if fail_under is not None:
        _check_pass_rate(reports, fail_under)


def _write_junit(path: Path, reports: list["SimulationReport"]) -> None:
    """Every channel's episodes as one JUnit XML file, written atomically (`cli.output`)."""
    episodes = [e for r in reports for e in r.episodes]
    with written(path) as f:
        f.write(junit_xml(episodes, wall_s=sum(r.wall_s for r in reports)))
    console.print(f"JUnit XML: {path} ({len(episodes)} test cases)", markup=False, soft_wrap=True)


def _check_pass_rate(reports: list["SimulationReport"], fail_under: float) -> None:
    """Exit 1 when a channel's pass rate (passes over verified runs) is below `fail_under`."""
    for report in reports:
        verdicts = [e.passed for e in report.episodes if e.passed is not None]
        channel = f" ({report.episodes[0].mode})" if len(reports) > 1 and report.episodes else ""
        if not verdicts:
            error_line(f"--fail-under {fail_under:g}: no run was verified{channel}, so none passed")
            raise typer.Exit(EXIT_NO)
        rate = sum(verdicts) / len(verdicts)
        if rate < fail_under:
            error_line(
                f"pass rate {rate:.3f}{channel} ({sum(verdicts)}/{len(verdicts)} verified runs) "
                f"is below --fail-under {fail_under:g}"
            )
            raise typer.Exit(EXIT_NO)


@dataclass(frozen=True)
class _Remote:
    """`--bot-url`: a bot to call where it runs (its flags checked before the run starts)."""

    url: str


def _target(
    bot: str | None, bot_url: str | None, mode: str | None, transport: str, executor: str
) -> "str | _Remote":
    """The bot to simulate: `--bot`'s spec, or `--bot-url`'s bot with the flags it allows."""
    if (bot is None) == (bot_url is None):
        raise ConfigError("give the bot to simulate: --bot path/to/bot.py, or --bot-url URL")
    if bot_url is None:
        return str(bot)
    from pipecat_rl.simulator.remote import transport_of

    transport_of(bot_url)  # a scheme that names neither WebSocket nor SmallWebRTC
    wrong = [
        flag
        for flag, given in (
            (f"--mode {mode}", mode not in (None, "audio")),
            (f"--transport {transport}", transport != "local"),
            (f"--executor {executor}", executor != "local"),
        )
        if given
    ]
    if wrong:
        raise ConfigError(
            f"--bot-url calls the bot as an audio call over what its URL names (ws:// "
            f"WebSocket, http:// SmallWebRTC), from this process: leave out {', '.join(wrong)}"
        )
    return _Remote(bot_url)


def _modes(mode: str, transport: str) -> list[Literal["text", "audio"]]:
    """`--mode` as the channels to run, text first."""
    wanted = [m.strip() for m in mode.split(",") if m.strip()]
    if (
        not wanted
        or any(m not in ("text", "audio") for m in wanted)
        or len(set(wanted)) < len(wanted)
    ):
        raise ConfigError(f"--mode {mode}: use text, audio or text,audio")
    check_transport(wanted, transport)
    return sorted(wanted, key=("text", "audio").index)  # type: ignore[return-value]


def _report_gap(
    text: "SimulationReport",
    audio: "SimulationReport",
    page: Path | None,
    json_out: bool,
    spots: tuple[HotSpots, HotSpots] | None = None,
    shown: bool = False,
) -> None:
    """Both channels' tables (and their hot spots: printed when `shown`), then the channel gap."""
    from pipecat_rl.simulator.audio.gap import channel_gap, gap_table, write_gap_page

    gap = channel_gap(text.episodes, audio.episodes)
    if page is not None:
        write_gap_page(gap, page)
    channels = (("text", text), ("audio", audio))
    if json_out:
        both = {name: r.to_json() for name, r in channels}
        for (name, _), s in zip(channels, spots or (), strict=False):
            both[name]["hotspots"] = s.model_dump()
        print_json({**both, "channel_gap": gap.model_dump()})
        return
    out = results()
    for k, (name, r) in enumerate(channels):
        print_table(out, _table(r, name))
        if shown and spots:
            _print_hot_spots(out, spots[k], name)
    out.print(gap_table(gap))
    if page is not None:
        out.print(f"channel gap page: {page}", markup=False)


def register(app: typer.Typer) -> None:
    """Add the top-level `simulate` command."""
    app.command("simulate")(simulate_command)
