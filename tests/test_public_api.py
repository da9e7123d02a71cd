import subprocess
import sys

import pipecat_rl

EXPECTED = {
    "Ledger", "RLRecorder", "RecorderObserver", "LiveAdapterSelector", "Redactor", "SessionInfo",
    "recording", "setup_file_path", "VLLMServer", "VLLMAdmin", "prepare_model", "GateConfig",
    "GateReceipt", "evaluate", "promote", "rollback", "PipecatRLError",
    "TrainConfig", "TrainResult", "train", "SimulationOptions", "run_simulation", "Rubric",
    "run_gate",
}  # fmt: skip


def test_public_surface_is_pinned_and_resolves():
    assert set(pipecat_rl.__all__) == EXPECTED
    for name in pipecat_rl.__all__:
        assert getattr(pipecat_rl, name) is not None


def test_importing_the_package_imports_nothing_heavy():
    code = "import sys, pipecat_rl; print(sorted({'pipecat','torch','vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_recorder_import_does_not_import_torch_or_vllm():
    code = "import sys, pipecat_rl.processors; print(sorted({'torch','vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
