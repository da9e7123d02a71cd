"""Serve the live adapter, chosen once per call: one processor in the bot's pipeline.

Put it anywhere before the LLM service::

    pipeline = Pipeline([transport.input(), LiveAdapterSelector(llm), stt, user_agg, llm, ...])

When the call starts (its `StartFrame`), it reads the ledger's live pointer once and sends the LLM
service an `LLMUpdateSettingsFrame` naming that adapter as the model (vLLM routes a request whose
`model` is an adapter's name to that adapter). A promote or rollback during the call only moves
the pointer: this call keeps its adapter and the next call gets the new one, so a call never
switches adapters mid-way. The ledger is read off the event loop and never raises into the
pipeline: if it cannot be read, the service keeps its configured model and a warning is logged.
"""

import asyncio
from pathlib import Path

from loguru import logger
from pipecat.frames.frames import Frame, LLMUpdateSettingsFrame, StartFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings

from pipecat_rl import compat
from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, ledger_file_missing, resolve_ledger_path


class LiveAdapterSelector(FrameProcessor):
    """Points `llm` at the ledger's live adapter at the start of each call.

    Event handlers:
        on_adapter_selected(selector, adapter, model): the ledger name chosen for this call and
            the model name sent to the LLM service.
    """

    def __init__(
        self,
        llm: LLMService,
        *,
        ledger: str | Path | None = None,
        base_model: str | None = None,
        **kwargs,
    ):
        """Create the selector.

        Args:
            llm: The LLM service whose model follows the live pointer.
            ledger: The ledger file or postgresql:// URL (default: --ledger's rule,
                `$PIPECAT_RL_LEDGER` or ./pipecat-rl.db).
            base_model: The model name that means "no adapter", used when the pointer says
                `base` or nothing was promoted yet (default: the model `llm` was created with).
            **kwargs: Passed to `FrameProcessor`.
        """
        super().__init__(**kwargs)
        self._llm = llm
        self._ledger_path = resolve_ledger_path(ledger)
        configured = llm.settings.model
        self._base_model = base_model or (
            configured if isinstance(configured, str) else BASE_ADAPTER
        )
        self._adapter: str | None = None
        compat.register_event(self, "on_adapter_selected")

    @property
    def adapter(self) -> str | None:
        """The live adapter chosen for the current call (None before it starts or if unread)."""
        return self._adapter

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Pass every frame on; on `StartFrame`, then send the LLM this call's model."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self._adapter = await asyncio.to_thread(self._read_live)
            if self._adapter is None:
                return
            model = self._base_model if self._adapter == BASE_ADAPTER else self._adapter
            await self.push_frame(
                LLMUpdateSettingsFrame(delta=LLMSettings(model=model), service=self._llm)
            )
            await compat.call_event(self, "on_adapter_selected", self._adapter, model)

    def _read_live(self) -> str | None:
        """The live adapter's name (`base` when none was promoted), or None if unreadable."""
        if ledger_file_missing(self._ledger_path):
            return BASE_ADAPTER
        try:
            with Ledger(self._ledger_path) as ledger:
                pointer = ledger.live()
        except LedgerError as e:
            logger.warning(f"{self}: cannot read the live adapter, keeping the model: {e}")
            return None
        return BASE_ADAPTER if pointer is None else pointer.adapter
