"""`pipecat-rl ledger`: look inside the ledger (stats, sessions, one transcript), export it, score.

`migrate` copies one ledger into another (a SQLite file into Postgres: `ledger.transfer`).
`export --out` writes through `cli.output`: never over the ledger, atomically, `--force` for
what would destroy something else.

`score` is the CLI face of the service's `POST /sessions/{call_id}/scores` (`Ledger.post_score`).

`fork` writes a scenario that replays a recorded call's first K agent turns token-exactly and
hands the call on to the persona (`scenarios.forking`, replayed by `simulator.fork`); `fork
--failed` writes a folder of such forks of the failed live calls, held out: a regression suite
(`scenarios.failures`).
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from pipecat_rl.cli.common import (
    HELP_MARKUP,
    cli_errors,
    console,
    print_json,
    print_table,
    results,
    writable_folder,
)
from pipecat_rl.cli.output import FORCE_HELP, output_file, written
from pipecat_rl.cli.transcript import num, print_transcript, shown_score, when
from pipecat_rl.errors import ConfigError, ScoreRefusedError
from pipecat_rl.ledger import (
    LEDGER_ENV,
    Ledger,
    LiveTrust,
    NotInLedgerError,
    ScoreIn,
    SessionRecord,
    ledger_file_missing,
    live_exclusions,
    resolve_ledger_path,
)
from pipecat_rl.ledger.eligibility import LIVE_REASONS
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS
from pipecat_rl.ledger.transfer import OnConflict, is_ledger_file

ledger_app = typer.Typer(
    help="Inspect and export the ledger (sessions, turns, tool calls, latencies, adapters).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)

LedgerOpt = Annotated[
    str | None,  # not a Path, which would fold postgresql:// into postgresql:/
    typer.Option(
        "--ledger",
        help=f"Ledger file or postgresql:// URL (default: ${LEDGER_ENV}, else ./pipecat-rl.db).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]

_SOURCES = ("live", "simulate", "gate")
_SPLITS = ("pool", "heldout")


@contextmanager
def open_ledger(path: str | Path | None, *, read_only: bool = False) -> Iterator[Ledger]:
    """Open an existing ledger; a missing file is a usage error, never silently created here.

    `read_only` for verbs that only read: they open a ledger on a read-only mount, and never
    change it (not even closing the sessions of dead processes, which a writing open does).
    """
    resolved = resolve_ledger_path(path)
    if ledger_file_missing(resolved):
        raise ConfigError(
            f"no ledger at {resolved}; pass --ledger PATH or set {LEDGER_ENV} "
            "(a ledger is created when a bot or the simulator first records a session)"
        )
    ledger = Ledger(resolved, read_only=read_only)
    try:
        yield ledger
    except NotInLedgerError as e:
        raise ConfigError(str(e)) from e
    finally:
        ledger.close()


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def trust_text(trust: LiveTrust) -> str:
    """`trust` in words, for the lines that count by it."""
    hours = trust.settle_s / 3600
    settle = f"{hours:g}h" if hours >= 1 else f"{trust.settle_s:g}s"
    return f"trusting {', '.join(trust.sources) or 'no source'}; settled {settle} after the call"


@ledger_app.command("stats")
def stats(ledger: LedgerOpt = None, json_out: JsonOpt = False) -> None:
    """Counts per table, sessions by source and split, and how many turns can train.

    Live calls kept out of training are counted per reason (`eligibility.live_exclusions`, under
    the default trust: `live_kept_out`, `live_trust` in `--json`).
    """
    trust = LiveTrust()
    with cli_errors(json_out), open_ledger(ledger, read_only=True) as store:
        data = store.stats(live=trust)
        kept_out = live_exclusions(store, trust)
    data["live_kept_out"] = kept_out.kept_out
    data["live_trust"] = trust.model_dump(mode="json")
    if json_out:
        print_json(data)
        return
    out = results()
    out.print(f"[bold]ledger[/bold] {escape(data['path'])} (schema v{data['schema_version']})")
    for table, n in data["counts"].items():
        out.print(f"  {table:<14} {n}")
    sources = ", ".join(f"{k} {v}" for k, v in sorted(data["sessions_by_source"].items()))
    splits = ", ".join(f"{k} {v}" for k, v in sorted(data["sessions_by_split"].items()))
    out.print(f"  sessions by source: {sources or '-'}")
    out.print(f"  sessions by split:  {splits or '-'}")
    out.print(f"  token-exact turns:  {data['token_exact_turns']}")
    eligible = data["eligible_turns"]
    out.print(
        f"  training-eligible turns: SFT {eligible['sft']} (demonstrations included), "
        f"RL {eligible['rl']} (sampled token-exactly by the policy)"
    )
    dropped = ", ".join(f"{k} {n}" for k, n in data["dropped_turns"].items() if n)
    out.print(f"  sampled turns kept out of training: {dropped or '-'}")
    if data["recorded_from_caller"]:
        label, hint = LIVE_REASONS["recorded_from_caller"]
        n = data["recorded_from_caller"]
        out.print(f"  sessions kept out of training: {n} {label}: {hint}", markup=False)
    live = data["live_sessions"]
    out.print(
        f"  live sessions: {live['unscored']} unscored, {live['scored']} scored "
        f"({live['trainable']} trainable)"
    )
    if kept_out.calls > kept_out.trainable:
        out.print(
            f"  live sessions kept out of training: {kept_out.describe()} "
            f"({escape(trust_text(trust))})"
        )
    out.print(f"  live: {escape(data['live'] or 'nothing promoted yet')}")


@ledger_app.command("sessions")
def sessions(
    source: Annotated[
        str | None, typer.Option(help="live, simulate or gate.", show_default=False)
    ] = None,
    split: Annotated[str | None, typer.Option(help="pool or heldout.", show_default=False)] = None,
    policy: Annotated[
        str | None, typer.Option(help="Adapter or base model served.", show_default=False)
    ] = None,
    scenario: Annotated[str | None, typer.Option(help="Scenario id.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many, newest first.")] = 50,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List sessions, newest first: scenario, policy, outcome and score (the gate's scale)."""
    with cli_errors(json_out), open_ledger(ledger, read_only=True) as store:
        rows = store.sessions(
            source=_choice("--source", source, _SOURCES),
            split=_choice("--split", split, _SPLITS),
            policy=policy,
            scenario_id=scenario,
            limit=limit,
        )
    if json_out:
        print_json([s.model_dump(mode="json") for s in rows])
        return
    if not rows:
        console.print("no sessions match")
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    # ids, scenarios and policies are copied whole: never wrapped, never cut (`print_table`)
    for name in ("id", "started", "source", "scenario", "policy", "outcome"):
        table.add_column(name, no_wrap=True)
    table.add_column("score", no_wrap=True, justify="right")
    table.add_column("labels", overflow="fold")
    for s in rows:
        table.add_row(
            *(escape(_cell(s, name)) for name in ("id", "started", "source", "scenario",
                                                  "policy", "outcome")),
            num(shown_score(s.reward_parts)),
            escape(", ".join(s.failure_labels) or "-"),
        )  # fmt: skip
    print_table(results(), table)


