"""The simulator's `PIPECAT_SETUP_FILES` hook: adapts each bot worker for its episode.

Pipecat loads this file by path and calls `setup_pipeline_worker(worker)` while every
`PipelineWorker` sets up, before any processor starts. Outside a simulated episode it does
nothing, so the file is harmless in a process that also runs real calls.

Recording is the other setup file, `processors/setup_file.py`; an episode loads both.
"""

from pipecat.pipeline.worker import PipelineWorker
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.botloader import prepare_worker


async def setup_pipeline_worker(worker: PipelineWorker) -> None:
    """Bypass speech services, point the LLM at the served model, bind the world's tools."""
    await prepare_worker(worker)


async def setup_worker_runner(runner: WorkerRunner) -> None:
    """Nothing to do per runner (defined so Pipecat does not warn that it is missing)."""
