"""One test per reliance on a private Pipecat name (`pipecat_rl.compat`): an upgrade that renames
one fails here, by name, rather than somewhere inside a simulation or a recorded call."""

import asyncio
import inspect

import pytest
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.openai.base_llm import BaseOpenAILLMService
from pipecat.services.openai.llm import OpenAILLMService

from pipecat_rl import compat


def _llm(url: str = "http://127.0.0.1:9/v1", key: str = "k") -> OpenAILLMService:
    return OpenAILLMService(
        api_key=key, base_url=url, settings=OpenAILLMService.Settings(model="base")
    )


def test_pipeline_processor_lists_and_relinking():
    a, b, c = FrameProcessor(), FrameProcessor(), FrameProcessor()
    pipeline = Pipeline([a, b])
    chain = compat.pipeline_chain(pipeline)
    assert chain[1:-1] == [a, b]  # Pipecat's own source and sink around ours
    assert compat.child_processors(pipeline) == chain
    compat.replace_processor(pipeline, 2, c)
    assert compat.pipeline_chain(pipeline)[1:-1] == [a, c]
    assert a.next is c and c.previous is a and c.next is chain[-1]  # relinked in place
    d = FrameProcessor()
    compat.set_pipeline_chain(pipeline, [chain[0], a, d, c, chain[-1]])  # one becomes two
    assert compat.pipeline_chain(pipeline)[1:-1] == [a, d, c]
    assert a.next is d and d.next is c and c.previous is d


def test_llm_client_base_url_and_key():
    llm = _llm("http://127.0.0.1:9/v1", "k-1")
    assert compat.llm_base_url(llm) == "http://127.0.0.1:9/v1"
    assert compat.llm_api_key(llm) == "k-1"
    assert (
        compat.llm_client(llm).base_url
        == llm.create_client(api_key="x", base_url="http://127.0.0.1:9/v1").base_url
    )


def test_redirect_llm_swaps_the_client_it_sends_with():
    llm = _llm("http://127.0.0.1:9/v1", "old")
    compat.redirect_llm(llm, base_url="http://127.0.0.1:7/v1", api_key="new")
    assert compat.llm_base_url(llm) == "http://127.0.0.1:7/v1"
    assert compat.llm_api_key(llm) == "new"


def test_llm_settings_are_the_live_object_requests_are_built_from():
    llm = _llm()
    compat.llm_settings(llm).model = "adapter-v3"
    compat.llm_settings(llm).max_tokens = 7
    assert llm.settings.model == "adapter-v3"
    source = inspect.getsource(BaseOpenAILLMService.build_chat_completion_params)
    assert "self._settings" in source  # what we change is what the request is built from


async def test_register_and_call_our_own_events():
    processor = FrameProcessor()
    compat.register_event(processor, "on_something")
    seen, fired = [], asyncio.Event()

    @processor.event_handler("on_something")
    async def handler(obj, value):
        seen.append((obj, value))
        fired.set()

    await compat.call_event(processor, "on_something", 42)  # handlers run as their own tasks
    await asyncio.wait_for(fired.wait(), 60)  # a hang guard only: the event is the sync
    assert seen == [(processor, 42)]


async def test_call_event_runs_every_handler_of_an_event_pipecat_registered():
    processor = FrameProcessor()  # Pipecat registers on_before_process_frame itself, as sync
    seen = []

    @processor.event_handler("on_before_process_frame")
    async def first(obj, frame):
        seen.append(("first", obj, frame))

    @processor.event_handler("on_before_process_frame")
    async def second(obj, frame):
        seen.append(("second", obj, frame))

    await compat.call_event(processor, "on_before_process_frame", "frame")
    assert seen == [("first", processor, "frame"), ("second", processor, "frame")]
    await compat.call_event(processor, "on_never_registered", "frame")  # no handler, no error
    assert len(seen) == 2


