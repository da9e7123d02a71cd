"""What pipecat-rl adds to a user's pipeline: the recorder and the live-adapter selector."""

from pipecat_rl.processors.live_adapter import LiveAdapterSelector
from pipecat_rl.processors.llm_tee import LLMCall
from pipecat_rl.processors.recorder import RecorderObserver, RLRecorder, install
from pipecat_rl.processors.redaction import Redactor
from pipecat_rl.processors.session import RecordingHandle, SessionInfo, recording
from pipecat_rl.processors.setup_file import setup_file_path

__all__ = [
    "LLMCall",
    "LiveAdapterSelector",
    "RLRecorder",
    "RecorderObserver",
    "RecordingHandle",
    "Redactor",
    "SessionInfo",
    "install",
    "recording",
    "setup_file_path",
]
