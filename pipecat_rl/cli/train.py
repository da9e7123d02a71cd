"""`pipecat-rl train`: a new LoRA adapter from the ledger (SFT, GRPO, OPSD, RFT or DPO).

Prints a progress bar while it trains, writes a metrics JSONL with TRL's names, and ends with the
adapter's name (on stdout with `--json`, as part of the result). Live calls train under the
eligibility query's `LiveTrust`, set by `--live-sources` and `--live-settle`; `--live-since`
keeps the run to the live calls of that span, as the cycle's `live:` runs do. Exit codes (one
table, `cli.common.EXIT_TABLE`): 0 trained; 66 no training signal (no rows, zero-variance groups,
no hinted turn: more or better data fixes it); 70 training could not proceed otherwise (the
logprob guard, a canary that does not match); 64 usage; 69 the LLM server is unavailable.

An offline run counts its rows before it imports torch or loads a model (`refuse_without_rows`):
with none, it exits 66 at once, saying per reason why live calls are kept out.
"""

import time
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipecat_rl import defaults
from pipecat_rl.cli.common import (
    cli_errors,
    console,
    existing,
    new_ledger_kept_if_used,
    print_json,
)
from pipecat_rl.cli.judge import parse_span
from pipecat_rl.cli.ledger import open_ledger, trust_text
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.errors import ConfigError, NoTrainingSignalError
from pipecat_rl.ledger import (
    Ledger,
    LiveTrust,
    SessionOutcome,
    live_exclusions,
    resolve_ledger_path,
)
from pipecat_rl.ledger.eligibility import DEFAULT_SETTLE_S, DEFAULT_TRUSTED_SOURCES
from pipecat_rl.scoring.outcome import passed
from pipecat_rl.simulator.options import MAX_SEED
from pipecat_rl.training import Algo, TrainConfig
from pipecat_rl.training.config import ONLINE_ALGOS, ROLLOUT_ONLY

_SHOWN = (
    "loss", "policy_loss", "distill_loss", "kl/reverse_sampled", "teacher_agreement", "reward",
    "frac_reward_zero_std", "grad_norm",
)


def _describe(row: dict[str, Any]) -> str:
    return "  ".join(f"{k}={row[k]:.4g}" for k in _SHOWN if isinstance(row.get(k), int | float))


def live_trust(sources: list[str] | None, settle: str | None) -> LiveTrust:
    """The eligibility query's trust from `--live-sources` and `--live-settle`.

    Raises:
        ConfigError: a source that is no source name, or a settle that is no span.
    """
    settle_s = DEFAULT_SETTLE_S if settle is None else parse_span(settle, "--live-settle")
    try:
        return LiveTrust(sources=tuple(sources or DEFAULT_TRUSTED_SOURCES), settle_s=settle_s)
    except ValidationError as e:
        raise ConfigError(f"--live-sources: {e.errors()[0]['ctx']['error']}") from None


def live_window(store: Ledger, since: str) -> list[str]:
    """The live calls that started within `since` (`--live-since`), for the run to keep to.

    Raises:
        NoTrainingSignalError: none did.
    """
    started = time.time() - parse_span(since, "--live-since")
    ids = [s.id for s in store.sessions(source="live", since=started)]
    if not ids:
        raise NoTrainingSignalError(
            f"no live call started within --live-since {since}: record calls first (see "
            "`pipecat-rl ledger sessions --source live`) or widen the span"
        )
    return ids


def refuse_without_rows(
    store: Ledger, algo: Algo, trust: LiveTrust, session_ids: list[str] | None
) -> None:
    """Refuse an offline run the ledger holds no rows for, before torch and the model load.

    Counts what the trainer selects (`Ledger.training_selection`, the eligibility query under
    `trust`; SFT only the sessions that passed, as `trainer.sft_rows` keeps), and, when that is
    nothing, says why the live calls were kept out (`eligibility.live_exclusions`). Other
    reasons a run may still have no signal (zero-variance groups, no hint) are the trainer's.

    Raises:
        NoTrainingSignalError: no row to train, with the reasons.
    """
    if algo == "dpo":  # people's picks, not sessions' outcomes (`Ledger.trainable_votes`)
        store.trainable_votes().require()
        return
    purpose = "sft" if algo == "sft" else "rl"
    selection = store.training_selection(purpose=purpose, session_ids=session_ids, live=trust)
    sessions = list(dict.fromkeys(t.session_id for t in selection.turns))
    if algo == "sft":
        if any(passed(store.session(sid).reward_parts) is True for sid in sessions):
            return
        kept = live_exclusions(
            store, trust, session_ids=session_ids, outcome=SessionOutcome.PASS.value
        )
        which = f"none of the {len(sessions)} that may train did" if sessions else "none may train"
        said = f"SFT imitates sessions that passed, and {which}"
        live = " scored pass but"
    else:
        if sessions:
            return
        kept = live_exclusions(store, trust, session_ids=session_ids)
        said = "no eligible session has a turn the policy sampled token-exactly"
        live = ""
    if selection.removed:
        said += f" ({selection.removed} removed for held-out overlap)"
    n = kept.calls - kept.trainable
    if n:
        said += (
            f"; {n} live call(s){live} kept out of training ({trust_text(trust)}): "
            f"{kept.describe(hints=True)}"
        )
    else:
        said += (
            "; simulate scenarios (`pipecat-rl simulate`), or record and score live calls "
            "(`pipecat-rl ledger score`)"
        )
    raise NoTrainingSignalError(
        f"no rows to train for --algo {algo}: {said} (`pipecat-rl ledger stats` counts them)"
    )


