"""Training maths on tiny models the tests build: GRPO, OPSD, masking, advantages, rows."""

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from pipecat_rl.ledger import SessionRecord, TurnRecord
from pipecat_rl.training.advantage import group_advantages, outcome_reward, shaped_reward
from pipecat_rl.training.config import LORA_TARGETS, TrainConfig
from pipecat_rl.training.grpo import build_groups, grpo_step
from pipecat_rl.training.loss import forward_topk_kl_loss, grpo_loss, reverse_kl, reverse_kl_loss
from pipecat_rl.training.opsd import OPSDRow, opsd_row, opsd_step, opsd_update, prefix_pairs
from pipecat_rl.training.policy import Policy, score
from pipecat_rl.training.rows import Sampling, TrainableTurn, build_sequences
from pipecat_rl.training.sft import optimizer_for
from tests.train_helpers import sample_turn, sequence_logprob, tiny_llama, tiny_policy

PROMPT = [1, 5, 9, 11]


def _session(
    sid: str, verifier: float, credit: float = 0.0, scenario: str = "h1", held: float = 0.0
):
    return SessionRecord(
        id=sid, source="simulate", started_at=0.0, ended_at=1.0, scenario_hash=scenario,
        reward_parts={"verifier": verifier, "tool_credit": credit, "checks_held": held},
    )  # fmt: skip


def _turn(sid: str, prompt: list[int], sampled: list[int], logprobs=None, index: int = 0):
    return TrainableTurn(
        session_id=sid, index=index, prompt_ids=prompt, sampled_ids=sampled,
        sampler_logprobs=logprobs if logprobs is not None else [0.0] * len(sampled),
        adapter="base", sampling=Sampling(),
    )  # fmt: skip


def _on_policy(policy, turn: TrainableTurn) -> TrainableTurn:
    ids = [*turn.prompt_ids, *turn.sampled_ids]
    mask = [False] * len(turn.prompt_ids) + [True] * len(turn.sampled_ids)
    with torch.no_grad():
        lp = score(policy.model, ids, mask).logprobs.tolist()
    return turn.model_copy(update={"sampler_logprobs": lp})


def test_grpo_step_raises_the_better_completion_and_lowers_the_worse():
    policy = tiny_policy()
    good = _on_policy(policy, _turn("good", PROMPT, [20, 21, 22]))
    bad = _on_policy(policy, _turn("bad", PROMPT, [40, 41, 42]))
    config = TrainConfig(algo="grpo", lr=2e-2)
    sequences, _ = build_sequences([good, bad])
    groups = build_groups([_session("good", 1.0), _session("bad", 0.0)], sequences, config)
    assert [s.advantage for s in groups.sequences] == [0.5, -0.5]
    before = [sequence_logprob(policy.model, s.input_ids, s.loss_mask) for s in sequences]
    optimizer = optimizer_for(policy, config.learning_rate())
    for _ in range(3):
        metrics = grpo_step(policy, optimizer, groups.sequences, config)
    after = [sequence_logprob(policy.model, s.input_ids, s.loss_mask) for s in sequences]
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["num_tokens"] == 6
    assert metrics["grad_norm"] > 0
    for name in ("policy_loss", "kl", "clip_ratio", "importance_ratio/mean", "entropy"):
        assert name in metrics


def test_zero_variance_groups_are_dropped_and_counted():
    config = TrainConfig(algo="grpo")
    turns = [_turn(sid, PROMPT, [7]) for sid in ("a1", "a2", "b1", "b2")]
    sequences, _ = build_sequences(turns)
    sessions = [
        _session("a1", 1.0, 0.1, "A"), _session("a2", 1.0, 0.1, "A"),  # equal under both
        _session("b1", 0.0, 0.0, "B"), _session("b2", 0.0, 0.2, "B", held=0.5),  # partial credit
    ]  # fmt: skip
    groups = build_groups(sessions, sequences, config)
    assert groups.groups == 2 and groups.zero_std_groups == 1
    assert groups.frac_reward_zero_std == 0.5
    assert groups.frac_zero_std_outcome == 1.0 and groups.frac_zero_std_shaped == 0.5
    assert {s.session_id for s in groups.sequences} == {"b1", "b2"}
    outcome_only = build_groups(
        sessions, sequences, config.model_copy(update={"shaped_reward": False})
    )
    assert outcome_only.sequences == [] and outcome_only.frac_reward_zero_std == 1.0


