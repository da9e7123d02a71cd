"""A strict OpenAI-compatible server on loopback: streams fixed text and rejects fields OpenAI does
not know (as api.openai.com does). With `vllm=True` it answers like vLLM instead: it accepts
`return_token_ids` and returns prompt ids, per-chunk token ids and logprobs, so the recorder's
own cost can be measured without a model's timing noise (benchmarks/recorder_overhead.py)."""

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pipecat_rl.serving import free_port

KNOWN = {"model", "messages", "stream", "stream_options", "temperature", "max_tokens", "tools",
         "tool_choice", "top_p", "seed", "frequency_penalty", "presence_penalty", "logprobs",
         "max_completion_tokens", "service_tier"}  # fmt: skip


def _app(pieces: list[str], vllm: bool) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        owner = "vllm" if vllm else "openai"
        return {"object": "list", "data": [{"id": "gpt-4.1", "owned_by": owner}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        unknown = (
            set(body) - KNOWN - ({"return_token_ids", "structured_outputs"} if vllm else set())
        )
        if unknown:
            return JSONResponse({"error": {"message": f"Unrecognized: {unknown}"}}, 400)

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
            payload = {"id": "x", "object": "chat.completion.chunk", "created": int(time.time()),
                       "model": body["model"],
                       "choices": [] if usage else [{"index": 0, "delta": delta,
                                                     "finish_reason": finish}]}  # fmt: skip
            if usage:
                payload["usage"] = usage
            if vllm and body.get("return_token_ids") and "content" in delta:
                if delta.get("role"):
                    payload["prompt_token_ids"] = list(range(1, 40))
                else:
                    payload["choices"][0]["token_ids"] = [len(delta["content"])]
                    token = {"token": delta["content"], "logprob": -0.5, "top_logprobs": []}
                    payload["choices"][0]["logprobs"] = {"content": [token]}
            return f"data: {json.dumps(payload)}\n\n"

        async def stream():
            yield chunk({"role": "assistant", "content": ""})
            for piece in pieces:
                yield chunk({"content": piece})
            yield chunk({}, "stop")
            yield chunk({}, usage={"prompt_tokens": 5, "completion_tokens": len(pieces),
                                   "total_tokens": 5 + len(pieces)})  # fmt: skip
            yield "data: [DONE]\n\n"

        if not body.get("stream"):
            text = "".join(pieces)
            return {"id": "x", "object": "chat.completion", "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces),
                              "total_tokens": 5 + len(pieces)}}  # fmt: skip
        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@asynccontextmanager
async def serve_fake_openai(pieces: list[str], *, vllm: bool = False) -> AsyncIterator[str]:
    """Serve the fake on a free loopback port; yields its `/v1` base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(pieces, vllm), host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)


if __name__ == "__main__":  # a separate process, so that its work does not share our GIL
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--pieces", type=int, default=40)
    args = parser.parse_args()
    pieces = [f" word{i}" for i in range(args.pieces)]
    uvicorn.run(_app(pieces, args.vllm), host="127.0.0.1", port=args.port, log_level="warning")
