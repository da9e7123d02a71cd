"""Merged serving on a tiny Llama the test builds: the merged weights score what base + LoRA
scores, the guard passes on what they sample, a candidate loaded over them is exactly its own
policy, the folder is rebuilt only when the adapter changes, and a merged server never answers
as the base model."""

import json
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from pipecat_rl.errors import GateError, ModelError
from pipecat_rl.gate.promote import rollback
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.serving.merged import (
    delta_adapter,
    merge_adapter,
    merged_dir,
    merged_from,
    rank_over_merged,
)
from pipecat_rl.serving.server import BASE_ALIAS, VLLMAdmin, VLLMServer
from pipecat_rl.training.config import LORA_TARGETS, TrainConfig
from pipecat_rl.training.guard import run_guard
from pipecat_rl.training.policy import Policy
from tests.train_helpers import sample_turn, tiny_llama

SEQUENCE = [3, 17, 5, 42, 9, 9, 60, 1, 33, 21, 8, 50]


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p of each token of `ids` after the first, under `model`."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def _adapter(
    tmp_path: Path, seed: int = 1, name: str = "clinic-sft-v1-abc123", rank: int = 8
) -> Path:
    """A saved base folder and a rank-`rank` LoRA on all seven projections with B != 0."""
    base = tmp_path / "base"
    if not base.exists():
        tiny_llama().save_pretrained(base)
        for file in ("tokenizer_config.json", "chat_template.jinja"):  # stand-ins for the real
            (base / file).write_text(f"{file} of the base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(LORA_TARGETS), lora_dropout=0.0
    )
    model = get_peft_model(model, lora)
    torch.manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lora_B" in key:
                p.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "adapters" / name)
    return tmp_path / "adapters" / name


def _base_plus_lora(adapter: Path) -> PeftModel:
    base = AutoModelForCausalLM.from_pretrained(adapter.parent.parent / "base", dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter)


def test_merged_weights_score_what_base_plus_lora_scores(tmp_path):
    adapter = _adapter(tmp_path)
    out = merge_adapter(adapter)
    assert out == merged_dir(adapter) == adapter.with_name(f"{adapter.name}.merged")
    for rendering in ("tokenizer_config.json", "chat_template.jinja"):  # same prompt ids
        assert (out / rendering).read_bytes() == (tmp_path / "base" / rendering).read_bytes()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    peft_model = _base_plus_lora(adapter)
    served, trained = _logprobs(merged, SEQUENCE), _logprobs(peft_model, SEQUENCE)
    assert (served - trained).abs().max() < 1e-5
    with peft_model.disable_adapter():  # ... and the adapter really moves them
        assert (served - _logprobs(peft_model, SEQUENCE)).abs().max() > 1e-2


def test_the_guard_passes_on_turns_the_merged_weights_sampled(tmp_path):
    """A merged server answers under the adapter's name, so each recorded turn names the adapter
    and the guard re-scores it with base + that LoRA (peft): trainer vs merged sampler."""
    adapter = _adapter(tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(merge_adapter(adapter), dtype=torch.float32)
    turns = [
        sample_turn(merged, [1, 2, 3 + i], 8, temperature=0.7, adapter=adapter.name, seed=i,
                    index=i)
        for i in range(3)
    ]  # fmt: skip
    policy = Policy(
        model=_base_plus_lora(adapter), tokenizer=None, base_dir=tmp_path / "base",
        parent=adapter.name,
    )  # fmt: skip
    result = run_guard(policy, turns, TrainConfig())
    assert result["passed"] and result["compared_tokens"] == 24
    assert result["max_abs_diff"] < 1e-4


def test_the_merge_is_reused_until_the_adapter_changes(tmp_path):
    adapter = _adapter(tmp_path)
    out = merge_adapter(adapter)
    first = merged_from(out)
    written = (out / "model.safetensors").stat().st_mtime_ns
    assert merge_adapter(adapter) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == written
    _adapter(tmp_path, seed=2)  # new weights in the same folder
    merge_adapter(adapter)
    assert merged_from(out).fingerprint != first.fingerprint
    served = _logprobs(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), SEQUENCE)
    assert (served - _logprobs(_base_plus_lora(adapter), SEQUENCE)).abs().max() < 1e-5


