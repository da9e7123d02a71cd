"""The judge: Pipecat's own simulation judge, asked through an OpenAI-compatible endpoint.

A scenario's `success` and its criterion metrics are judged exactly as `pipecat eval` judges
them (`pipecat.evals.simulation_judge.EvalSimulationJudge` over an `EvalJudge` whose classifier
is an `LLMClassifier`): the goal is one yes/no over the whole call, the bot's tool calls shown
where it made them; a criterion is decided for each agent turn, and its score is the share of
turns that met it. The classifier asks for one JSON object under a JSON schema
(`response_format`), which vLLM enforces, so even a small served model answers in the form asked.

Where the judge (and the persona) run: `--judge-llm-url/--judge-model` (and
`--persona-llm-url/--persona-model`) win; else a scenario's `judge.eval:` (`simulator:`) block
where it names an OpenAI-compatible endpoint (`service: ollama`, with its `endpoint`, default
`http://localhost:11434/v1`, and `model`); else the served model. A block Pipecat would build
with a `factory` or another provider cannot run offline: `endpoint_for` says which flag to use.
Every URL goes through the one rule of `serving.roots` (a bare host gets `/v1`; any path but a
`/v1` root is refused), and every endpoint is asked for its models once before the first call
(`check_reachable`): one that does not answer, or answers 404 (no OpenAI-compatible `/v1` root),
stops the run as a service that is unavailable, rather than leaving each call without a caller
or a verdict. One that stops answering mid-run, or that, asked once more after a call it left
unjudged, answers with HTTP 404 or 5xx (a model it does not serve, say), makes the calls it
left unjudged harness errors (`stopped_answering`) and stops the run: never a verdict nobody
gave, never a run of unscored calls that exits 0.

Each answer may take `SimulationOptions.judge_timeout_s` (Pipecat's classifier default, 10 s, is
too short for the embedded server under load). A question the judge could not answer in time
(or answered with something that is no verdict) leaves what it decides unscored, with the
judge's own error as the reason: never a guessed "no", never a failed call. The judge's OpenAI
client is closed in the event loop that opened it (Pipecat leaves it open, and a client
collected under a later loop logs "Event loop is closed" tracebacks).
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pipecat.classifiers.base_classifier import ClassifierError
from pipecat.classifiers.llm.classifier import LLMClassifier
from pipecat.evals.judge import EvalJudge, JudgeVerdict
from pipecat.evals.services import DEFAULT_OLLAMA_JUDGE_MODEL
from pipecat.evals.simulation import EvalSimulationMetric, EvalSimulationScenario
from pipecat.evals.simulation_judge import EvalSimulationJudge, EvalSimulationJudgement
from pipecat.services.openai.llm import OpenAILLMService

from pipecat_rl import compat
from pipecat_rl.errors import ConfigError, ServingError
from pipecat_rl.scenarios import Scenario
from pipecat_rl.serving.roots import openai_base_url
from pipecat_rl.serving.server import API_KEY_ENV, client_api_key
from pipecat_rl.simulator.options import DEFAULT_JUDGE_TIMEOUT_S
from pipecat_rl.simulator.transport import Line

OLLAMA_URL = "http://localhost:11434/v1"
"""Where Pipecat's `service: ollama` blocks go when they name no `endpoint`."""

