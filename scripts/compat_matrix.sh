#!/usr/bin/env bash
# Runs the Pipecat compatibility tests against each Pipecat release named, each in its own venv,
# so the supported range is the one the tests prove (the oldest and the newest at least, in CI).
#
#   scripts/compat_matrix.sh [VERSION ...]     default: 1.14.0, the oldest and newest release
#                                              pyproject.toml's pipecat-ai pin allows
#
# Each venv gets pipecat-ai==VERSION with the Pipecat extras the test bots import, pipecat-rl's
# core, `service` and `report` dependencies as pyproject.toml lists them (its pipecat-ai pins
# left out, so the version under test is the one installed; the fake OpenAI server of the tests
# is FastAPI) and pytest; pipecat-rl itself is imported from this checkout
# (PYTHONPATH), never installed, so the checkout is not written to. No torch, no vLLM: the tests
# are the fast tier of the ones that touch Pipecat (the private names of `compat`, the wall
# around them, recording, simulated episodes, Pipecat's scenario files and example-style bots).
# Venvs live under $COMPAT_VENVS (default /tmp/pipecat-rl-compat) and are reused;
# $COMPAT_TESTS overrides the test files. Exits non-zero if any version fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
venvs=${COMPAT_VENVS:-/tmp/pipecat-rl-compat}
tests=${COMPAT_TESTS:-tests/test_compat.py tests/test_compat_wall.py tests/test_robust_recording.py \
  tests/test_simulation_entry.py tests/test_sim_episode.py tests/test_pipecat_scenarios.py \
  tests/test_pipecat_bots.py}
[ $# -gt 0 ] || set -- 1.14.0

dependencies=$("$py" - "$root/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
deps = [*project["dependencies"], *extras["service"], *extras["report"]]
names = {"pipecat-ai", "pipecat-rl"}
print("\n".join(d for d in deps if re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0] not in names))
EOF
)

failed=()
for version in "$@"; do
  venv="$venvs/pipecat-$version"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  mapfile -t deps <<<"$dependencies"
  "$venv/bin/python" -m pip install --quiet --progress-bar off \
    "pipecat-ai[silero,daily,deepgram,cartesia,webrtc]==$version" anthropic "${deps[@]}" \
    pytest pytest-asyncio
  echo "== pipecat-ai $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("pipecat-ai"))')"
  # shellcheck disable=SC2086  # $tests is a list of paths
  if (cd "$root" && PYTHONPATH="$root" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      -m "not slow" $tests); then
    echo "== pipecat-ai $version: passed"
  else
    echo "== pipecat-ai $version: FAILED"
    failed+=("$version")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "compatibility tests failed on pipecat-ai ${failed[*]}" >&2
  exit 1
fi
