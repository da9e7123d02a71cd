"""One rule for every OpenAI-compatible URL (`serving.roots`): the bot's server, the persona and
the judge alike. A bare host gets `/v1`; a `/v1` root is kept; any other path is refused naming
the option, the value and the root to give. The README's own form, `--llm-url
http://127.0.0.1:8000`, reaches the bot and the judge at `/v1`; a judge URL that answers 404 is
a service unavailable (69) naming it, before any call."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from pipecat_rl.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.loop.config import load_loop_config
from pipecat_rl.serving import openai_base_url
from pipecat_rl.serving.roots import server_root
from pipecat_rl.serving.server import VLLMAdmin, free_port
from pipecat_rl.simulator.judge import endpoint_for, resolve_endpoint
from pipecat_rl.simulator.options import SimulationOptions
from pipecat_rl.simulator.runner import SimulationConfig
from tests.cli_helpers import invoke
from tests.fake_openai import fake_openai_thread
from tests.pipecat_helpers import BOTS, SCENARIOS, judge_and_agent

KEPT = [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
    ("  http://gpu-1:8000  ", "http://gpu-1:8000/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
    ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1"),
    ("https://openrouter.example/api/v1/", "https://openrouter.example/api/v1"),
    ("http://localhost:11434", "http://localhost:11434/v1"),
    # a provider's own root is kept as given (the preflight's GET /models checks it)
    ("https://gemini.example/v1beta/openai/", "https://gemini.example/v1beta/openai"),
]

REFUSED = [  # the value, and the root the message offers instead
    ("http://127.0.0.1:8000/v1/chat/completions/", "http://127.0.0.1:8000/v1"),
    ("http://host:8000/openai/v1/chat/completions", "http://host:8000/openai/v1"),
    ("http://host:8000/v1/models", "http://host:8000/v1"),
    ("http://host:8000/chat/completions", "http://host:8000/v1"),
    ("http://host:8000/api/v1/responses", "http://host:8000/api/v1"),
    ("127.0.0.1:8000", "http://host:8000/v1"),
    ("localhost:8000/v1", "http://host:8000/v1"),
    ("ftp://host/v1", "http://host:8000/v1"),
    ("http://host:8000/v1?api-version=1", "http://host:8000/v1"),
]


@pytest.mark.parametrize(("given", "root"), KEPT)
def test_a_bare_host_gets_v1_and_a_v1_root_is_kept(given, root):
    assert openai_base_url(given) == root
    assert openai_base_url(root) == root  # once normalised, always the same
    assert server_root(given) == root.removesuffix("/v1")


@pytest.mark.parametrize(("given", "fix"), REFUSED)
def test_any_other_path_is_refused_naming_option_value_and_fix(given, fix):
    with pytest.raises(ConfigError) as refused:
        openai_base_url(given, "--judge-llm-url")
    message = str(refused.value)
    assert message.startswith(f"--judge-llm-url {given!r} ")
    assert f"give the server's root (the part before /chat/completions), e.g. {fix}" in message


def test_the_appended_v1_is_said_once_at_info():
    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m)), level="INFO")
    try:
        for _ in range(3):
            openai_base_url("http://once.example:8000", "--llm-url")
    finally:
        logger.remove(sink)
    (line,) = [s for s in said if "once.example" in s]
    assert "INFO" in line and "http://once.example:8000/v1" in line


def test_every_place_that_takes_a_url_takes_it_by_the_one_rule(tmp_path):
    bare, root = "http://10.0.0.5:8000", "http://10.0.0.5:8000/v1"
    assert VLLMAdmin(bare).root == VLLMAdmin(root).root == "http://10.0.0.5:8000"
    assert SimulationConfig(llm_url=bare).llm_url == root
    options = SimulationOptions(
        persona_llm_url=bare, judge_llm_url=f"{root}/", executor="ray", ray_endpoints=(bare,)
    )
    assert (options.persona_llm_url, options.judge_llm_url, options.ray_endpoints) == (
        root, root, (root,)
    )  # fmt: skip
    flag = resolve_endpoint(
        None, flag_url=bare, flag_model=None, served_url=None, where="x", flag="--judge-llm-url"
    )
    served = resolve_endpoint(
        None, flag_url=None, flag_model=None, served_url=bare, where="x", flag="--judge-llm-url"
    )
    assert flag is not None and served is not None and flag.url == served.url == root
    block = endpoint_for({"service": "ollama", "endpoint": "http://localhost:11434"},
                         where="judge.eval", flag="--judge-llm-url")  # fmt: skip
    assert block is not None and block.url == "http://localhost:11434/v1"
    with pytest.raises(ConfigError, match="--persona-llm-url 'http://h:1/v1/models'"):
        SimulationOptions(persona_llm_url="http://h:1/v1/models")
    with pytest.raises(ConfigError, match="--ray-endpoint"):
        SimulationOptions(executor="ray", ray_endpoints=("http://h:1/v1/completions",))
    route = "http://h:1/v1/chat/completions"
    with pytest.raises(ConfigError, match=rf"s\.yaml: judge\.eval\.endpoint '{route}'"):
        endpoint_for({"endpoint": route}, where="judge.eval", flag="--judge-llm-url",
                     path="s.yaml")  # fmt: skip
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"bot: b.py\npool: p\nheldout: h\nout: o\nllm_url: {bare}\n")
    assert load_loop_config(loop).llm_url == root
    loop.write_text(
        "bot: b.py\npool: p\nheldout: h\nout: o\nbot_llm_url: http://h:1/v1/chat/completions\n"
    )
    with pytest.raises(ConfigError, match=r"bot_llm_url: .*give the server's root"):
        load_loop_config(loop)


# -- through the CLI, against a real OpenAI-compatible stub on loopback ----------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, list[tuple[str, dict]]]]:
    """The fake OpenAI server (agent and deterministic judge), from its own thread and loop."""
    seen: list[tuple[str, dict]] = []
    with fake_openai_thread([], answer=judge_and_agent, seen=seen) as url:
        yield url.removesuffix("/v1"), seen  # the README's form: the host, no /v1


def _simulate(tmp_path: Path, *args: str):
    ledger = tmp_path / "l.db"
    result = invoke(
        "simulate", str(SCENARIOS / "capital.yaml"), "--bot", str(BOTS / "text_processor_bot.py"),
        "--persona", "scripted", "--no-server", "--repeats", "1", "--ledger", str(ledger),
        "--json", *args,
    )  # fmt: skip
    return result, ledger


def test_llm_url_without_v1_serves_the_bot_and_the_judge(tmp_path, fake):
    host, seen = fake
    seen.clear()
    result, ledger = _simulate(tmp_path, "--llm-url", host)
    assert result.exit_code == 0, result.output
    (episode,) = json.loads(result.stdout)["episodes"]
    assert episode["outcome"] == "pass", episode
    assert episode["reward_parts"]["judge:success"] == 1.0  # judged, not "unscored"
    assert "judge:success" not in episode["unscored"]
    asked = [body for path, body in seen if path == "/v1/chat/completions"]
    assert any("response_format" in b for b in asked)  # the judge, at /v1
    assert any("response_format" not in b for b in asked)  # the bot, at /v1
    with Ledger(ledger) as store:
        (session,) = store.sessions()
        assert session.outcome == "pass"


def test_a_judge_url_that_404s_is_69_naming_it_before_any_call(tmp_path, fake):
    host, _ = fake
    judge = f"{host}/openai/v1"  # a /v1 root by its form, but the stub has nothing there
    result, ledger = _simulate(tmp_path, "--llm-url", host, "--judge-llm-url", judge)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"--judge-llm-url {judge} names {judge} (model base)" in result.stderr
    assert "is not an OpenAI-compatible /v1 root" in result.stderr
    assert f"GET {judge}/models: HTTP 404" in result.stderr
    assert not ledger.exists() or Ledger(ledger).sessions() == []


def test_a_judge_url_with_a_route_is_refused_as_usage_naming_the_root(tmp_path, fake):
    host, _ = fake
    given = f"{host}/v1/chat/completions"
    result, ledger = _simulate(tmp_path, "--llm-url", host, "--judge-llm-url", given)
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"--judge-llm-url {given!r}" in result.stderr
    assert f"/chat/completions), e.g. {host}/v1" in result.stderr
    assert not ledger.exists()


def test_the_bots_own_server_is_asked_too(tmp_path, fake):
    host, _ = fake  # the judge answers on its own URL; the bot's --llm-url is dead
    dead = f"http://127.0.0.1:{free_port()}"
    result, ledger = _simulate(tmp_path, "--llm-url", dead, "--judge-llm-url", host)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"the served model at {dead}/v1 does not answer" in result.stderr
    assert not ledger.exists() or Ledger(ledger).sessions() == []