def train_command(
    algo: Annotated[
        Algo,
        typer.Option(
            "--algo",
            help="sft, grpo, opsd, rft (SFT on the parent's own passed rollouts: the baseline "
            "RL must beat; needs --scenarios and --bot), distill (a --teacher's answer at the "
            "parent's own states; needs --scenarios and --bot), or dpo (people's duel picks).",
        ),
    ] = "sft",
    ledger: Annotated[
        str | None,  # a Path would fold postgresql:// into postgresql:/
        typer.Option("--ledger", help="Ledger file or URL (default: $PIPECAT_RL_LEDGER)."),
    ] = None,
    scenarios: Annotated[
        list[Path] | None,
        typer.Option("--scenarios", help="Online training: scenarios to simulate."),
    ] = None,
    bot: Annotated[
        str | None, typer.Option("--bot", help="Online training: the bot to simulate.")
    ] = None,
    teacher: Annotated[
        str | None,
        typer.Option(
            "--teacher",
            help="Distill: a vLLM URL serving a model with the student's tokenizer (it scores "
            "the student's tokens), or FILE.py:FUNCTION, a scripted policy (its replies train).",
            show_default=False,
        ),
    ] = None,
    distill_agreed: Annotated[
        bool,
        typer.Option(
            "--distill-agreed",
            help="Distill from a scripted teacher: train on the states where it agreed with the "
            "student too (DAgger's every visited state), not only where it differs.",
        ),
    ] = False,
    distill_anchors: Annotated[
        bool,
        typer.Option(
            "--distill-anchors",
            help="Distill from a scripted teacher: beside each state where it differs, train "
            "one where it agreed at the same decision (the same tools called), so a rare "
            "correction is learnt as a condition rather than drowned or made a habit.",
        ),
    ] = False,
    distill_balanced: Annotated[
        bool,
        typer.Option(
            "--distill-balanced",
            help="Distill from a scripted teacher: every visited state, each state where it "
            "differs repeated until it is as many as the agreed states at its decision (the "
            "same tools called), the rest anchoring every other decision.",
        ),
    ] = False,
    teacher_model: Annotated[
        str | None,
        typer.Option(
            "--teacher-model", help="Distill: the model the teacher's server is asked for.",
            show_default=False,
        ),  # fmt: skip
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=1, help="GRPO / OPSD steps; RFT rounds.")
    ] = 1,
    epochs: Annotated[
        int, typer.Option("--epochs", min=1, help="SFT epochs (at most; RFT: per round).")
    ] = 10,
    group_size: Annotated[
        int, typer.Option("--group-size", min=2, help="GRPO / RFT: episodes per scenario.")
    ] = defaults.GROUP_SIZE,
    scenarios_per_step: Annotated[
        int | None,
        typer.Option(
            "--scenarios-per-step", min=1,
            help="Online: scenarios each step rolls out, drawn by --seed (default: all).",
            show_default=False,
        ),  # fmt: skip
    ] = None,
    rank: Annotated[int, typer.Option("--rank", min=1, help="LoRA rank.")] = defaults.LORA_RANK,
    lr: Annotated[float | None, typer.Option("--lr", help="Learning rate.")] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", help="GRPO / RFT exploration temperature.")
    ] = defaults.TRAIN_TEMPERATURE,
    persona: Annotated[
        Literal["llm", "scripted"],
        typer.Option("--persona", help="Online: LLM persona, or the scenarios' script."),
    ] = "llm",
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Online: cap agent replies.")
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-c", min=1, max=256,
            help="Online: rollouts at once (the server's --max-num-seqs bounds what helps).",
        ),  # fmt: skip
    ] = defaults.CONCURRENCY,
    opsd_loss: Annotated[
        Literal["forward_topk", "reverse"],
        typer.Option("--opsd-loss", help="OPSD: top-k forward KL, or sampled-token reverse KL."),
    ] = "forward_topk",
    opsd_hint: Annotated[
        Literal["system", "turn"],
        typer.Option(
            "--opsd-hint",
            help="OPSD: the teacher's hint in the system message, or before the reply.",
        ),
    ] = "system",
    beta: Annotated[
        float,
        typer.Option("--beta", min=1e-3, help="DPO: how far the picks may pull from the parent."),
    ] = 0.1,
    parent: Annotated[
        str | None, typer.Option("--parent", help="Adapter to continue from (default: base).")
    ] = None,
    model: Annotated[str, typer.Option("--model", help="The served base model.")] = defaults.MODEL,
    llm_url: Annotated[
        str | None,
        typer.Option(
            "--llm-url",
            envvar=LLM_URL_ENV,
            help="The running server: the adapter is hot-loaded and verified there.",
        ),
    ] = None,
    live_sources: Annotated[
        list[str] | None,
        typer.Option(
            "--live-sources",
            help="Scorers whose verdict lets a live call train (repeat the flag; default "
            f"{', '.join(DEFAULT_TRUSTED_SOURCES)}).",
            show_default=False,
        ),
    ] = None,
    live_since: Annotated[
        str | None,
        typer.Option(
            "--live-since",
            help="Train on the live calls started within this span only (24h, 90m, 7d).",
            show_default=False,
        ),
    ] = None,
    live_settle: Annotated[
        str | None,
        typer.Option(
            "--live-settle",
            help="A live call trains once it ended this long ago (late scores). (default 1h)",
            show_default=False,
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Adapter folder root.")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Train a LoRA adapter on the eligible calls (online: on its own rollouts); print its name."""
    with cli_errors(json_out):
        if (scenarios is None) != (bot is None):
            raise ConfigError("online GRPO needs both --scenarios and --bot (or neither)")
        if scenarios is not None and algo not in ONLINE_ALGOS:
            raise ConfigError(
                f"--scenarios and --bot are for --algo {', '.join(ONLINE_ALGOS)} (online)"
            )
        if scenarios is None and algo in ROLLOUT_ONLY:
            raise ConfigError(
                f"--algo {algo} {ROLLOUT_ONLY[algo]}: give --scenarios and --bot to roll it out "
                "on (and --llm-url, the server that samples them)"
            )
        if (teacher is None) != (algo != "distill"):
            raise ConfigError(
                "--teacher is for --algo distill, which needs one: a vLLM URL serving a model "
                "with the student's tokenizer, or FILE.py:FUNCTION (a scripted policy)"
            )
        if scenarios is not None and live_since is not None:
            raise ConfigError("--live-since trains on recorded live calls; online runs simulate")
        trust = live_trust(live_sources, live_settle)
        config = TrainConfig(
            algo=algo, base_model=model, parent=parent, steps=steps, epochs=epochs,
            group_size=group_size, scenarios_per_step=scenarios_per_step, rank=rank, lr=lr,
            temperature=temperature, out_dir=out, seed=seed, opsd_loss=opsd_loss,
            opsd_hint=opsd_hint, dpo_beta=beta, teacher=teacher, teacher_model=teacher_model,
            distill_agreed=distill_agreed, distill_anchors=distill_anchors,
            distill_balanced=distill_balanced,
        )  # fmt: skip
        rollouts = None
        if scenarios is not None and bot is not None:
            from pipecat_rl.simulator import SimulationOptions, load_bot, load_scenarios
            from pipecat_rl.simulator.options import Rollouts

            rollouts = Rollouts(
                scenarios=load_scenarios([existing(p, "--scenarios") for p in scenarios]),
                bot=load_bot(bot),
                options=SimulationOptions(
                    persona=persona, max_tokens=max_tokens, concurrency=concurrency
                ),
            )  # fmt: skip
        progress = Progress(
            TextColumn(f"training ({algo})"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.description}"),
            console=console, disable=json_out,
        )  # fmt: skip
        task = progress.add_task("", total=None)

        def on_step(row: dict[str, Any]) -> None:
            progress.update(
                task, completed=row.get("step"), total=row.get("total_steps"),
                description=_describe(row),
            )  # fmt: skip

        # offline training reads a ledger that must exist; online rollouts may start one
        opened = open_ledger(ledger) if rollouts is None else new_ledger_kept_if_used(
            resolve_ledger_path(ledger)
        )  # fmt: skip
        with opened as store:
            window = None if live_since is None else live_window(store, live_since)
            if rollouts is None:
                refuse_without_rows(store, algo, trust, window)
            from pipecat_rl.training import train  # torch: only once there is something to train

            with progress:  # a ServingError exits 69 (`cli_errors`)
                result = train(
                    store, config, server_url=llm_url, progress=on_step, rollouts=rollouts,
                    live=trust, session_ids=window,
                )  # fmt: skip
    if json_out:
        print_json(result.model_dump(mode="json"))
        return
    guard = result.guard
    console.print(
        f"guard: passed, mean |Δlogp| {guard.get('mean_abs_diff')} over "
        f"{guard.get('compared_tokens')} tokens ({guard.get('source')})"
    )
    console.print(f"metrics: {result.metrics_path}")
    console.print(f"{len(result.session_ids)} sessions; adapter folder {result.path}")
    if result.loaded:
        console.print(f"loaded into {llm_url} and verified (listed, canary agrees)")
    typer.echo(result.adapter)


def register(app: typer.Typer) -> None:
    """Add the top-level `train` command."""
    app.command("train")(train_command)
