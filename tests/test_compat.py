"""Private Pipecat names the project reads, each pinned by a test so an upgrade breaks here."""

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)

from pipecat_rl.compat import user_aggregator_vad


def test_user_aggregator_vad_reads_the_analyzer_it_was_built_with():
    vad = SileroVADAnalyzer()
    user, _ = LLMContextAggregatorPair(
        LLMContext(), user_params=LLMUserAggregatorParams(vad_analyzer=vad)
    )
    assert user_aggregator_vad(user) is vad
    plain, _ = LLMContextAggregatorPair(LLMContext())
    assert user_aggregator_vad(plain) is None
