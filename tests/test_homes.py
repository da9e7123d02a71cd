"""Where shared things live: one definition of "passed", of P95 and of pass^k, in `scoring/`.

Read by AST, so a copy that slips back into a stage (a `def pass_hat_k`, a second quantile, a
`outcome == "pass"` comparison) fails here by file and line.
"""

import ast
import re
from pathlib import Path

import pipecat_rl
from pipecat_rl import defaults
from pipecat_rl.scoring import SessionOutcome, outcome_passed

PKG = Path(pipecat_rl.__file__).parent
SCORING = PKG / "scoring"

# Function names that define a pass rule, a quantile/P95 or pass^k.
DEFINES = re.compile(r"^_*(passed|pass_rule|outcome_passed|score_passed|pass_hat_k|pass_k\w*|"
                     r"quantile|quantile_or_none|p\d\d|percentile|gate_score)$")  # fmt: skip
# Library calls that estimate a quantile.
QUANTILE_CALLS = {("np", "quantile"), ("np", "percentile"), ("statistics", "quantiles"),
                  ("numpy", "quantile"), ("numpy", "percentile")}  # fmt: skip
OUTCOME_WORDS = {str(o) for o in SessionOutcome}


def _library_files() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if SCORING not in p.parents]


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(PKG.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and DEFINES.match(node.name):
            decorators = [d.id for d in node.decorator_list if isinstance(d, ast.Name)]
            if "property" not in decorators:  # a record's view of the one rule, not a rule
                found.append(f"{where}: defines {node.name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name) and (base.id, node.func.attr) in QUANTILE_CALLS:
                if not _is_bootstrap_interval(node):
                    found.append(f"{where}: estimates a quantile with {base.id}.{node.func.attr}")
        equality = isinstance(node, ast.Compare) and any(
            isinstance(o, ast.Eq | ast.NotEq) for o in node.ops
        )
        if equality:
            sides = [node.left, *node.comparators]
            names = [s.attr if isinstance(s, ast.Attribute) else getattr(s, "id", "")
                     for s in sides]  # fmt: skip
            literals = [s.value for s in sides if isinstance(s, ast.Constant)]
            if "outcome" in names and any(v in OUTCOME_WORDS for v in literals):
                found.append(f"{where}: compares an outcome to a literal")
    return found


def _is_bootstrap_interval(call: ast.Call) -> bool:
    """`np.quantile(replicates, [a, 1 - a])`: an interval's ends, not a latency quantile."""
    return len(call.args) == 2 and isinstance(call.args[1], ast.List)


def test_no_file_outside_scoring_defines_a_pass_rule_a_p95_or_pass_k():
    offences = [o for p in _library_files() for o in _offences(p)]
    assert offences == []


def test_the_check_itself_fires_on_a_planted_copy(tmp_path):
    planted = tmp_path / "copy.py"
    planted.write_text(
        "import numpy as np\n"
        "def pass_hat_k(c, n, k): ...\n"
        "def p95(v): return np.quantile(v, 0.95)\n"
        "def f(e): return e.outcome == 'pass'\n"
    )
    tree_root = PKG.parent
    moved = tree_root / "pipecat_rl" / "_planted_copy_for_test.py"
    moved.write_text(planted.read_text())
    try:
        assert len(_offences(moved)) == 4
    finally:
        moved.unlink()


def test_scoring_imports_nothing_of_pipecat_or_the_stages():
    for path in SCORING.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
                assert not mod.startswith("pipecat."), (path, mod)
                if mod.startswith("pipecat_rl."):
                    assert mod.startswith(("pipecat_rl.scoring", "pipecat_rl.errors")), (path, mod)


def test_a_stored_outcome_passes_only_as_a_verdict():
    assert outcome_passed("pass") is True and outcome_passed("fail") is False
    for other in OUTCOME_WORDS - {"pass", "fail"}:
        assert outcome_passed(other) is None, other  # interrupted, error, completed, ...


def test_no_example_names_in_library_code():
    hits = [
        f"{p.relative_to(PKG.parent)}:{i}"
        for p in PKG.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if '"clinic' in line
    ]
    assert hits == []


def test_the_default_model_is_written_once():
    quoted = re.compile(r"""["']smollm2["']""")
    hits = [
        f"{p.relative_to(PKG.parent)}:{i}"
        for p in PKG.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if quoted.search(line)
    ]
    assert hits == ["pipecat_rl/defaults.py:7"]


def test_one_alpha_rule_for_the_cli_the_service_and_loop_yaml(tmp_path):
    from pipecat_rl.loop.config import TrainSettings
    from pipecat_rl.service.bodies import TrainJob
    from pipecat_rl.training import TrainConfig

    for rank in (8, 16, 32):
        want = defaults.lora_alpha(rank)
        assert TrainConfig(rank=rank).lora_alpha == want
        loop = TrainSettings(rank=rank)
        assert TrainConfig(rank=loop.rank, alpha=loop.alpha).lora_alpha == want
        job = TrainJob(algo="sft", rank=rank)
        assert TrainConfig(rank=job.rank).lora_alpha == want
    assert TrainConfig(rank=32, alpha=16).lora_alpha == 16  # an explicit alpha is kept


def test_the_old_recorder_import_path_still_works():
    from pipecat_rl import RLRecorder
    from pipecat_rl.processors import RLRecorder as OldPath

    assert OldPath is RLRecorder