def test_masked_tokens_get_no_gradient():
    policy = tiny_policy()
    prompt, sampled = [1, 2, 3, 4, 5], [6, 7]
    ids = [*prompt, *sampled]
    mask = [False] * len(prompt) + [True] * len(sampled)
    logits = policy.model(input_ids=torch.tensor([ids])).logits[0].detach().requires_grad_(True)
    positions = torch.tensor([t - 1 for t, m in enumerate(mask) if m])
    logprobs = (
        torch.log_softmax(logits[positions], -1)
        .gather(-1, torch.tensor(ids)[positions + 1].unsqueeze(-1))
        .squeeze(-1)
    )
    loss, _ = grpo_loss(logprobs, logprobs.detach(), 1.0, num_tokens=2)
    loss.backward()
    rows_with_grad = {int(i) for i in torch.nonzero(logits.grad.abs().sum(-1))}
    assert rows_with_grad == set(positions.tolist())  # only positions predicting sampled ids


def test_grpo_loss_clips_and_masks_far_off_policy_sequences():
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    old = logp.detach()
    far = old - torch.tensor([-9.0, -9.0])  # the sampler e^8 below the trainer: masked
    loss, stats = grpo_loss(logp, old, 1.0, num_tokens=2, sampler_log_ratio=far)
    assert stats.masked_sequence and float(loss.detach()) == 0.0
    moved = torch.tensor([-1.5, -1.0])  # the policy that started the batch
    _, stats = grpo_loss(logp, moved, 1.0, num_tokens=2)
    assert not stats.masked_sequence and stats.clipped == 1 and stats.tokens == 2
    assert stats.ratio_max == pytest.approx(float(torch.exp(torch.tensor(0.5))))


def test_the_sampler_weight_is_truncated_at_its_cap():
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    mismatch = torch.log(torch.tensor([2.0, 10.0]))  # pi_old / mu per token
    loss, stats = grpo_loss(
        logp, logp.detach(), 1.0, num_tokens=2, sampler_log_ratio=mismatch,
        importance_sampling_cap=3.0,
    )  # fmt: skip
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-2.0 / 2, -3.0 / 2])  # weights 2 and 3 (capped)
    assert stats.ratio_max == pytest.approx(10.0) and stats.clipped == 0


def test_advantages_mean_centred_std_scaling_optional():
    plain = group_advantages("g", [1.0, 0.0, 0.0, 1.2])
    assert sum(plain.advantages) == pytest.approx(0.0)
    assert plain.advantages[0] == pytest.approx(1.0 - 0.55)
    scaled = group_advantages("g", [1.0, 0.0], scale_std=True)
    assert scaled.advantages == [1.0, -1.0]
    assert group_advantages("g", [0.3, 0.3]).zero_std
    s = _session("x", 1.0, -0.2)
    assert outcome_reward(s) == 1.0 and shaped_reward(s) == pytest.approx(0.8)


def test_sequences_merge_only_on_the_prefix_property():
    t0 = _turn("s", [1, 2, 3], [4, 5], [-0.1, -0.2], index=0)
    t1 = _turn("s", [1, 2, 3, 4, 5, 9, 9], [6], [-0.3], index=1)  # extends: merged
    t2 = _turn("s", [1, 2, 8], [7], [-0.4], index=2)  # re-rendered history: a new sequence
    sequences, stats = build_sequences([t2, t0, t1])
    assert (stats.merged, stats.split, stats.sequences) == (1, 1, 2)
    first = sequences[0]
    assert first.input_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert first.loss_mask == [False] * 3 + [True, True] + [False, False] + [True]
    assert first.sampler_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    _, capped = build_sequences([t0, t1], max_len=6)
    assert capped.dropped == 1


