"""Judged metrics: an LLM, served the same way as the agent, grades each agent turn.

A scenario's judged metric (`name` + `criterion`, as in `pipecat.evals`) scores the share of the
agent's turns that satisfy the criterion, as Pipecat's own simulation judge does. Each verdict is
one short request whose answer is constrained to "yes" or "no" (vLLM structured outputs), so
even a small model answers in the form asked. The score is a reward part, `judge:<name>`.
"""

import asyncio
from collections.abc import Sequence

from loguru import logger
from openai import AsyncOpenAI

from pipecat_rl.serving import client_api_key
from pipecat_rl.simulator.scenario import Metric
from pipecat_rl.simulator.transport import Line

_INSTRUCTION = (
    "You grade one reply of a phone agent. Read the call so far and the agent's last reply, "
    "then answer only yes or no: does that reply satisfy the criterion?"
)


def _prompt(transcript: Sequence[Line], upto: int, criterion: str) -> list[dict[str, str]]:
    call = "\n".join(f"{line.speaker}: {line.text}" for line in transcript[: upto + 1])
    return [
        {"role": "system", "content": _INSTRUCTION},
        {
            "role": "user",
            "content": f"Criterion: {criterion}\n\nCall:\n{call}\n\nDoes the agent's last reply "
            "satisfy the criterion? Answer yes or no.",
        },
    ]


async def _verdict(client: AsyncOpenAI, model: str, messages: list[dict[str, str]]) -> bool:
    response = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=2,
        temperature=0.0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    return (response.choices[0].message.content or "").strip().lower().startswith("yes")


async def judge_metrics(
    metrics: Sequence[Metric], transcript: Sequence[Line], *, llm_url: str, model: str = "base"
) -> dict[str, float]:
    """Score every judged metric over the agent's turns.

    A metric that cannot be judged (the server refused, say) is left out and logged, never
    guessed.
    """
    judged = [m for m in metrics if m.criterion is not None]
    agent_turns = [i for i, line in enumerate(transcript) if line.speaker == "agent"]
    if not judged or not agent_turns:
        return {}
    client = AsyncOpenAI(base_url=llm_url, api_key=client_api_key())
    scores: dict[str, float] = {}
    for metric in judged:
        try:
            verdicts = await asyncio.gather(
                *(_verdict(client, model, _prompt(transcript, i, metric.criterion))
                  for i in agent_turns)
            )  # fmt: skip
        except Exception as e:
            logger.warning(f"judge: could not score {metric.key}: {e}")
            continue
        scores[metric.key] = round(sum(verdicts) / len(verdicts), 6)
    await client.close()
    return scores
