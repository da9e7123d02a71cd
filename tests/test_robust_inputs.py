"""The bad-input family: each case exits with its documented code, one clear line, no traceback.

The CLI runs in-process (Typer's CliRunner) through the real top-level app, so the exit-code
mapping and the guard are the ones a user gets. Nothing here starts a server: simulations use
the scripted persona with `--no-server`, and LLM verbs point at a closed port.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import (
    EXIT_DATA,
    EXIT_IO,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.scenarios import MAX_RUNS, MAX_TURNS
from pipecat_rl.scenarios.yaml_safe import MAX_NODES
from pipecat_rl.serving.server import free_port

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples" / "clinic" / "handwritten" / "pool"
EXPERT = str(ROOT / "examples" / "clinic" / "expert.py")
GOOD = "name: ok\npersona: a caller\ngoal: book\nsuccess: booked\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _files(tmp: Path) -> dict[str, Path]:
    """Every bad file the cases use, written once per test."""
    made: dict[str, Path] = {}

    def put(name: str, content: str | bytes) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        made[name] = path

    put("self_include.yaml", GOOD + "facts: !include self_include.yaml\n")
    put("loop_a.yaml", GOOD + "facts: !include loop_b.yaml\n")
    put("loop_b.yaml", "x: !include loop_a.yaml\n")
    put("latin1.yaml", GOOD.encode() + "facts: {name: Jos\xe9}\n".encode("latin-1"))
    put("runs_huge.yaml", GOOD + "runs: 100000000\n")
    put("turns_huge.yaml", GOOD + f"max_turns: {MAX_TURNS + 1}\n")
    put("turns_text.yaml", GOOD + "max_turns: ten\n")
    put("runs_negative.yaml", GOOD + "runs: -3\n")
    put("bomb.yaml", GOOD + BOMB)
    put("recursive_alias.yaml", GOOD + "facts: &f {again: *f}\n")
    put("deep.yaml", GOOD + "facts: " + "[" * 5000 + "]" * 5000 + "\n")
    put("huge.yaml", GOOD + "facts: {blob: '" + "x" * 1_100_000 + "'}\n")
    put("top_list.yaml", "- name: x\n")
    put("empty.yaml", "")
    put("bad_yaml.yaml", "name: [unclosed\n")
    put("unknown_field.yaml", GOOD + "colour: blue\n")
    put("bad_include.yaml", GOOD + "facts: !include nowhere.yaml\n")
    put("no_persona/pool/a.yaml", GOOD)
    put("no_persona/pool/b.yaml", "name: b\ngoal: g\nsuccess: s\n")
    put("capital/pool/a.yaml", GOOD)
    put("capital/pool/b.yaml", "name: b\nPersona: p\ngoal: g\nsuccess: s\n")
    put("scores_inf.jsonl", '{"scenario": "s", "policy": "a", "run": 0, "reward": Infinity}\n')
    put("scores_text.jsonl", '{"scenario": "s", "policy": "a", "run": 0, "reward": "high"}\n')
    put("gate.yaml", "resamples: 1000000000\n")
    put("not_sqlite.db", "not a database\n" * 50)
    put("include_dir.yaml", GOOD + "facts: !include no_persona\n")
    put("pack_missing.yaml", GOOD + "world: {pack: nowhere.py}\n")
    put("a_file", "x")
    return made


def _ledger(tmp: Path) -> Path:
    path = tmp / "ledger.db"
    with Ledger(path) as store:
        store.add_session(SessionRecord(id="s1", source="live", started_at=1.0))
    return path


RESAMPLES_CAP = next(
    m.le for m in GateConfig.model_fields["resamples"].metadata if getattr(m, "le", None)
)
"""The gate's cap on bootstrap resamples, stated in its error."""

GATE_AB = ["gate", "--candidate", "a", "--incumbent", "b", "--scores"]