def test_stream_methods_are_looked_up_on_the_instance_per_request():
    # The tee replaces both on the instance; it works only while Pipecat's streaming path calls
    # `self.build_chat_completion_params` from `get_chat_completions`, and the frame-processing
    # path calls `self.get_chat_completions`.
    for name in ("build_chat_completion_params", "get_chat_completions"):
        assert name in compat.STREAM_METHODS
        assert callable(getattr(BaseOpenAILLMService, name))
    get = inspect.getsource(BaseOpenAILLMService.get_chat_completions)
    assert "self.build_chat_completion_params(" in get
    service = inspect.getsource(BaseOpenAILLMService)
    assert "await self.get_chat_completions(" in service
    llm = _llm()
    compat.replace_method(llm, "get_chat_completions", lambda original: "replaced")
    assert llm.get_chat_completions == "replaced"
    assert _llm().get_chat_completions != "replaced"  # the class is untouched
    with pytest.raises(ValueError, match="not a method"):
        compat.replace_method(llm, "process_frame", lambda original: original)


async def test_responses_create_stream_is_looked_up_on_the_instance_per_request():
    # The Responses tee replaces `_create_stream` on the instance; it works only while the HTTP
    # service opens every streamed request with `self._create_stream(params)`, params a dict.
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.openai.responses.llm import OpenAIResponsesHttpLLMService

    assert "_create_stream" in compat.STREAM_METHODS
    llm = OpenAIResponsesHttpLLMService(api_key="k", base_url="http://127.0.0.1:9/v1")
    seen: list[dict] = []

    class Empty:
        async def __aiter__(self):
            return
            yield

        async def close(self):
            pass

    def make(original):
        assert original.__self__ is llm  # the bound method Pipecat would have called

        async def create_stream(params):
            seen.append(params)
            return Empty()

        return create_stream

    compat.replace_method(llm, "_create_stream", make)
    context = LLMContext(messages=[{"role": "user", "content": "hi"}])
    for _ in range(2):
        await llm._process_context(context)
    assert len(seen) == 2 and all(isinstance(p, dict) and p["stream"] is True for p in seen)
    assert seen[0]["input"] == [{"role": "user", "content": "hi"}]
    other = OpenAIResponsesHttpLLMService(api_key="k")  # the class is untouched
    assert other._create_stream.__func__ is OpenAIResponsesHttpLLMService._create_stream


def test_a_responses_service_turns_into_its_http_sibling_with_our_key_and_client():
    import openai
    from pipecat.services.openai.responses.llm import (
        OpenAIResponsesHttpLLMService,
        OpenAIResponsesLLMService,
    )

    llm = OpenAIResponsesLLMService(api_key="cloud-key")
    assert compat.llm_client(FrameProcessor(), None) is None  # not an OpenAI-client service
    compat.switch_class(llm, OpenAIResponsesHttpLLMService)
    assert isinstance(llm, OpenAIResponsesHttpLLMService)
    compat.set_responses_api_key(llm, "local")
    assert llm._api_key == "local"
    client = openai.AsyncOpenAI(api_key="local", base_url="http://127.0.0.1:9/v1")
    compat.set_llm_client(llm, client)
    assert compat.llm_client(llm) is client


def test_user_aggregator_vad_reads_the_analyzer_it_was_built_with():
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )

    vad = SileroVADAnalyzer()
    user, _ = LLMContextAggregatorPair(
        LLMContext(), user_params=LLMUserAggregatorParams(vad_analyzer=vad)
    )
    assert compat.user_aggregator_vad(user) is vad
    plain, _ = LLMContextAggregatorPair(LLMContext())
    assert compat.user_aggregator_vad(plain) is None


def test_loopback_ice_offers_127_0_0_1_only_and_restores_aioices_gatherer():
    ice = pytest.importorskip("aioice.ice")
    original = ice.get_host_addresses
    assert "127.0.0.1" not in original(use_ipv4=True, use_ipv6=False)  # why we need it
    with compat.loopback_ice():
        with compat.loopback_ice():  # concurrent calls in one process
            assert ice.get_host_addresses(use_ipv4=True, use_ipv6=True) == ["127.0.0.1"]
        assert ice.get_host_addresses(use_ipv4=True, use_ipv6=False) == ["127.0.0.1"]
    assert ice.get_host_addresses is original
