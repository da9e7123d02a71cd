"""A strict OpenAI-compatible server on loopback: streams fixed text and rejects fields OpenAI does
not know (as api.openai.com does). With `vllm=True` it answers like vLLM instead: it accepts
`return_token_ids` and returns prompt ids, per-chunk token ids and logprobs, so the recorder's
own cost can be measured without a model's timing noise (benchmarks/recorder_overhead.py).
`answer(body)`, when given, computes each reply's text from the request (a deterministic judge);
`seen` collects `(path, body)` of every request; `/v1/responses` streams the same text as
OpenAI's Responses API does."""

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pipecat_rl.serving.server import free_port

KNOWN = {"model", "messages", "stream", "stream_options", "temperature", "max_tokens", "tools",
         "tool_choice", "top_p", "seed", "frequency_penalty", "presence_penalty", "logprobs",
         "max_completion_tokens", "service_tier", "response_format"}  # fmt: skip


def _app(
    pieces: list[str],
    vllm: bool,
    answer: Callable[[dict], str] | None = None,
    seen: list[tuple[str, dict]] | None = None,
) -> FastAPI:
    app = FastAPI()
    fixed = pieces

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await request.json()
        if seen is not None:
            seen.append(("/v1/responses", body))
        text = answer(body) if answer else "".join(fixed)

        def event(n: int, payload: dict) -> str:
            return f"data: {json.dumps({**payload, 'sequence_number': n})}\n\n"

        async def stream():
            yield event(0, {"type": "response.output_text.delta", "item_id": "msg_1",
                            "output_index": 0, "content_index": 0, "delta": text,
                            "logprobs": []})  # fmt: skip
            done = {"id": "resp_1", "object": "response", "created_at": int(time.time()),
                    "model": body.get("model"), "output": [], "parallel_tool_calls": False,
                    "tool_choice": "auto", "tools": []}  # fmt: skip
            yield event(1, {"type": "response.completed", "response": done})

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models():
        owner = "vllm" if vllm else "openai"
        return {"object": "list", "data": [{"id": "gpt-4.1", "owned_by": owner}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if seen is not None:
            seen.append(("/v1/chat/completions", body))
        pieces = [answer(body)] if answer else fixed
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
async def serve_fake_openai(
    pieces: list[str],
    *,
    vllm: bool = False,
    answer: Callable[[dict], str] | None = None,
    seen: list[tuple[str, dict]] | None = None,
) -> AsyncIterator[str]:
    """Serve the fake on a free loopback port; yields its `/v1` base URL."""
    port = free_port()
    app = _app(pieces, vllm, answer, seen)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
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


@contextmanager
def fake_openai_thread(
    pieces: list[str],
    *,
    answer: Callable[[dict], str] | None = None,
    seen: list[tuple[str, dict]] | None = None,
) -> Iterator[str]:
    """`serve_fake_openai` from its own thread and loop, for code that runs its own loop (the
    CLI); yields its `/v1` base URL."""
    ready, stop, box = threading.Event(), threading.Event(), {}

    async def serve() -> None:
        async with serve_fake_openai(pieces, answer=answer, seen=seen) as url:
            box["url"] = url
            ready.set()
            await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(30), "the fake OpenAI server did not start"
        yield box["url"]
    finally:
        stop.set()
        thread.join(30)


if __name__ == "__main__":  # a separate process, so that its work does not share our GIL
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--pieces", type=int, default=40)
    args = parser.parse_args()
    pieces = [f" word{i}" for i in range(args.pieces)]
    uvicorn.run(_app(pieces, args.vllm), host="127.0.0.1", port=args.port, log_level="warning")
