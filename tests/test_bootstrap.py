"""`scripts/bootstrap.sh` installs the CPU build of torch, offline or on a stock machine (issue 38).

PyPI's Linux torch is the multi-GB CUDA build. `scripts/torch_source.sh` decides where pip takes
torch from: a wheel already in a folder pip searches (this machine's offline `--find-links`, which
holds the CPU build) as is, with no network; else PyTorch's CPU index, named. Both are checked
here against pip itself, with pip's own configuration set aside, and a stand-in wheel.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "torch_source.sh"
VERSION = "2.13.0"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _wheel(folder: Path, version: str) -> Path:
    """A minimal torch wheel of `version` (metadata only): what pip's resolver reads."""
    info = f"torch-{version}.dist-info"
    path = folder / f"torch-{version}-py3-none-any.whl"
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        "WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "RECORD": "",
    }
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(f"{info}/{name}", text)
    return path


def _source(find_links: Path, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TORCH_"))}
    environ |= {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(find_links), **env}
    done = subprocess.run(
        [str(SCRIPT), sys.executable, VERSION], env=environ, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_wheel_pip_already_finds_is_taken_with_no_index(tmp_path):
    _wheel(tmp_path, f"{VERSION}+cpu")
    assert _source(tmp_path) == ""


def test_without_one_the_cpu_index_is_named(tmp_path):
    assert _source(tmp_path) == CPU_INDEX
    _wheel(tmp_path, "2.12.0+cpu")  # another version is no help
    assert _source(tmp_path) == CPU_INDEX
    assert _source(tmp_path, TORCH_INDEX_URL="https://mirror.example/cpu") == (
        "--index-url https://mirror.example/cpu"
    )
    assert _source(tmp_path, TORCH_INDEX_URL="") == ""


def test_bootstrap_installs_torch_from_where_the_script_says():
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert 'torch_from=$(scripts/torch_source.sh .venv/bin/python "$torch")' in text
    assert '"${pip[@]}" $torch_from "torch==$torch"' in text
    assert "scripts/torch_source.sh |" in text  # its changes re-run the install
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "bootstrap.sh")], check=True)
