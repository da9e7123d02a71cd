"""On-policy distillation (`--algo distill`): the student (the stand-in vLLM serving a tiny model's
real weights) rolls out, and a teacher answers at each state the student reached.

A served teacher (a second stand-in serving another tiny model with the same tokenizer) scores
the student's own sampled ids; on those very tokens the student moves the way they point. A
scripted teacher's replies at the student's prompts train by SFT, every step's labels together
(DAgger). A teacher that cannot be reached, gives no logprobs, tokenises differently or is no
function is refused before any rollout.
"""

import types

import pytest
import torch

from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import ConfigError, NoTrainingSignalError, TrainingError
from pipecat_rl.ledger import Ledger, TurnRecord
from pipecat_rl.simulator import SimulationOptions
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.simulator.scripted import ScriptedReply
from pipecat_rl.training import TrainConfig, train, trainer
from pipecat_rl.training.distill import TOKENIZER_PROBE, ReplyTeacher, reply_sequences
from tests.cli_helpers import invoke
from tests.test_train_online import SCENARIOS, TinyVLLM, fake_run
from tests.train_helpers import tiny_llama


@pytest.fixture
def served(tiny_dir, monkeypatch):
    """The student's stand-in vLLM, and `simulator.run` as `fake_run`."""
    monkeypatch.setattr("pipecat_rl.simulator.run", fake_run)
    with TinyVLLM(tiny_dir) as server:
        yield server