# (case id, argv built from the files, expected exit code, text the one line must contain)
CASES = [
    ("include-self", lambda f, d: ["simulate", f["self_include.yaml"]], EXIT_DATA, "loops"),
    ("include-loop", lambda f, d: ["simulate", f["loop_a.yaml"]], EXIT_DATA, "loop_b.yaml"),
    ("include-missing", lambda f, d: ["simulate", f["bad_include.yaml"]], EXIT_DATA, "nowhere"),
    ("non-utf8", lambda f, d: ["simulate", f["latin1.yaml"]], EXIT_DATA, "not UTF-8"),
    ("runs-cap", lambda f, d: ["simulate", f["runs_huge.yaml"]], EXIT_DATA, str(MAX_RUNS)),
    ("turns-cap", lambda f, d: ["simulate", f["turns_huge.yaml"]], EXIT_DATA, str(MAX_TURNS)),
    ("turns-type", lambda f, d: ["simulate", f["turns_text.yaml"]], EXIT_DATA, "max_turns"),
    ("runs-range", lambda f, d: ["simulate", f["runs_negative.yaml"]], EXIT_DATA, "runs"),
    ("alias-bomb", lambda f, d: ["simulate", f["bomb.yaml"]], EXIT_DATA, f"{MAX_NODES:,}"),
    ("alias-loop", lambda f, d: ["simulate", f["recursive_alias.yaml"]], EXIT_DATA, "itself"),
    ("deep-nesting", lambda f, d: ["simulate", f["deep.yaml"]], EXIT_DATA, "deep"),
    ("file-size", lambda f, d: ["simulate", f["huge.yaml"]], EXIT_DATA, "1,000,000-byte"),
    ("top-level-list", lambda f, d: ["simulate", f["top_list.yaml"]], EXIT_DATA, "mapping"),
    ("empty-file", lambda f, d: ["simulate", f["empty.yaml"]], EXIT_DATA, "mapping"),
    ("bad-yaml", lambda f, d: ["simulate", f["bad_yaml.yaml"]], EXIT_DATA, "line"),
    ("unknown-field", lambda f, d: ["simulate", f["unknown_field.yaml"]], EXIT_DATA, "colour"),
    (
        "no-persona-in-folder",
        lambda f, d: ["simulate", f["no_persona/pool/a.yaml"].parent],
        EXIT_DATA,
        "persona",
    ),
    (
        "capital-persona",
        lambda f, d: ["simulate", f["capital/pool/a.yaml"].parent],
        EXIT_DATA,
        "Persona",
    ),
    ("missing-path", lambda f, d: ["simulate", d / "nothing-here"], EXIT_USAGE, "nothing-here"),
    (
        "repeats-cap",
        lambda f, d: ["simulate", POOL, "--repeats", "1000000000"],
        EXIT_USAGE,
        str(MAX_RUNS),
    ),
    ("repeats-zero", lambda f, d: ["simulate", POOL, "--repeats", "0"], EXIT_USAGE, "--repeats"),
    ("repeats-text", lambda f, d: ["simulate", POOL, "--repeats", "many"], EXIT_USAGE, "--repeats"),
    ("concurrency-0", lambda f, d: ["simulate", POOL, "-c", "0"], EXIT_USAGE, "--concurrency"),
    ("unknown-flag", lambda f, d: ["simulate", POOL, "--fast"], EXIT_USAGE, "--fast"),
    ("no-bot", lambda f, d: ["simulate", POOL, "--no-bot"], EXIT_USAGE, "--no-bot"),
    (
        "bot-missing",
        lambda f, d: ["simulate", POOL, "--bot", d / "nobot.py"],
        EXIT_USAGE,
        "nobot",
    ),
    ("mode-audio", lambda f, d: ["simulate", POOL, "--mode", "video"], EXIT_USAGE, "--mode"),
    ("unknown-verb", lambda f, d: ["simulat"], EXIT_USAGE, "simulat"),
    (
        "ledger-missing",
        lambda f, d: ["ledger", "stats", "--ledger", d / "x.db"],
        EXIT_USAGE,
        "x.db",
    ),
    (
        "ledger-not-sqlite",
        lambda f, d: ["ledger", "stats", "--ledger", f["not_sqlite.db"]],
        EXIT_IO,
        "not a SQLite",
    ),
    ("ledger-is-dir", lambda f, d: ["ledger", "stats", "--ledger", d], EXIT_IO, "directory"),
    (
        "ledger-unknown-session",
        lambda f, d: ["ledger", "show", "ghost", "--ledger", _ledger(d)],
        EXIT_USAGE,
        "ghost",
    ),
    (
        "ledger-bad-source",
        lambda f, d: ["ledger", "sessions", "--source", "tv", "--ledger", _ledger(d)],
        EXIT_USAGE,
        "--source",
    ),
    (
        "ledger-limit-text",
        lambda f, d: ["ledger", "sessions", "--limit", "lots", "--ledger", _ledger(d)],
        EXIT_USAGE,
        "--limit",
    ),
    (
        "export-format",
        lambda f, d: ["ledger", "export", "--format", "csv", "--ledger", _ledger(d)],
        EXIT_USAGE,
        "csv",
    ),
    (
        "export-out-under-a-file",
        lambda f, d: ["ledger", "export", "--out", f["a_file"] / "x.jsonl", "--ledger", _ledger(d)],
        EXIT_USAGE,
        "a_file",
    ),
    (
        "export-out-is-dir",
        lambda f, d: ["ledger", "export", "--out", d, "--ledger", _ledger(d)],
        EXIT_USAGE,
        "is a folder",
    ),
    (
        "gate-out-is-a-file",
        lambda f, d: _gate_scores(d) + ["--out", f["a_file"]],
        EXIT_USAGE,
        "a_file",
    ),
    (
        "gate-inf-reward",
        lambda f, d: [*GATE_AB, f["scores_inf.jsonl"]],
        EXIT_DATA,
        "reward",
    ),
    (
        "gate-text-reward",
        lambda f, d: [*GATE_AB, f["scores_text.jsonl"]],
        EXIT_DATA,
        "reward",
    ),
    (
        "gate-resamples-flag",
        lambda f, d: _gate_scores(d) + ["--resamples", "1000000000"],
        EXIT_USAGE,
        str(RESAMPLES_CAP),
    ),
    (
        "gate-resamples-config",
        lambda f, d: _gate_scores(d) + ["--config", f["gate.yaml"]],
        EXIT_DATA,  # a config file is an input file
        str(RESAMPLES_CAP),
    ),
    (
        "gate-repeats-cap",
        lambda f, d: ["gate", "--candidate", "a", "--repeats", "99999"],
        EXIT_USAGE,
        str(MAX_RUNS),
    ),
    (
        "gate-scores-missing",
        lambda f, d: ["gate", "--candidate", "a", "--incumbent", "b", "--scores", d / "no.jsonl"],
        EXIT_USAGE,
        "no.jsonl",
    ),
    ("include-a-folder", lambda f, d: ["simulate", f["include_dir.yaml"]], EXIT_DATA, "no_persona"),
    ("pack-missing", lambda f, d: ["simulate", f["pack_missing.yaml"]], EXIT_DATA, "world.pack"),
    ("models-unknown", lambda f, d: ["models", "prepare", "gpt-99"], EXIT_DATA, "gpt-99"),
    (
        "llm-unreachable",
        lambda f, d: ["llm", "models", "--llm-url", f"http://127.0.0.1:{free_port()}"],
        EXIT_UNAVAILABLE,
        "cannot reach",
    ),
    (
        "llm-port-range",
        lambda f, d: ["llm", "serve", "--port", "70000"],
        EXIT_USAGE,
        "--port",
    ),
    (
        "llm-open-host-without-key",
        lambda f, d: ["llm", "serve", "--host", "0.0.0.0"],
        EXIT_USAGE,
        "--api-key",
    ),
    (
        "load-adapter-not-peft",
        lambda f, d: ["llm", "load-adapter", "x", d, "--llm-url", "http://127.0.0.1:1"],
        EXIT_UNAVAILABLE,
        "adapter_config.json",
    ),
]


def _gate_scores(tmp: Path) -> list:
    scores = tmp / "scores.jsonl"
    lines = [
        {"scenario": f"s{i}", "policy": p, "run": 0, "reward": 1.0}
        for i in range(3)
        for p in ("a", "b")
    ]
    scores.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return [*GATE_AB, scores]


def _params() -> list:
    return [pytest.param(*c[1:], id=c[0]) for c in CASES]


@pytest.mark.parametrize(("argv", "code", "says"), _params())
def test_bad_input(tmp_path, monkeypatch, argv, code, says):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    monkeypatch.delenv("PIPECAT_RL_LLM_API_KEY", raising=False)
    args = [str(a) for a in argv(_files(tmp_path), tmp_path)]
    if args[0] == "simulate" and "--bot" not in args and "--no-bot" not in args:
        args += ["--bot", EXPERT]
    if args[0] == "simulate":
        args += ["--persona", "scripted", "--no-server", "--ledger", str(tmp_path / "sim.db")]
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert says in lines[0], lines[0]
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
