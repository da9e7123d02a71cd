"""The old import path of `pipecat_rl.recording`, kept for bots that import from it."""

from pipecat_rl.recording import (
    LiveAdapterSelector,
    RecorderObserver,
    Redactor,
    RLRecorder,
    SessionInfo,
    install,
    record_session,
    setup_file_path,
)

__all__ = [
    "LiveAdapterSelector",
    "RLRecorder",
    "RecorderObserver",
    "Redactor",
    "SessionInfo",
    "install",
    "record_session",
    "setup_file_path",
]
