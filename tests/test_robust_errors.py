"""The one error tree: every exception pipecat-rl defines sits in it, and no branch is unused."""

import ast
import inspect
import sys
from pathlib import Path

from pipecat_rl import errors
from pipecat_rl.cli.common import (
    EXIT_FAILURE,
    EXIT_NO_SIGNAL,
    EXIT_TABLE,
    exit_code_for,
    exit_code_markdown,
)
from pipecat_rl.gate.verdict import EXIT_CODES

PKG = Path(errors.__file__).parent


def _tree() -> dict[str, type]:
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.PipecatRLError)
    }


def test_every_exception_the_package_defines_is_in_the_tree():
    strays = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception"))
                for b in node.bases
            ):
                bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
                if path.name != "errors.py" and not set(bases) & set(_tree()):
                    strays.append(f"{path.relative_to(PKG)}: {node.name}({', '.join(bases)})")
    assert strays == []


def test_no_branch_of_the_tree_is_unused_and_each_is_drawn():
    source = "\n".join(p.read_text() for p in PKG.rglob("*.py") if p.name != "errors.py")
    for name in _tree():
        if name == "PipecatRLError" or (
            name == "TrainingError" and not (PKG / "training").is_dir()
        ):
            continue  # the root is caught, not raised; training raises TrainingError
        assert name in source, f"{name} is never raised or caught: remove it"
        assert name in errors.__doc__, f"{name} is missing from the tree drawn in errors.py"


def test_every_branch_has_a_documented_exit_code():
    documented = {code for code, _ in EXIT_TABLE}
    for cls in _tree().values():
        assert exit_code_for(cls("x")) in documented
    assert exit_code_for(RuntimeError("bug")) == EXIT_FAILURE


def test_the_exit_table_names_every_code_once():
    from pipecat_rl.cli import common

    constants = {v for k, v in vars(common).items() if k.startswith("EXIT_") and isinstance(v, int)}
    codes = [code for code, _ in EXIT_TABLE]
    assert sorted(codes) == codes and len(set(codes)) == len(codes)
    assert set(codes) == constants


def test_no_training_signal_is_its_own_code_and_not_a_verdict_or_a_bug():
    code = exit_code_for(errors.NoTrainingSignalError("no training signal"))
    assert code == EXIT_NO_SIGNAL
    assert code not in (*EXIT_CODES.values(), EXIT_FAILURE)
    assert exit_code_for(errors.TrainingError("other")) == EXIT_FAILURE


def test_the_readme_exit_table_is_the_rendered_one():
    readme = (PKG.parent / "README.md").read_text()
    start = readme.index("<!-- exit-codes:")
    block = readme[readme.index("\n", start) + 1 : readme.index("<!-- /exit-codes -->")]
    assert block.strip() + "\n" == exit_code_markdown(), (
        "README.md's exit-code table is stale; paste in:\n" + exit_code_markdown()
    )


def test_an_unexpected_error_is_one_line_and_70_unless_asked_for_the_traceback(monkeypatch):
    from typer.testing import CliRunner

    from pipecat_rl.cli import app
    from pipecat_rl.cli import models as models_cli

    def broken(*_: object) -> dict:
        raise RuntimeError("a bug")

    monkeypatch.setattr(models_cli, "PACKAGED_MODELS", type("M", (), {"items": broken})())
    quiet = CliRunner().invoke(app, ["models", "list"])
    assert quiet.exit_code == EXIT_FAILURE
    assert quiet.stderr.strip().splitlines() == [
        "error: unexpected RuntimeError: a bug; run with -vv for the traceback (please report it)"
    ]
    loud = CliRunner().invoke(app, ["-vv", "models", "list"])
    assert loud.exit_code == EXIT_FAILURE
    assert "Traceback" in loud.stderr and "a bug" in loud.stderr


def test_the_app_run_in_process_leaves_logging_working_once_its_stderr_is_gone(capsys):
    from loguru import logger
    from typer.testing import CliRunner

    from pipecat_rl.cli import app

    assert CliRunner().invoke(app, ["models", "list"]).exit_code == 0  # its stderr now closed
    try:
        logger.warning("a line logged after the app returned")
        err = capsys.readouterr().err
        assert "a line logged after the app returned" in err and "Logging error" not in err
    finally:
        logger.remove()
        logger.add(sys.stderr)
