"""`pipecat-rl llm serve --merged`: the live adapter (or a name, or a folder) is merged and served
under its own name, never as the base, with room in --max-lora-rank for candidates over it."""

from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.serving.merged import merged_dir
from pipecat_rl.serving.server import VLLMServer
from tests.test_merged import _adapter


def test_serve_merged_live_serves_the_live_adapter_under_its_name(tmp_path, monkeypatch):
    live = _adapter(tmp_path)
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        ledger.register_adapter(
            AdapterRecord(name=live.name, path=str(live), base_model="tiny", created_at=0.0)
        )
        ledger.move_live(live.name)
    started: list[VLLMServer] = []

    async def serve(server: VLLMServer, *_: object) -> None:
        started.append(server)

    monkeypatch.setattr("pipecat_rl.cli.llm._serve_until_stopped", serve)
    args = ["llm", "serve", "--model", str(tmp_path / "base"), "--ledger", str(db)]
    result = CliRunner().invoke(app, [*args, "--merged", "live"])
    assert result.exit_code == 0, result.output
    (server,) = started
    assert server.model == merged_dir(live) and server.served_name == live.name
    assert not server.serves_base and server.max_lora_rank == 32
    with Ledger(db) as ledger:
        ledger.move_live("base")
    result = CliRunner().invoke(app, [*args, "--merged", "live"])
    assert result.exit_code != 0 and "needs no merging" in result.output
