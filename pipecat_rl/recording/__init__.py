"""What pipecat-rl adds to a user's pipeline: the recorder and the live-adapter selector."""

from pipecat_rl.recording.live_adapter import LiveAdapterSelector
from pipecat_rl.recording.llm_tee import LLMCall
from pipecat_rl.recording.recorder import RecorderObserver, RLRecorder, install
from pipecat_rl.recording.redaction import Redactor
from pipecat_rl.recording.session import RecordingHandle, SessionInfo, record_session
from pipecat_rl.recording.setup_file import setup_file_path

__all__ = [
    "LLMCall",
    "LiveAdapterSelector",
    "RLRecorder",
    "RecorderObserver",
    "RecordingHandle",
    "Redactor",
    "SessionInfo",
    "install",
    "record_session",
    "setup_file_path",
]