def _opsd_fixture(seed: int = 0):
    """The incumbent answers A after the hint, A or B alike without it; the student: a LoRA on it.

    As in OPSD proper, teacher and student share the incumbent's weights: the teacher is the
    incumbent frozen with the hint in its prompt, the student a fresh LoRA on the same weights.
    """
    hint, question, answer_a, answer_b = 3, 5, 7, 8
    incumbent = tiny_llama(16, seed)
    opt = torch.optim.Adam(incumbent.parameters(), lr=3e-2)
    examples = (
        ([1, hint, question], answer_a),
        ([1, question], answer_a),
        ([1, question], answer_b),
    )
    for _ in range(60):
        loss = 0
        for ids, target in examples:
            logits = incumbent(input_ids=torch.tensor([ids])).logits[0, -1]
            loss = loss - torch.log_softmax(logits, -1)[target]
        opt.zero_grad()
        loss.backward()
        opt.step()
    teacher = copy.deepcopy(incumbent).eval().requires_grad_(False)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]
    )
    student = Policy(get_peft_model(incumbent, lora), None, Path("tiny"), None)
    return student, teacher, (hint, question, answer_a, answer_b)


@pytest.mark.parametrize("kind", ["forward_topk", "reverse"])
def test_opsd_raises_the_hinted_answer_without_the_hint(kind):
    student, teacher, (hint, question, a, _b) = _opsd_fixture()
    config = TrainConfig(algo="opsd", lr=3e-2, opsd_loss=kind, opsd_top_k=4)
    optimizer = optimizer_for(student, config.learning_rate())

    def p_a() -> float:
        with torch.no_grad():
            logits = student.model(input_ids=torch.tensor([[1, question]])).logits[0, -1]
        return float(torch.softmax(logits, -1)[a])

    with torch.no_grad():
        teacher_pa = torch.softmax(
            teacher(input_ids=torch.tensor([[1, hint, question]])).logits[0, -1], -1
        )[a]
    assert teacher_pa > 0.9
    before = p_a()
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        with torch.no_grad():
            logits = student.model(input_ids=torch.tensor([[1, question]])).logits[0, -1]
        samples = torch.multinomial(torch.softmax(logits, -1), 8, replacement=True, generator=gen)
        rows = [
            OPSDRow("s", [1, question, int(s)], [False, False, True],
                    [1, hint, question, int(s)], [False, False, False, True])
            for s in samples
        ]  # fmt: skip
        metrics = opsd_step(student, teacher, optimizer, rows, config)
    assert 0.3 < before < 0.7  # without the hint the incumbent cannot tell A from B
    assert p_a() > 0.85, (before, p_a())
    assert metrics["num_tokens"] == 8


def test_an_opsd_pass_takes_one_optimiser_step_per_mini_batch():
    """The trainer's pass: `mini_batches` steps over the step's rows, each logged, and the pass's
    divergence weighted by each step's loss tokens."""
    student, teacher, (hint, question, a, b) = _opsd_fixture()
    config = TrainConfig(algo="opsd", lr=3e-2, opsd_top_k=4, mini_batches=3)
    optimizer = optimizer_for(student, config.learning_rate())
    rows = [
        OPSDRow("s", [1, question, *said], [False, False, *[True] * len(said)],
                [1, hint, question, *said], [False, False, False, *[True] * len(said)])
        for said in ([a], [b], [a, b], [b], [a])
    ]  # fmt: skip
    probe = copy.deepcopy(student)  # the first step's divergence, measured on an untouched copy
    first = opsd_step(probe, teacher, optimizer_for(probe, 0.0), rows[:2], config)
    logged: list[dict] = []
    summary = opsd_update(student, teacher, optimizer, rows, config, on_step=logged.append)
    assert [(m["optimizer_step"], m["optimizer_steps"]) for m in logged] == [(1, 3), (2, 3), (3, 3)]
    assert [m["hinted_turns"] for m in logged] == [2, 2, 1]
    assert [m["num_tokens"] for m in logged] == [2, 3, 1]
    assert {int(state["step"]) for state in optimizer.state.values()} == {3}  # three updates
    assert logged[0]["kl"] == pytest.approx(first["kl"], abs=1e-6)  # measured before its update
    assert logged[1]["kl"] != pytest.approx(logged[0]["kl"], abs=1e-3)
    assert summary["hinted_turns"] == 5 and summary["num_tokens"] == 6
    for key in ("kl", "kl/forward_topk", "kl/reverse", "distill_loss"):
        mean = sum(m[key] * m["num_tokens"] for m in logged) / 6
        assert summary[key] == pytest.approx(mean, abs=1e-5)
    assert summary["grad_norm"] == logged[-1]["grad_norm"]