def _cell(s: SessionRecord, column: str) -> str:
    if column == "started":
        return when(s.started_at, short=True)
    if column == "scenario":
        return (s.scenario_id or "-") + (f" ({s.split})" if s.split else "")
    return str(getattr(s, column) or "-")


@ledger_app.command("show")
def show(
    session_id: Annotated[str, typer.Argument(metavar="ID", help="A session id.")],
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print one session as a transcript: turns, tool calls, token counts and latencies."""
    with cli_errors(json_out), open_ledger(ledger, read_only=True) as store:
        if json_out:
            print_json(store.session_bundle(session_id))
        else:
            print_transcript(results(), store, session_id)


@ledger_app.command("export")
def export(
    fmt: Annotated[str, typer.Option("--format", help="Output format (jsonl).")] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", metavar="FILE", help="Write to this file (default: stdout).",
            show_default=False,
        ),
    ] = None,
    session: Annotated[
        list[str] | None,
        typer.Option(
            "--session", help="Export only this session id (repeatable).", show_default=False
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Export sessions, each with its turns, tool calls, latencies and scores, one per line.

    With --json and --out, prints {"count", "out"} on stdout once the file is written. Folders
    missing on the way to --out are made; the file appears only once the export is complete, and
    never over the ledger itself (exit 64; a symlink, device, receipt or SQLite file needs --force).
    """
    with cli_errors(json_out and out is not None), open_ledger(ledger, read_only=True) as store:
        if fmt != "jsonl":
            raise ConfigError(f"--format must be jsonl, not {fmt!r}")
        if out is None:
            count = store.export_jsonl(sys.stdout, session_ids=session or None)
            sys.stdout.flush()  # a full stdout is an OSError here (exit 74), a closed one 141
        else:
            target = output_file(
                writable_folder(out, "--out"), "--out", force=force, ledger=store.path
            )
            with written(target) as f:
                count = store.export_jsonl(f, session_ids=session or None)
    if out is not None and json_out:
        print_json({"count": count, "out": str(out)})
    else:
        console.print(f"exported {count} session(s)" + (f" to {out}" if out else ""))


@ledger_app.command("score")
def score(
    call_id: Annotated[str, typer.Argument(metavar="CALL_ID", help="The call's (session's) id.")],
    value: Annotated[str, typer.Option("--value", help="A score in [0, 1], or pass / fail.")],
    metric: Annotated[
        str, typer.Option("--metric", help="The metric; `success` decides whether a call passed.")
    ] = "success",
    source: Annotated[
        str, typer.Option("--source", help="Who scored it: human, coval, pipecat-evals, judge, ...")
    ] = "human",
    explanation: Annotated[
        str | None,
        typer.Option(
            "--explanation",
            help=f"Why (the first {MAX_EXPLANATION_CHARS} characters are kept).",
            show_default=False,
        ),
    ] = None,
    external_id: Annotated[
        str | None,
        typer.Option("--external-id", help="The scorer's own id for it.", show_default=False),
    ] = None,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Score a call by its id, as the service's POST /sessions/{call_id}/scores does.

    Posting the same (metric, source) again replaces the first score. A gate run, a held-out
    session or a call still in progress is refused (exit 64).
    """
    from pipecat_rl.service.scores import ScorePosted

    with cli_errors(json_out), open_ledger(ledger) as store:
        try:
            given = ScoreIn(
                metric=metric, value=value, source=source, explanation=explanation,
                external_id=external_id,
            )  # fmt: skip
            posted = store.post_score(call_id, given)
        except ValidationError as e:
            raise ConfigError("; ".join(err["msg"] for err in e.errors())) from e
        except ScoreRefusedError as e:
            raise ConfigError(str(e)) from e
    if json_out:
        print_json(ScorePosted.of(call_id, posted).model_dump(mode="json"))
        return
    verdict = f"outcome {posted.outcome or '-'}" + (
        f", decided by {posted.decided_by}" if posted.decided_by else ""
    )
    action = "stored" if posted.created else "replaced"
    console.print(
        f"{action} {escape(metric)} = {num(given.value)} ({escape(source)}) for "
        f"{escape(call_id)}: {escape(verdict)}"
    )
    if posted.truncated:
        console.print(
            f"[yellow]explanation cut to its first {MAX_EXPLANATION_CHARS} of "
            f"{posted.explanation_chars} characters[/yellow]"
        )


def _turn(at: str) -> int | None:
    """`--at` as a turn number, or None for `auto`."""
    from pipecat_rl.scenarios.failures import AUTO

    if at.strip().lower() == AUTO:
        return None
    try:
        return int(at)
    except ValueError:
        raise ConfigError(
            f"--at must be a turn number (1 = the first agent turn) or auto, not {at!r}"
        ) from None


_AT_HELP = (
    "Force the call's first K agent turns, then hand it on; `auto`: fork where the call went "
    "wrong: the reply a failing score's explanation names (\"turn N\": the agent's N-th reply, "
    "as Pipecat's judge counts), else the first tool call that errored or changed a table a "
    "failed check reads, else the call's last reply; the candidate answers that whole reply."
)


@ledger_app.command("fork")
def fork(
    at: Annotated[
        str, typer.Option("--at", metavar="K|auto", help=_AT_HELP, show_default=False)
    ],
    session_id: Annotated[
        str | None,
        typer.Argument(metavar="SESSION", help="The recorded call's id (or --failed).",
                       show_default=False),
    ] = None,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed", help="Fork every live call scored fail within --since into the --out "
            "folder, held out: a regression suite (`loop.yaml`: regressions: DIR).",
        ),
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", metavar="SPAN", help="With --failed: calls started within this span "
            "(24h, 90m, 7d, seconds). [default: 24h]", show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", metavar="FILE|DIR",
            help="The fork's scenario file (default: forks/FORK_ID.yaml); with --failed the "
            "folder the forks go to, each named by its id (required).", show_default=False,
        ),
    ] = None,
    scenarios: Annotated[
        list[Path] | None,
        typer.Option(
            "--scenarios", metavar="PATH",
            help="Scenario file or folder holding the call's scenario (repeatable).",
            show_default=False,
        ),
    ] = None,
    persona: Annotated[
        Path | None,
        typer.Option(
            "--persona", metavar="FILE",
            help="For a live call with no scenario: a scenario file (name, persona, goal, "
            "success) for the caller after the fork.", show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write a scenario that replays a recorded call's first K turns, then lets a policy answer.

    The caller's recorded lines up to turn K+1 are said verbatim, the agent's first K turns are
    forced to the recorded token ids (a request that renders otherwise under the served
    template fails the replay, naming the turn), the recorded tool calls are replayed on a
    fresh world from the scenario's pack (a live call without one is served its recorded
    results as fixtures), and then the persona continues. A fork of a held-out call is held out
    (and the ledger remembers its hash). Nothing is written when the session, the turn, a
    text-only turn before K, or the scenario or its pack is wrong.

    With --failed, every live call scored fail within --since is forked into the --out folder
    (a file there already is kept; --force replaces it). The forks are held out, and their
    calls excluded from training, so the suite never trains (`scenarios.failures`); a call
    that cannot be forked is listed as skipped, with the reason.
    """
    with cli_errors(json_out):
        turn = _turn(at)
        if failed and session_id is not None:
            raise ConfigError("name one call to fork (SESSION) or fork every failed one "
                              "(--failed), not both")  # fmt: skip
        if failed:
            _fork_failed(turn, since, out, scenarios or [], persona, force, ledger, json_out)
            return
        if session_id is None:
            raise ConfigError("name the call to fork (SESSION), or fork every failed one with "
                              "--failed --out DIR")  # fmt: skip
        if since is not None:
            raise ConfigError("--since selects calls for --failed; a SESSION names its call")
    _fork_one(session_id, turn, out, scenarios or [], persona, force, ledger, json_out)


def _fork_one(
    session_id: str, turn: int | None, out: Path | None, scenarios: list[Path],
    persona: Path | None, force: bool, ledger: str | None, json_out: bool,
) -> None:  # fmt: skip
    from pipecat_rl.scenarios.failures import auto_turn
    from pipecat_rl.scenarios.fork import fork_file_name
    from pipecat_rl.scenarios.forking import fork_call, fork_yaml

    with cli_errors(json_out), open_ledger(ledger) as store:
        chosen = auto_turn(store, session_id) if turn is None else None
        made = fork_call(store, session_id, chosen.at if chosen else turn, scenarios=scenarios,
                         persona=persona)  # fmt: skip
        scenario = made.scenario
        path = out or Path("forks") / fork_file_name(scenario.id)
        target = output_file(writable_folder(path, "--out"), "--out", force=force,
                             ledger=store.path)  # fmt: skip
        text = fork_yaml(scenario, target.parent)
        with written(target) as f:
            f.write(text)
        if scenario.split == "heldout":  # held out wherever the file goes from here
            session = store.session(session_id)
            store.record_heldout_hashes(
                [(scenario.content_hash(), scenario.id, session.heldout_set_id)]
            )
    summary = {
        "out": str(path), "fork": scenario.id, "session": session_id, "at": scenario.fork.at,
        "at_why": chosen.why if chosen else None,
        "split": scenario.split, "persona_from": made.persona_from, "world": made.world,
        "caller_lines": len(scenario.fork.caller), "content_hash": scenario.content_hash(),
    }  # fmt: skip
    if json_out:
        print_json(summary)
        return
    console.print(
        f"wrote {escape(str(path))}: {escape(scenario.id)} ({scenario.split}), the first "
        f"{scenario.fork.at} agent turn(s) of {escape(session_id)} forced and "
        f"{len(scenario.fork.caller)} caller line(s) said as recorded",
        soft_wrap=True,
    )
    if chosen is not None:
        console.print(f"  at {chosen.at} (auto): {escape(chosen.why)}", soft_wrap=True)
    console.print(f"  persona after the fork: {escape(made.persona_from)}", soft_wrap=True)
    console.print(f"  world: {escape(made.world)}", soft_wrap=True)


def _fork_failed(
    turn: int | None, since: str | None, out: Path | None, scenarios: list[Path],
    persona: Path | None, force: bool, ledger: str | None, json_out: bool,
) -> None:  # fmt: skip
    """`fork --failed`: the failed live calls of a window, as a folder of regression forks."""
    import time

    from pipecat_rl.cli.judge import parse_span  # it imports this module: not at the top
    from pipecat_rl.cli.output import kind_of
    from pipecat_rl.scenarios.failures import Skipped, fork_failed, keep_from_training
    from pipecat_rl.scenarios.fork import fork_file_name
    from pipecat_rl.scenarios.forking import fork_yaml

    if out is None:
        raise ConfigError("--failed writes a folder of forks: pass --out DIR")
    if kind_of(out) not in (None, "folder"):
        raise ConfigError(f"--out {out} is not a folder; --failed writes one file per fork in it")
    window = parse_span(since or "24h")
    writable_folder(out / "fork.yaml", "--out")
    with open_ledger(ledger) as store:
        made = fork_failed(store, time.time() - window, turn, scenarios=scenarios,
                           persona=persona)  # fmt: skip
        skipped, kept, files, excluded = list(made.skipped), [], [], 0
        for regression in made.forks:
            scenario = regression.scenario
            path = out / fork_file_name(scenario.id)
            if path.exists() and not force:
                why = f"already in the suite: {path} (--force replaces it)"
                skipped.append(Skipped(scenario.fork.session, why))
                continue
            target = output_file(path, "--out", force=force, ledger=store.path)
            text = fork_yaml(scenario, target.parent)
            with written(target) as f:
                f.write(text)
            excluded += keep_from_training(store, [regression])  # with its file, never apart
            kept.append(regression)
            files.append(path)
    summary = {
        "out": str(out), "since_s": window, "excluded_from_training": excluded,
        "forks": [
            {"fork": r.scenario.id, "session": r.scenario.fork.session, "at": r.scenario.fork.at,
             "why": r.why, "file": str(p), "content_hash": r.scenario.content_hash()}
            for r, p in zip(kept, files, strict=True)
        ],
        "skipped": [{"session": s.session, "reason": s.reason} for s in skipped],
    }  # fmt: skip
    if json_out:
        print_json(summary)
        return
    out_console = results()
    out_console.print(
        f"forked {len(kept)} failed live call(s) into {escape(str(out))} (held out; "
        f"{excluded} call(s) newly excluded from training), skipped {len(skipped)}",
        soft_wrap=True,
    )
    for r, p in zip(kept, files, strict=True):
        out_console.print(f"  {escape(p.name)}: at {r.scenario.fork.at}: {escape(r.why)}",
                          soft_wrap=True)  # fmt: skip
    for s in skipped:
        out_console.print(f"  [yellow]skipped[/yellow] {escape(s.session)}: {escape(s.reason)}",
                          soft_wrap=True)  # fmt: skip


@ledger_app.command("migrate")
def migrate(
    source: Annotated[
        Path, typer.Option("--from", help="The ledger file to copy (SQLite).", show_default=False)
    ],
    dest: Annotated[
        str,
        typer.Option(
            "--to",
            help="The ledger to copy it into: postgresql://user@host/db (or a file).",
            show_default=False,
        ),
    ],
    on_conflict: Annotated[
        OnConflict,
        typer.Option(
            "--on-conflict",
            help="A session the destination holds with other content: fail (name it, copy "
            "nothing) or skip it (keep the destination's, copy the rest).",
        ),
    ] = "fail",
    json_out: JsonOpt = False,
) -> None:
    """Copy a ledger into another, skipping what is there already, then verify every table.

    Run it again after an interruption: a session is copied whole or not at all, and one the
    destination holds unchanged is skipped. One it holds with other content is a conflict:
    exit 64 naming it, nothing copied, unless --on-conflict skip. Exits non-zero when a source
    row is missing from the destination afterwards.
    """
    from pipecat_rl.ledger.transfer import copy_ledger

    with cli_errors(json_out), open_ledger(source, read_only=True) as store:
        target = resolve_ledger_path(dest)
        if is_ledger_file(target, store.path) or is_ledger_file(store.path, target):
            raise ConfigError(
                f"--from {source} and --to {dest} are the same ledger (or one of its files); "
                "name another destination"
            )
        with Ledger(target) as into:
            done = copy_ledger(store, into, on_conflict=on_conflict)
            names = {"from": str(store.path), "to": str(into.path)}
    if json_out:
        print_json({**names, "tables": done.tables, "conflicts": done.conflicts})
        return
    out = results()
    out.print(f"copied {escape(names['from'])} into {escape(names['to'])} (verified):")
    for table, n in done.tables.items():
        out.print(f"  {table:<14} {n['copied']} copied, {n['present']} already there")
    if done.conflicts:
        console.print(
            f"[yellow]skipped {len(done.conflicts)} session(s) the destination holds with other "
            f"content (--on-conflict skip), kept as they are there:[/yellow] "
            f"{escape(', '.join(done.conflicts))}",
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    """Add the `ledger` group."""
    app.add_typer(ledger_app, name="ledger")
