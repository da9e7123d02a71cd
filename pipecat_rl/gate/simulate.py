"""The gate's own paired runs: every held-out scenario K times under each policy, same seeds.

Both policies run in one simulation pass, interleaved, so that they share the server's load
and a latency difference is the policies' and not the time of day. Sessions are labelled
`gate` and then read back exactly as `--from-ledger` reads them.
"""

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate.inputs import GateData, load_ledger_runs
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator.botloader import load_bot
from pipecat_rl.simulator.endpoint import llm_endpoint
from pipecat_rl.simulator.runner import SimulationConfig, simulate
from pipecat_rl.simulator.scenario import HELDOUT, ScenarioSet, load_scenarios


@dataclasses.dataclass(frozen=True)
class PairedRun:
    """How the gate simulates: the bot, where its model is served, how hard to push it."""

    bot: str
    llm_url: str | None = None
    model: str = "smollm2"
    concurrency: int = 4
    max_tokens: int | None = None
    persona: Literal["llm", "scripted"] = "llm"
    seed: int = 0
    transport: Literal["local", "webrtc"] = "local"
    """Audio mode: the call's transport (`--transport webrtc`: SmallWebRTC on loopback)."""


def run_paired_simulations(
    ledger: Ledger,
    scenarios: Path,
    candidate: str,
    incumbent: str,
    repeats: int,
    mode: Literal["text", "audio"],
    run: PairedRun,
    judged: Mapping[str, float] | None = None,
) -> GateData:
    """Simulate both (resolved) policies on the held-out `scenarios` and return their runs.

    `judged` is the gate config's `judged_metrics` (see `inputs.gate_score`).
    """
    loaded = load_scenarios([scenarios])
    pool = [s.id for s in loaded if s.split != HELDOUT]
    if pool:
        raise ConfigError(
            f"the gate decides on held-out scenarios only; {scenarios} also holds "
            f"{', '.join(pool[:5])} (split pool): point --scenarios at the held-out folder"
        )
    asyncio.run(_simulate_both(ledger, loaded, candidate, incumbent, repeats, run, mode))
    return load_ledger_runs(
        ledger, candidate, incumbent, heldout_set=loaded.heldout_set_id, source="gate",
        judged=judged,
    )  # fmt: skip


async def _simulate_both(
    ledger: Ledger,
    scenarios: ScenarioSet,
    candidate: str,
    incumbent: str,
    repeats: int,
    run: PairedRun,
    mode: Literal["text", "audio"] = "text",
) -> None:
    entry = load_bot(run.bot)
    async with llm_endpoint(
        run.llm_url, ledger=ledger, adapters=[candidate, incumbent], model=run.model,
        concurrency=run.concurrency,
    ) as url:  # fmt: skip
        base = SimulationConfig(
            llm_url=url, persona=run.persona, seed=run.seed, repeats=repeats, source="gate",
            concurrency=max(1, run.concurrency // 2), max_tokens=run.max_tokens, mode=mode,
            transport=run.transport if mode == "audio" else "local",
        )  # fmt: skip
        await asyncio.gather(
            *(
                simulate(scenarios, entry, dataclasses.replace(base, adapter=policy), ledger)
                for policy in (candidate, incumbent)
            )
        )