@pytest.mark.parametrize("kind", ["forward_topk", "reverse"])
def test_opsd_scores_rows_that_share_a_prefix_as_it_would_one_by_one(kind):
    """A step's turns share the system prompt and tools: scored in prefix batches, the loss, the
    divergences and every gradient are those of scoring each row alone, for far fewer tokens."""
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(1, 64, (n,), generator=gen).tolist()

    shared, hint, rows = ids(80), ids(3), []
    for tail, sampled in ((ids(3), ids(4)), (ids(6), ids(2)), (ids(1), ids(5))):
        prompt = shared + tail
        hinted = prompt[:-1] + hint + prompt[-1:]  # before the generation header, as `opsd_row`
        asked, told = [False] * len(prompt), [False] * len(hinted)
        rows.append(OPSDRow("s", prompt + sampled, asked + [True] * len(sampled),
                            hinted + sampled, told + [True] * len(sampled)))  # fmt: skip
    student, teacher = tiny_policy(seed=0), tiny_llama(seed=1).eval().requires_grad_(False)
    config = TrainConfig(algo="opsd", opsd_loss=kind, opsd_top_k=4, max_grad_norm=1e9)
    (pair,) = prefix_pairs(rows, config)
    assert [b.prefix_len for b in pair] == [80, 80] and len(pair[1].sequences) == 3

    reference, n, expected = copy.deepcopy(student), 11, 0.0
    for r in rows:  # one by one, as the trainer scored them before
        s = score(reference.model, r.student_ids, r.student_mask, keep_logits=True)
        t = score(teacher, r.teacher_ids, r.teacher_mask, keep_logits=True)
        if kind == "forward_topk":
            loss = forward_topk_kl_loss(s.logits, t.logits, num_tokens=n, top_k=4)
        else:
            loss = reverse_kl_loss(s.logprobs, t.logprobs, num_tokens=n)
        loss.backward()
        expected += loss.item()
    metrics = opsd_step(student, teacher, optimizer_for(student, 0.0), rows, config)  # lr 0
    assert metrics["num_tokens"] == n
    assert metrics["distill_loss"] == pytest.approx(expected, abs=1e-5)
    grads = [(p.grad, q.grad) for p, q in zip(student.model.parameters(),
             reference.model.parameters(), strict=True) if p.requires_grad]  # fmt: skip
    assert grads and all(torch.allclose(a, b, atol=1e-5) for a, b in grads)
    assert any(float(a.abs().max()) > 1e-4 for a, _ in grads)
    one_by_one = sum(len(r.student_ids) + len(r.teacher_ids) for r in rows)
    assert metrics["computed_tokens"] < 0.5 * one_by_one


def _divergence(student, teacher, rows, top_k: int) -> tuple[float, float]:
    """Per-token top-k forward KL(teacher || student) and reverse KL(student || teacher)."""
    forward = reverse = 0.0
    n = sum(sum(r.student_mask) for r in rows)
    with torch.no_grad():
        for r in rows:
            s = score(student.model, r.student_ids, r.student_mask, keep_logits=True)
            t = score(teacher, r.teacher_ids, r.teacher_mask, keep_logits=True)
            forward += float(forward_topk_kl_loss(s.logits, t.logits, num_tokens=n, top_k=top_k))
            reverse += float(reverse_kl(s.logits, t.logits).sum()) / n
    return forward, reverse


