#!/usr/bin/env bash
# Prints the pip arguments that keep `pip install torch==VERSION` on the CPU build, on one line:
# nothing when a wheel of that version lies in a folder pip already searches (--find-links, from
# pip's config or PIP_FIND_LINKS, as on a machine that carries the CPU wheel, offline or not),
# else PyTorch's CPU index, since PyPI's Linux torch is the multi-GB CUDA build. Looking there
# first costs no network, so an offline machine never waits on an index it cannot reach.
# TORCH_INDEX_URL overrides the index (a mirror); set it empty to name none.
# Usage: scripts/torch_source.sh PYTHON VERSION
set -euo pipefail
python=$1 version=$2
if "$python" -m pip install --quiet --dry-run --ignore-installed --no-deps --no-index \
    "torch==$version" >/dev/null 2>&1; then
    exit 0
fi
index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
if [ -n "$index" ]; then
    echo "--index-url $index"
fi
