"""`pipecat-rl duels`: queue preference duels on recorded moments, and export people's picks.

`duels make` samples two policies' replies at moments of recorded calls (a served vLLM, the
same prompt ids and seed for both) and queues them for the service's `/duels` page; `duels
export` writes every duel with its votes as JSONL (prompt ids and both replies' ids, so a
trainer elsewhere sees exactly what was shown). Exit codes: the one table (`cli.common`).
"""

import json
import sys
from pathlib import Path
from typing import Annotated, TextIO

import typer

from pipecat_rl.cli.common import HELP_MARKUP, cli_errors, console, print_json, writable_folder
from pipecat_rl.cli.ledger import JsonOpt, LedgerOpt, open_ledger
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.cli.output import FORCE_HELP, output_file, written
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.duels import rater_name
from pipecat_rl.simulator.options import MAX_SEED

duels_app = typer.Typer(
    help="Preference duels: two policies' replies at one moment of a call, picked by people.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)


@duels_app.command("make")
def make(
    policies: Annotated[
        tuple[str, str],
        typer.Option("--policies", metavar="A B", help="The two policies (adapter names, base)."),
    ],
    sources: Annotated[
        list[str],
        typer.Option(
            "--from",
            metavar="SESSION|SCENARIOS",
            help="A session id, or a scenario file or folder (its recorded sessions); repeat it.",
        ),
    ],  # fmt: skip
    n: Annotated[int, typer.Option("--n", min=1, help="How many duels (moments).")] = 20,
    rater: Annotated[
        str | None,
        typer.Option("--rater", help="Queue them for this rater only (default: anyone's)."),
    ] = None,
    llm_url: Annotated[
        str | None,
        typer.Option("--llm-url", envvar=LLM_URL_ENV, help="The vLLM serving both policies."),
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="Sampling temperature.")
    ] = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Cap on each reply.")] = 64,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed.")] = 0,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Queue N duels: both policies' replies to the same recorded prompt ids."""
    from pipecat_rl.duels.make import ServerSampler, find_moments, make_duels

    with cli_errors(json_out):
        if llm_url is None:
            raise ConfigError(f"--llm-url: name the vLLM serving both policies (or {LLM_URL_ENV})")
        if rater is not None:
            try:
                rater_name(rater)
            except ValueError as e:
                raise ConfigError(f"--rater: {e}") from None
        sampler = ServerSampler(llm_url, temperature=temperature, max_tokens=max_tokens)
        sampler.check(policies)
        with open_ledger(ledger) as store:
            moments = find_moments(store, sources)
            duels = make_duels(store, moments, policies, sampler, n=n, seed=seed, rater=rater)
    if json_out:
        print_json({"queued": [d.id for d in duels], "moments": len(moments)})
        return
    console.print(
        f"queued {len(duels)} duel(s) of {policies[0]} vs {policies[1]} from {len(moments)} "
        "moment(s); rate them at the service's /duels"
    )


def _export(store: Ledger, out: TextIO) -> int:
    votes: dict[str, list] = {}
    for v in store.votes():
        votes.setdefault(v.duel_id, []).append(v.model_dump(mode="json"))
    duels = store.duels()
    for d in duels:
        row = {**d.model_dump(mode="json"), "votes": votes.get(d.id, [])}
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(duels)


@duels_app.command("export")
def export(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", metavar="FILE", help="Write here (default: stdout).", show_default=False
        ),
    ] = None,  # fmt: skip
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write every duel with its votes as JSONL: prompt ids, both replies, raters' picks."""
    with cli_errors(json_out and out is not None), open_ledger(ledger, read_only=True) as store:
        if out is None:
            count = _export(store, sys.stdout)
            sys.stdout.flush()
        else:
            target = output_file(
                writable_folder(out, "--out"), "--out", force=force, ledger=store.path
            )
            with written(target) as f:
                count = _export(store, f)
    if out is not None and json_out:
        print_json({"count": count, "out": str(out)})
    else:
        console.print(f"exported {count} duel(s)" + (f" to {out}" if out else ""))


def register(app: typer.Typer) -> None:
    """Add the `duels` verb group."""
    app.add_typer(duels_app, name="duels")
