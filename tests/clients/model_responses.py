"""A stand-in for OpenAI's Responses API (`POST /v1/responses`, `stream: true`), enough for Codex CLI
to play one scripted conversation against it. Standard library only; run inside the test's network
namespace:

    python tests/clients/model_responses.py --port 8766 --log requests.jsonl --release release.flag \
        [--no-tool] [--final TEXT ...]

Each request is appended to `--log` as one JSON line (`{"method", "path", "body"}`). The script:

1. The first request of a turn (no tool result nor answer of the model's in its input yet) is held
   until the file `--release` exists (the test creates it once it has queued a message for the
   agent), then answered with a call to the tool whose name ends in `send_message` (to `peer`,
   "hello from the model"), in the first conversation only (`--each-conversation`: in every one).
   With `--no-tool`, it is answered with the first final answer instead.
2. Every later request is answered with a final answer: the first `--final` ("done" when none is
   given) while the input holds no answer of the model's in text, the second once it holds one
   (Codex went on after its turn's end, as a Stop hook that blocks makes it), and so on, the last
   repeated.

Codex names MCP tools its own way (`mcp__switchboard__send_message` and the like); the stand-in
takes the name from the request's `tools`, so the request log shows what Codex offered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

HOLD_LIMIT = 60.0  # never hold an answer longer than this, released or not
TOOL_SUFFIX = "send_message"


class Script:
    def __init__(
        self,
        log: Path,
        release: Path,
        *,
        tool: bool = True,
        finals: list[str] | None = None,
        each_conversation: bool = False,
    ) -> None:
        self.log = log
        self.release = release
        self.tool_call_due = tool
        self.each_conversation = each_conversation
        self.finals = finals or ["done"]
        self.counter = 0

    def record(self, method: str, path: str, body: Any) -> None:
        with self.log.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"method": method, "path": path, "body": body, "at": time.time()}) + "\n")

    def next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    async def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The output items for one request."""
        tool = tool_name(body.get("tools") or [])
        items = body.get("input") or []
        opening = tool is not None and not has_tool_result(items) and final_answers(items) == 0
        if opening:
            deadline = time.monotonic() + HOLD_LIMIT
            while not self.release.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if opening and tool and self.tool_call_due:
            self.tool_call_due = self.each_conversation
            name, namespace = tool
            call = {
                "type": "function_call",
                "id": self.next_id("fc"),
                "call_id": self.next_id("call"),
                "name": name,
                "arguments": json.dumps({"to": "peer", "message": "hello from the model"}),
                "status": "completed",
            }
            return [call | ({"namespace": namespace} if namespace else {})]
        text = self.finals[min(final_answers(items), len(self.finals) - 1)]
        return [
            {
                "type": "message",
                "id": self.next_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]


def tool_name(tools: list[dict[str, Any]]) -> tuple[str, str | None] | None:
    """The name Codex gave the Switchboard `send_message` tool, and the namespace it is in (Codex
    0.171 offers an MCP server's tools as `{"type": "namespace", "name": "mcp__switchboard",
    "tools": [...]}`; a call names both)."""
    for tool in tools:
        name = str(tool.get("name") or "")
        if tool.get("type") == "namespace" and "switchboard" in name:
            for inner in tool.get("tools") or []:
                if str(inner.get("name") or "").endswith(TOOL_SUFFIX):
                    return str(inner["name"]), name
        elif name.endswith(TOOL_SUFFIX) and "switchboard" in name:
            return name, None
    return None


def has_tool_result(items: list[Any]) -> bool:
    return any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)


def final_answers(items: list[Any]) -> int:
    """How many answers in text the model has given in the conversation `items` (a request's
    `input`) carries."""
    return sum(
        1
        for i in items
        if isinstance(i, dict)
        and i.get("type") == "message"
        and i.get("role") == "assistant"
        and any(isinstance(c, dict) and c.get("type") == "output_text" for c in i.get("content") or [])
    )


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def stream(response_id: str, items: list[dict[str, Any]]) -> bytes:
    """The SSE events of one streamed response made of `items`."""
    base = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": "stand-in"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}
    ]
    for index, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    events.append(
        {
            "type": "response.completed",
            "response": {**base, "status": "completed", "output": items, "usage": usage},
        }
    )
    return b"".join(sse(e) for e in events)


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip().split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, headers, body


def reply(status: str, content_type: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


async def handle(script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        method, path, headers, raw = await read_request(reader)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"undecoded": raw[:2000].decode("latin-1"), "encoding": headers.get("content-encoding")}
        script.record(method, path, body)
        if method == "POST" and path.split("?")[0].endswith("/responses") and isinstance(body, dict):
            items = await script.answer(body)
            writer.write(reply("200 OK", "text/event-stream", stream(script.next_id("resp"), items)))
        elif method == "GET" and path.split("?")[0].endswith("/models"):
            writer.write(
                reply("200 OK", "application/json", json.dumps({"object": "list", "data": []}).encode())
            )
        else:
            writer.write(reply("404 Not Found", "application/json", b'{"error": {"message": "not here"}}'))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def serve(port: int, script: Script) -> None:
    server = await asyncio.start_server(lambda r, w: handle(script, r, w), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--no-tool", action="store_true", help="call no tool: hold the first final answer")
    parser.add_argument("--final", action="append", help="the final answers, in order (default: done)")
    parser.add_argument(
        "--each-conversation",
        action="store_true",
        help="call the tool in every conversation, not the first only",
    )
    args = parser.parse_args()
    script = Script(
        args.log,
        args.release,
        tool=not args.no_tool,
        finals=args.final,
        each_conversation=args.each_conversation,
    )
    asyncio.run(serve(args.port, script))


if __name__ == "__main__":
    main()