@pytest.fixture(scope="module")
def teacher_dir(tiny_dir, tmp_path_factory):
    """Another tiny model (other weights) with the student's tokenizer: a teacher to distil."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("teacher") / "tiny-teacher"
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = tiny_llama(vocab=len(tokenizer), seed=7)
    with torch.no_grad():  # peaked where the student's random head is near-uniform
        model.lm_head.weight.mul_(SHARPEN)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


SHARPEN = 30.0


def _config(tiny_dir, tmp_path, teacher: str, **update) -> tuple[TrainConfig, Rollouts]:
    config = TrainConfig(
        base_model=str(tiny_dir), out_dir=tmp_path / "adapters", group_size=2, seed=3,
        holdout=0.0, algo="distill", teacher=teacher, **{"lr": 0.05, **update},
    )  # fmt: skip
    rollouts = Rollouts(scenarios=SCENARIOS, bot=None, options=SimulationOptions(max_tokens=6))
    return config, rollouts


def _logprobs(model, turns: list[TurnRecord]) -> torch.Tensor:
    """`model`'s logprob of each sampled id of `turns`, at the student's prompts."""
    picked = []
    with torch.no_grad():
        for turn in turns:
            ids = [*turn.prompt_token_ids, *turn.completion_token_ids]
            n = len(turn.completion_token_ids)
            logits = model(input_ids=torch.tensor([ids])).logits[0, -n - 1 : -1]
            logp = torch.log_softmax(logits, -1)
            picked.append(logp[range(n), turn.completion_token_ids])
    return torch.cat(picked)


def test_a_served_teacher_scores_the_students_own_ids_and_the_student_moves_toward_it(
    served, tiny_dir, teacher_dir, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rows: list[dict] = []
    with TinyVLLM(teacher_dir) as teacher:
        config, rollouts = _config(tiny_dir, tmp_path, teacher.url, steps=3, lr=2e-3)
        with Ledger(tmp_path / "l.db") as ledger:
            result = train(
                ledger, config, server_url=served.url, rollouts=rollouts, progress=rows.append
            )
            sessions = ledger.sessions(limit=100)
            turns = [t for s in sessions for t in ledger.turns(s.id)]
            first = [t for t in turns if t.adapter == "base"]  # step 1's: the base's samples
        probe, *scored = teacher.scored  # first, the check: the same ids as the student's
    # Each step rolled out the version before it: base, then v1, then v2, 4 turns each.
    versions = sorted({s.policy.split("-")[2] if s.policy != "base" else "base" for s in sessions})
    assert versions == ["base", "v1", "v2"] and len(turns) == 12
    assert probe == served.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
    # The teacher was asked about exactly the student's own prompt + sampled ids, each once.
    assert sorted(scored) == sorted([*t.prompt_token_ids, *t.completion_token_ids] for t in turns)
    assert result.algo == "distill" and result.adapter.split("-")[1:3] == ["distill", "v3"]
    assert result.adapter in served.listed and result.metrics["distilled_turns"] == 4
    steps = [r for r in rows if "kl/reverse_sampled" in r]
    assert {r["step"] for r in steps} == {1, 2, 3} and all(r["guard/passed"] for r in steps)
    # On those very tokens, the trained student is closer to the teacher than the base was.
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    teacher_model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    before = _logprobs(base, first)
    wanted = _logprobs(teacher_model, first) - before  # where the teacher would move each token
    moved = _logprobs(PeftModel.from_pretrained(base, result.path).eval(), first) - before
    # On those very tokens the student moved the way the teacher's logprobs point: down where the
    # teacher finds its tokens less likely than it did, up where more (a flipped sign: < 0).
    alignment = float(torch.nn.functional.cosine_similarity(wanted, moved, dim=0))
    assert alignment > 0.5, alignment


def test_a_scripted_teacher_labels_every_state_and_the_labels_accumulate(
    served, tiny_dir, tmp_path, monkeypatch
):
    (tmp_path / "teacher.py").write_text(
        "from pipecat_rl.simulator.scripted import ScriptedReply\n"
        "def policy(messages):\n"
        "    said = messages[-1]['content']\n"
        "    return ScriptedReply('Of course, ' + said.split(',')[1].split()[0] + ' it is.')\n"
    )
    trained: list[list] = []
    real = trainer.train_sft

    def train_sft(policy, sequences, config, **kw):
        trained.append(list(sequences))
        return real(policy, sequences, config, **kw)

    monkeypatch.setattr(trainer, "train_sft", train_sft)
    config, rollouts = _config(tiny_dir, tmp_path, f"{tmp_path / 'teacher.py'}:policy", steps=2)
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(ledger, config, server_url=served.url, rollouts=rollouts)
        sessions = ledger.sessions(limit=100)
    tokenizer = served.tokenizer
    assert [len(rounds) for rounds in trained] == [4, 8]  # step 2: its 4 labels and step 1's
    rolled = sorted({s.policy.split("-")[2] for s in sessions if s.policy != "base"})
    assert rolled == ["v1"] and result.adapter.split("-")[2] == "v2"  # step 2 rolled out v1
    for seq in trained[-1]:
        text = tokenizer.decode([t for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m])
        scenario = seq.session_id.split("-")[0]
        assert text.startswith(f"Of course, {scenario} it is.")  # the teacher's reply trains
        prompt = tokenizer.decode(seq.input_ids[: seq.loss_mask.index(True)])
        assert f"Hello, {scenario} please." in prompt  # at the student's own prompt
    assert result.metrics["teacher_labels"] == 4 and result.metrics["dagger_rows"] == 8
    # the training curve: each step's first-round pass rate per scenario (fake_run: 1 of 2)
    assert result.metrics["first_round_pass_rate/booking"] == 0.5


def test_a_state_the_teacher_cannot_answer_is_skipped_and_counted(tiny_dir):
    """A scripted policy meets student states it was never written for (a booking with no
    patient looked up): the state is skipped and counted; the others still label."""
    turns = [
        TurnRecord(session_id=f"s{k}", index=0, adapter="base", created_at=0.0,
                   request={"messages": [{"role": "user", "content": said}]}, generated_text="")
        for k, said in enumerate(["Yes, book it.", "Hi"])
    ]  # fmt: skip

    def policy(messages):
        if "book" in messages[-1]["content"]:
            raise KeyError("patient_id")
        return ScriptedReply("How can I help?")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    teacher = ReplyTeacher("t", policy)
    sequences, counts = reply_sequences(teacher, turns, tokenizer)
    assert len(sequences) == 1 and counts["teacher_unanswered"] == 1
    assert counts["teacher_agreement"] == 0.0 and counts["teacher_labels"] == 1
    with pytest.raises(NoTrainingSignalError, match=r"raised at all 1 .*KeyError: 'patient_id'"):
        reply_sequences(ReplyTeacher("t", policy), turns[:1], tokenizer)


def test_a_teacher_that_agrees_is_no_label(tmp_path):
    turn = TurnRecord(
        session_id="s", index=0, adapter="base", created_at=0.0,
        request={"messages": [{"role": "user", "content": "Hi"}]},
        generated_text="Hello  there.",
        tool_calls=[{"id": "c1", "name": "f", "arguments": {"a": 1}}],
    )  # fmt: skip
    same = ReplyTeacher("t", lambda m: ScriptedReply("Hello there.", [("f", {"a": 1})]))
    # a recorded call keeps the JSON text the model wrote: the same call, in other spacing
    written = turn.model_copy(update={"session_id": "w", "tool_calls": [
        {"id": "c1", "name": "f", "arguments": '{"a":1}'}]})  # fmt: skip
    assert same.label(written) is None
    other = ReplyTeacher("t", lambda m: ScriptedReply("Hello there.", [("f", {"a": 2})]))
    assert same.label(turn) is None and same.training_labels() == []
    every = ReplyTeacher("t", same.policy, states="all")  # DAgger's every visited state
    assert every.label(turn) is None and every.training_labels()[0].demonstration
    label = other.label(turn)
    assert label.demonstration and label.tool_calls == [
        {"id": "call_0", "name": "f", "arguments": {"a": 2}}
    ]
    assert label.request == turn.request and label.prompt_token_ids is None


def test_anchored_states_pair_each_correction_with_an_agreed_state_at_the_same_decision():
    """Round 2 of the learning comparison: 18 emergency-slot corrections among 380 agreed
    states, 30 of them routine-slot bookings, and the step moved the student away from the
    teacher. Anchored, a correction trains beside as many agreed states of its own decision."""

    def turn(session: str, index: int, need: str, kind: str | None) -> TurnRecord:
        calls = [] if kind is None else [{"id": "c", "name": "find_slots", "arguments": {
            "kind": kind}}]  # fmt: skip
        return TurnRecord(
            session_id=session, index=index, adapter="sft", created_at=0.0,
            request={"messages": [{"role": "user", "content": need}]},
            generated_text="" if kind else "How can I help?", tool_calls=calls,
        )  # fmt: skip

    def expert(messages):
        need = messages[-1]["content"]
        if need == "hello":
            return ScriptedReply("How can I help?", [])
        return ScriptedReply("", [("find_slots", {"kind": need})])

    # the student always books routine: right for routine callers, wrong for emergencies
    turns = [turn(f"r{i}", 1, "routine", "routine") for i in range(5)]
    turns += [turn(f"e{i}", 1, "emergency", "routine") for i in range(2)]
    turns += [turn(f"h{i}", 0, "hello", None) for i in range(3)]
    taught = {}
    for states in ("corrections", "anchored", "all", "balanced"):
        teacher = ReplyTeacher("expert", expert, states=states)
        for t in turns:
            teacher.label(t)
        taught[states] = [(d.session_id, d.tool_calls[0]["arguments"]["kind"] if d.tool_calls
                           else None) for d in teacher.training_labels()]  # fmt: skip
    corrections = [("e0", "emergency"), ("e1", "emergency")]
    assert taught["corrections"] == corrections
    assert taught["anchored"] == [("r0", "routine"), ("r1", "routine"), *corrections]
    assert len(taught["all"]) == 10
    # balanced: every state; 5 routine find_slots states agreed, 2 corrected: each correction 3x
    assert sorted(taught["balanced"], key=str) == sorted(
        [(f"r{i}", "routine") for i in range(5)] + corrections * 3 + [(f"h{i}", None)
         for i in range(3)], key=str)  # fmt: skip
    for flags in ({"distill_agreed": True, "distill_anchors": True},
                  {"distill_anchors": True, "distill_balanced": True}):  # fmt: skip
        with pytest.raises(ValueError, match="give one of them"):
            TrainConfig(algo="distill", teacher="x.py:f", **flags)
    assert TrainConfig(algo="distill", teacher="x.py:f", distill_balanced=True).distill_states == (
        "balanced"
    )


def test_a_teacher_that_cannot_score_the_students_ids_is_refused_before_any_rollout(
    served, tiny_dir, teacher_dir, tmp_path
):
    def refused(teacher: str, match: str, error=TrainingError) -> None:
        config, rollouts = _config(tiny_dir, tmp_path, teacher)
        with Ledger(tmp_path / "l.db") as ledger, pytest.raises(error, match=match):
            train(ledger, config, server_url=served.url, rollouts=rollouts)
        with Ledger(tmp_path / "l.db") as ledger:
            assert ledger.sessions() == [] and ledger.adapters() == []

    refused("http://127.0.0.1:9/v1", r"the teacher at http://127.0.0.1:9/v1 cannot score")
    with TinyVLLM(teacher_dir) as teacher:
        teacher.tokenizer = types.SimpleNamespace(encode=lambda text, **_: [1, 2, 3])
        refused(teacher.url, r"tokenises differently from the student \(3 vs \d+ ids")
    with TinyVLLM(teacher_dir) as teacher:
        teacher._scored = lambda body: None  # a server that gives no prompt_logprobs
        refused(teacher.url, r"returned no prompt_logprobs for \d+ ids of base: it must be a vLLM")
    nowhere = f"{tmp_path / 'nowhere.py'}:policy"
    refused(nowhere, r"--teacher .*nowhere.py: no such file", ConfigError)
    (tmp_path / "empty.py").write_text("")
    refused(f"{tmp_path / 'empty.py'}:policy", r"defines no function `policy`", ConfigError)


def test_distill_needs_a_teacher_and_rollouts(tmp_path):
    with pytest.raises(ValueError, match="distill needs a teacher"):
        TrainConfig(algo="distill")
    config = TrainConfig(algo="distill", teacher="t.py:f", out_dir=tmp_path)
    with Ledger(tmp_path / "l.db") as ledger, pytest.raises(TrainingError, match="rollouts"):
        train(ledger, config, server_url="http://127.0.0.1:9/v1")
    ledger = str(tmp_path / "l.db")
    result = invoke("train", "--algo", "distill", "--teacher", "t.py:f", "--ledger", ledger)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--algo distill asks the teacher at the parent's own states: give --scenarios" in (
        " ".join(result.output.split())
    )
    result = invoke("train", "--algo", "sft", "--teacher", "t.py:f", "--ledger", ledger)
    assert result.exit_code == EXIT_USAGE and "--teacher is for --algo distill" in result.output
    assert "distill (a --teacher's answer" in " ".join(invoke("train", "--help").output.split())


def test_no_label_is_no_training_signal(served, tiny_dir, tmp_path, monkeypatch):
    """A teacher that agrees everywhere leaves nothing to distil: said, and nothing published."""
    monkeypatch.setattr(ReplyTeacher, "label", lambda self, turn: self.agreed.add(
        (turn.session_id, turn.index)))  # fmt: skip
    (tmp_path / "t.py").write_text("def policy(messages):\n    return None\n")
    config, rollouts = _config(tiny_dir, tmp_path, f"{tmp_path / 't.py'}:policy")
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(NoTrainingSignalError, match="says what the student said at all 4"):
            train(ledger, config, server_url=served.url, rollouts=rollouts)
        assert ledger.adapters() == []