@pytest.fixture
def one_thread():
    """A tiny model with a 49k vocabulary runs ~8x faster on one thread on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["forward_topk", "reverse"])
def test_opsd_lowers_both_divergences_on_rows_built_from_recorded_turns(
    kind, smollm2_dir, one_thread
):
    """Rows as the trainer builds them (a chat turn the student sampled, the hint rendered into
    the teacher's prompt by the served template); held-out samples measure the divergence.

    The incumbent answers with the caller's name once the hint tells it, and either that or a
    question without it: the teacher is it with the hint, the student a fresh LoRA on it.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    messages = [{"role": "system", "content": "Book visits."}, {"role": "user", "content": "Hi"}]
    prompt = list(tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)["input_ids"])  # fmt: skip
    hint = "The caller's next line will be: 'My name is Ada Lovelace.'"
    named, asking = (tokenizer.encode(text) for text in ("Hello Ada Lovelace!", "Who is it?"))

    request = {"messages": messages, "model": "base", "temperature": 1.0}

    def row(sampled: list[int]) -> OPSDRow:
        turn = TurnRecord(
            session_id="s", index=0, adapter="base", created_at=0.0, request=request,
            prompt_token_ids=prompt, completion_token_ids=sampled,
            logprobs=[0.0] * len(sampled), token_exact=True,
        )  # fmt: skip
        return opsd_row(turn, tokenizer, hint)

    incumbent = tiny_llama(len(tokenizer), seed=3)
    optimizer = torch.optim.Adam(incumbent.parameters(), lr=1e-2)
    hinted, plain = row(named), row(asking)
    examples = [
        (hinted.teacher_ids, hinted.teacher_mask),  # with the hint: the name
        (hinted.student_ids, hinted.student_mask),  # without it: the name or a question
        (plain.student_ids, plain.student_mask),
    ]
    for _ in range(80):  # the hint sits in the system message, far from the reply
        optimizer.zero_grad()
        sum(-score(incumbent, ids, mask).logprobs.sum() for ids, mask in examples).backward()
        optimizer.step()
    teacher = copy.deepcopy(incumbent).eval().requires_grad_(False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=list(LORA_TARGETS))
    student = Policy(get_peft_model(incumbent, lora), tokenizer, Path("tiny"), None)

    def rows(seed: int, n: int = 4) -> list[OPSDRow]:
        turns = [sample_turn(student.model, prompt, len(named), seed=seed * 100 + i,
                             request=request) for i in range(n)]  # fmt: skip
        return [opsd_row(t, tokenizer, hint) for t in turns]

    held_out = rows(seed=99, n=8)
    assert "Ada Lovelace" in tokenizer.decode(held_out[0].teacher_ids)
    assert "Ada Lovelace" not in tokenizer.decode(held_out[0].student_ids[: len(prompt)])
    assert held_out[0].teacher_ids[-len(named) :] == held_out[0].student_ids[-len(named) :]
    config = TrainConfig(algo="opsd", lr=1e-2, opsd_loss=kind, opsd_top_k=8)
    before = _divergence(student, teacher, held_out, config.opsd_top_k)
    optimizer = optimizer_for(student, config.learning_rate())
    first = rows(seed=0, n=8)
    measured = _divergence(student, teacher, first, config.opsd_top_k)
    logged = opsd_step(student, teacher, optimizer, first, config)  # measured before its update
    assert (logged["kl/forward_topk"], logged["kl/reverse"]) == pytest.approx(measured, abs=1e-5)
    assert logged["kl"] == logged["kl/forward_topk" if kind == "forward_topk" else "kl/reverse"]
    for seed in range(1, 40):
        opsd_step(student, teacher, optimizer, rows(seed, n=8), config)
    after = _divergence(student, teacher, held_out, config.opsd_top_k)
    assert before[0] > 0.05 and before[1] > 0.05, before  # the hint changes what it says
    # the divergence the loss minimises falls by well over a third, the other one falls too
    # (reverse KL seeks the teacher's mode: how far the forward top-k follows depends on the
    # CPU's float kernels; without AVX-512 it fell to 0.85x while the reverse fell to 0.23x)
    aimed = 0 if kind == "forward_topk" else 1
    assert after[aimed] < 0.6 * before[aimed], (before, after)
    assert after[1 - aimed] < before[1 - aimed], (before, after)


def test_distillation_losses_are_zero_when_student_equals_teacher():
    logits = torch.randn(3, 10)
    assert float(forward_topk_kl_loss(logits, logits, num_tokens=3, top_k=4)) == pytest.approx(
        0, abs=1e-6
    )
    lp = torch.log_softmax(logits, -1)[:, 0]
    assert float(reverse_kl_loss(lp, lp, num_tokens=3)) == 0.0