def test_an_unfinished_merge_is_not_reused(tmp_path):
    adapter = _adapter(tmp_path)
    out = merge_adapter(adapter)
    (out / "pipecat-rl-merged.json").unlink()  # as if the process died before the marker
    assert merged_from(out) is None
    assert merged_from(merge_adapter(adapter)) is not None


def test_merging_a_folder_that_is_not_an_adapter_says_so(tmp_path):
    with pytest.raises(ModelError, match="not a peft adapter folder"):
        merge_adapter(tmp_path)


def test_a_merged_server_never_answers_as_the_base(tmp_path):
    def served_names(server: VLLMServer) -> list[str]:
        cmd = server.command()
        start = cmd.index("--served-model-name") + 1
        return cmd[start : next(i for i in range(start, len(cmd)) if cmd[i].startswith("--"))]

    assert served_names(VLLMServer(tmp_path, served_name="m", port=1)) == ["m", BASE_ALIAS]
    merged = VLLMServer(tmp_path, served_name="clinic-sft-v1", port=1, serves_base=False)
    assert served_names(merged) == ["clinic-sft-v1"]


def test_a_candidate_over_merged_weights_is_exactly_its_own_policy(tmp_path):
    """Candidates are trained over the base; over the live adapter's merged weights each is
    served as its LoRA minus the live one, so what it samples is still its own policy."""
    live = _adapter(tmp_path, seed=1)
    candidate = _adapter(tmp_path, seed=2, name="clinic-grpo-v2-def456", rank=4)
    merged = merge_adapter(live)
    delta = delta_adapter(candidate, merged_from(merged))
    assert json.loads((delta / "adapter_config.json").read_text())["r"] == 12
    over = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32), delta
    )
    served, trained = _logprobs(over, SEQUENCE), _logprobs(_base_plus_lora(candidate), SEQUENCE)
    assert (served - trained).abs().max() < 1e-5
    naive = PeftModel.from_pretrained(  # the candidate's own LoRA stacked on the live one
        AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32), candidate
    )
    assert (_logprobs(naive, SEQUENCE) - trained).abs().max() > 1e-2
    assert rank_over_merged(live, 16) == 32 and rank_over_merged(live, 4) == 16


class _FakeServer(VLLMAdmin):
    """A VLLMAdmin whose server lists `root` as its model folder and records what it loads."""

    def __init__(self, root: Path):
        super().__init__("http://127.0.0.1:9")
        self.cards = [{"id": "served", "root": str(root), "parent": None}]
        self.loaded: list[dict] = []

    def _request(
        self, method: str, path: str, json: dict | None = None, *, timeout: float | None = None
    ) -> httpx.Response:
        if path == "/v1/load_lora_adapter":
            self.loaded.append(json)
        return httpx.Response(200, json={"data": self.cards})


def test_the_admin_loads_a_delta_onto_a_merged_server_and_the_adapter_onto_a_base(tmp_path):
    live = _adapter(tmp_path, seed=1)
    candidate = _adapter(tmp_path, seed=2, name="clinic-grpo-v2-def456")
    on_merged, on_base = _FakeServer(merge_adapter(live)), _FakeServer(tmp_path / "base")
    assert on_merged.merged_policy().adapter == str(live) and on_base.merged_policy() is None
    on_merged.load_adapter("clinic-grpo-v2-def456", candidate)
    on_base.load_adapter("clinic-grpo-v2-def456", candidate)
    assert on_merged.loaded[0]["lora_path"] == str(
        candidate.with_name(f"{candidate.name}.over-{live.name}")
    )
    assert on_base.loaded[0]["lora_path"] == str(candidate)


def test_rolling_back_to_the_base_on_a_merged_server_is_refused(tmp_path):
    live = _adapter(tmp_path)
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.register_adapter(
            AdapterRecord(name=live.name, path=str(live), base_model="tiny", created_at=0.0)
        )
        ledger.move_live(live.name)
        with pytest.raises(GateError, match="has no base model"):
            rollback(ledger, _FakeServer(merge_adapter(live)))
        assert ledger.live().adapter == live.name
        assert rollback(ledger, _FakeServer(tmp_path / "base")).server == "base_model"