SERVED = "served model"
"""The `Endpoint.source` of the run's own served model."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible LLM the judge or the persona runs on."""

    url: str
    model: str
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level request parameters (a block's `extra:`, e.g. `reasoning_effort: none`)."""
    source: str = SERVED
    """Where it came from, for messages: a flag, a scenario's block, or the served model."""


def endpoint_for(
    block: dict[str, Any] | None, *, where: str, flag: str, path: object = None
) -> Endpoint | None:
    """The endpoint a scenario's `simulator:` / `judge.eval:` block names, or None for none.

    Raises:
        ConfigError: the block names a provider or a factory the simulator cannot run
            offline; the message names the flag that replaces it.
    """
    if not block:
        return None
    model_flag = flag.replace("-llm-url", "-model")
    fix = f"pass {flag} URL {model_flag} NAME (any OpenAI-compatible server), or drop the block"
    if block.get("factory"):
        raise ConfigError(
            f"{path}: {where}.factory builds its own LLM service, which the simulator cannot run "
            f"offline; {fix}"
        )
    service = str(block.get("service", "ollama")).lower()
    if service != "ollama":
        raise ConfigError(
            f"{path}: {where}.service {service!r} is a provider the simulator cannot reach "
            f"offline; {fix}"
        )
    extra = block.get("extra")
    key = f"{path}: {where}.endpoint" if path else f"{where}.endpoint"
    return Endpoint(
        url=openai_base_url(str(block.get("endpoint") or OLLAMA_URL), key),
        model=str(block.get("model") or DEFAULT_OLLAMA_JUDGE_MODEL),
        extra=dict(extra) if isinstance(extra, dict) else {},
        source=f"{where} of {path}",
    )


def judge_block(scenario: Scenario) -> dict[str, Any] | None:
    """A scenario's `judge.eval:` block (the judge LLM), if it has one."""
    block = (scenario.judge or {}).get("eval")
    return block if isinstance(block, dict) else None


PROBE_TIMEOUT_S = 3.0
"""How long the one request that checks an endpoint (GET /models) may take."""

LLM_FLAG = "--llm-url"
"""The bot's own server: probed as the persona's and judge's are, named by its flag."""

_REFUSED = (401, 403)
"""Statuses that say the endpoint is there and will not serve us (the key)."""

_NO_ROOT = "give the server's /v1 root, e.g. http://host:8000/v1"
"""The fix for a URL that answers, but not as an OpenAI-compatible root."""


def _probe_headers() -> dict[str, str]:
    """What the judge's and persona's clients send: the project's API key, or a placeholder."""
    return {"Authorization": f"Bearer {client_api_key()}"}


def _cannot_serve(status: int) -> bool:
    """Whether an HTTP status says this endpoint cannot serve us at all (not: this once)."""
    return status in _REFUSED or status == 404 or status >= 500


def check_reachable(endpoints: Iterable[tuple[Endpoint, str]]) -> None:
    """Ask each endpoint for its models once, before any call is made or judged.

    A persona or judge that cannot answer would leave every call without a caller or a
    verdict: the run stops here instead, with one cheap request per endpoint.

    Raises:
        ServingError: an endpoint does not answer, answers with a server error, refuses the
            key, or has no `/models` (HTTP 404 and the like: not an OpenAI-compatible `/v1`
            root), naming where it came from and what to do.
    """
    seen: set[str] = set()
    for endpoint, flag in endpoints:
        if endpoint.url in seen:
            continue
        seen.add(endpoint.url)
        try:
            response = httpx.get(
                f"{endpoint.url}/models", headers=_probe_headers(), timeout=PROBE_TIMEOUT_S
            )
        except httpx.HTTPError as e:
            raise ServingError(_unreachable(endpoint, flag, f"does not answer ({_why(e)})")) from e
        status = response.status_code
        if response.is_success:
            continue
        if status in _REFUSED:
            raise ServingError(_unreachable(
                endpoint, flag, f"refused the key (HTTP {status})",
                f"set {API_KEY_ENV} to the key it was started with",
            ))  # fmt: skip
        if status >= 500:
            raise ServingError(_unreachable(endpoint, flag, f"answers HTTP {status}"))
        raise ServingError(_unreachable(
            endpoint, flag,
            f"is not an OpenAI-compatible /v1 root (GET {endpoint.url}/models: HTTP {status})",
            _NO_ROOT,
        ))  # fmt: skip


def _why(error: httpx.HTTPError) -> str:
    """An HTTP client error as `Kind: detail` (httpx's timeouts often carry no detail)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _unreachable(endpoint: Endpoint, flag: str, why: str, fix: str = "start it") -> str:
    """The message for an endpoint that cannot serve: where it came from, why, what to do."""
    model_flag = flag.replace("-llm-url", "-model")
    if endpoint.source == SERVED:
        served = (
            f"the served model at {endpoint.url} {why}; {fix}, point {LLM_FLAG} at a server "
            "that serves"
        )
        if flag == LLM_FLAG:
            return served
        role = flag.removeprefix("--").split("-")[0]  # judge, persona
        return f"{served}, or give the {role} its own with {flag} URL {model_flag} NAME"
    return (
        f"{endpoint.source} names {endpoint.url} (model {endpoint.model}), which {why}; {fix}, "
        f"or pass {flag} URL {model_flag} NAME"
    )


async def stopped_answering(endpoint: Endpoint, role: str) -> str | None:
    """Why `endpoint`, which answered before the run, cannot serve as `role` now (None: it can).

    Asked after a call whose caller went quiet or whose judge left something unanswered: a
    server that is gone, and one that lists its models but answers a one-token question with
    HTTP 404 or 5xx (a model it does not serve, a broken engine), make the call a harness
    error, never a verdict. A question that only takes too long says nothing: a busy server
    leaves what it did not answer unscored, as it would have anyway.
    """
    headers = _probe_headers()
    question = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": "Answer yes."}],
        "max_tokens": 1,
    }
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
        try:
            listed = await client.get(f"{endpoint.url}/models", headers=headers)
        except httpx.HTTPError as e:
            return f"the {role} at {endpoint.url} stopped answering ({_why(e)})"
        if _cannot_serve(listed.status_code):
            return f"the {role} at {endpoint.url} stopped serving (HTTP {listed.status_code})"
        try:
            asked = await client.post(
                f"{endpoint.url}/chat/completions", json=question, headers=headers
            )
        except httpx.TimeoutException:
            return None  # busy, not gone
        except httpx.HTTPError as e:
            return f"the {role} at {endpoint.url} stopped answering ({_why(e)})"
    if not _cannot_serve(asked.status_code):
        return None
    said = _error_message(asked)
    return (
        f"the {role} at {endpoint.url} answers a question for model {endpoint.model} with HTTP "
        f"{asked.status_code}" + (f" ({said})" if said else "") + f"; check --{role}-model "
        f"and --{role}-llm-url"
    )


def _error_message(response: httpx.Response) -> str:
    """What an OpenAI-compatible error body says (`error.message`, `message`, `detail`), or ""."""
    try:
        body = response.json()
    except ValueError:  # an HTML error page says nothing a user needs
        return ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    said = error.get("message") if isinstance(error, dict) else error
    said = said or body.get("message") or body.get("detail")
    return " ".join(str(said).split())[:200] if said else ""


def judge_service(endpoint: Endpoint) -> OpenAILLMService:
    """An OpenAI-compatible service on `endpoint`, deterministic (temperature 0)."""
    return OpenAILLMService(
        api_key=client_api_key(),
        base_url=endpoint.url,
        settings=OpenAILLMService.Settings(
            model=endpoint.model, temperature=0.0, extra=dict(endpoint.extra)
        ),
    )


async def close_llm_client(service: Any) -> None:
    """Close the OpenAI client of an OpenAI-compatible service (Pipecat never closes it)."""
    client = compat.llm_client(service, None)
    if client is not None:
        await client.close()


class _Classifier(LLMClassifier):
    """Pipecat's LLM classifier, keeping why each failed question failed.

    Pipecat's judge turns a failed question into a verdict whose reason is only "judge call
    failed"; the error itself (a timeout, an answer that is not JSON) is what a user needs.
    """

    def __init__(self, llm: OpenAILLMService, timeout_s: float):
        super().__init__(llm=llm, timeout=timeout_s)
        self.failures: list[str] = []

    async def ask(self, state: Any, questions: Mapping[str, Any], **kwargs: Any) -> dict:
        """Answer as Pipecat does; remember the error of a question that fails."""
        try:
            return await super().ask(state, questions, **kwargs)
        except ClassifierError as e:
            self.failures.append(str(e))
            raise


class Judge:
    """Pipecat's `EvalJudge` on one endpoint with our time limit, closed in its own loop."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = DEFAULT_JUDGE_TIMEOUT_S):
        self._service = judge_service(endpoint)
        self._classifier = _Classifier(self._service, timeout_s)
        self.eval = EvalJudge(self._classifier, explainer=None)

    @property
    def failures(self) -> list[str]:
        """The errors of every question that failed so far, oldest first."""
        return self._classifier.failures

    def why_unanswered(self) -> str:
        """Why the judge's failed questions failed, each error once."""
        errors = "; ".join(dict.fromkeys(self.failures)) or "it gave no verdict"
        return f"the judge could not answer: {errors}"

    def unanswered(self, verdict: JudgeVerdict) -> str | None:
        """Why `verdict` is no answer at all, or None when the judge answered.

        Pipecat's judge gives a question that failed twice a verdict without probabilities.
        """
        if verdict.probabilities:
            return None
        last = self.failures[-1] if self.failures else "it gave no verdict"
        return f"the judge could not answer: {last}"

    async def close(self) -> None:
        """Release the judge and close its HTTP client."""
        try:
            await self.eval.close()
        finally:
            await close_llm_client(self._service)


def pipecat_simulation(scenario: Scenario) -> EvalSimulationScenario:
    """The scenario as Pipecat's own simulation object (what its judge reads)."""
    return EvalSimulationScenario(
        name=scenario.name,
        persona=scenario.persona,
        goal=scenario.goal,
        success=scenario.success,
        metrics=[
            EvalSimulationMetric(name=m.key, criterion=m.criterion, min_score=m.min_score)
            for m in scenario.metrics
            if m.criterion is not None
        ],
        source_path=scenario.source_path,
    )


@dataclass(frozen=True)
class ToolCallSeen:
    """A tool call the bot made, as the judge and the measures see it."""

    name: str
    arguments: dict[str, Any]
    at: float
    cancelled: bool = False


def conversation(transcript: Sequence[Line], calls: Sequence[ToolCallSeen]) -> list[dict]:
    """The call as a Pipecat conversation file holds it: lines and tool calls, in time order."""
    items: list[tuple[float, int, dict]] = []
    for i, line in enumerate(transcript):
        role = "user" if line.speaker == "caller" else "assistant"
        items.append((line.at, i, {"role": role, "content": line.text}))
    for call in calls:
        message = {
            "role": "tool_call",
            "name": call.name,
            "arguments": call.arguments,
            "cancelled": call.cancelled,
        }
        items.append((call.at, -1, message))
    return [message for _, _, message in sorted(items, key=lambda item: (item[0], item[1]))]


async def judge_call(
    scenario: Scenario,
    transcript: Sequence[Line],
    calls: Sequence[ToolCallSeen],
    endpoint: Endpoint,
    timeout_s: float = DEFAULT_JUDGE_TIMEOUT_S,
) -> EvalSimulationJudgement:
    """Judge one call's `success` and criterion metrics, as Pipecat's simulation judge does.

    What the judge could not answer stays unscored: a goal without a verdict keeps `none`
    with the judge's error as its reason; a metric with an unanswered turn gets no score
    (never a share of the turns that happened to be answered) and passes, as Pipecat treats a
    metric with nothing to judge.
    """
    judge = Judge(endpoint, timeout_s)
    try:
        judgement = await EvalSimulationJudge(pipecat_simulation(scenario), judge=judge.eval).judge(
            conversation(transcript, calls)
        )
    finally:
        await judge.close()
    why = judge.why_unanswered()
    goal = judgement.goal
    if goal.verdict not in ("yes", "no"):
        goal = replace(goal, reason=why)
    metrics = [
        replace(m, score=None, passed=True, failure_kind=None, reason=f"unscored: {why}")
        if any(v.verdict not in ("yes", "no") for v in m.verdicts)
        else m
        for m in judgement.metrics
    ]
    return EvalSimulationJudgement(goal=goal, metrics=metrics)


def resolve_endpoint(
    block: dict[str, Any] | None,
    *,
    flag_url: str | None,
    flag_model: str | None,
    served_url: str | None,
    where: str,
    flag: str,
    path: object = None,
) -> Endpoint | None:
    """Where the judge (or persona) runs: the flag, the scenario's block, or the served model.

    The served model answers as `base` unless `flag_model` names another; None when there is
    neither a flag, nor a block, nor a served model.
    """
    if flag_url:
        url = openai_base_url(flag_url, flag)
        return Endpoint(url, flag_model or "base", source=f"{flag} {flag_url}")
    named = endpoint_for(block, where=where, flag=flag, path=path)
    if named is not None:
        return named if flag_model is None else Endpoint(
            named.url, flag_model, named.extra, named.source
        )
    if served_url:
        return Endpoint(openai_base_url(served_url, LLM_FLAG), flag_model or "base")
    return None
