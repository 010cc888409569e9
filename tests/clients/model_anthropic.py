"""A stand-in for the Anthropic Messages API that plays one scripted conversation, for Claude Code
run inside a test's network namespace
(`python model_anthropic.py PORT LOG GATE TOOL ARGS FINAL [FINAL...]`).

The conversation is the requests that offer tools (Claude Code's main loop; the requests it makes
besides, a session title or a quota probe, offer none and get a short text answer). The first of
them is answered with a call to `TOOL` with the JSON `ARGS`, but only once the file `GATE` exists
(the test creates it when it has sent the client a message, so a hook after the tool call has
something to inject); every later one with a final answer: the first `FINAL` while the
conversation holds no answer of the model's in text, the second once it holds one (the client
went on after its turn's end, as a Stop hook that blocks makes it), and so on, the last repeated.
An empty `TOOL` calls no tool: the first final answer is the one held until `GATE` exists.

Every request is appended to the JSONL file `LOG` as `{"path", "body"}` before it is answered.
`stream: true` gets server-sent events (message_start, content_block_start/delta/stop,
message_delta, message_stop), anything else one JSON message; `/count_tokens` a rough count.
Stdlib only: it runs as a plain script in the namespace.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GATE_WAIT = 60.0  # seconds the first answer waits for the gate file at most
MODEL = "claude-stand-in"
CALL_ID = "toolu_stand_in_call"
SEARCH_ID = "toolu_stand_in_search"


class Script:
    def __init__(self, log: Path, gate: Path, tool: str, args: dict[str, Any], finals: list[str]) -> None:
        self.log, self.gate, self.tool, self.args, self.finals = log, gate, tool, args, finals
        self.lock = threading.Lock()

    def record(self, path: str, body: Any) -> None:
        with self.lock, self.log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"path": path, "body": body}) + "\n")

    def blocks(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The content blocks answering `body`, and the stop reason."""
        offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        answered = {
            block.get("tool_use_id")
            for turn in body.get("messages") or []
            if isinstance(turn.get("content"), list)
            for block in turn["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        }
        if CALL_ID in answered or (not self.tool and offered):
            given = final_answers(body)
            if not self.tool and given == 0:
                self.wait_for_gate()
            return [{"type": "text", "text": self.finals[min(given, len(self.finals) - 1)]}], "end_turn"
        if self.tool in offered:
            self.wait_for_gate()
            return [{"type": "tool_use", "id": CALL_ID, "name": self.tool, "input": self.args}], "tool_use"
        if "ToolSearch" in offered and SEARCH_ID not in answered and self.tool in json.dumps(body):
            # Claude Code offers MCP tools as deferred (name only): the model loads one first.
            search = {"query": f"select:{self.tool}", "max_results": 1}
            return [{"type": "tool_use", "id": SEARCH_ID, "name": "ToolSearch", "input": search}], "tool_use"
        return [{"type": "text", "text": "ok"}], "end_turn"

    def wait_for_gate(self) -> None:
        deadline = time.monotonic() + GATE_WAIT
        while not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def final_answers(body: dict[str, Any]) -> int:
    """How many answers in text the model has given in the conversation `body` carries."""
    return sum(
        1
        for turn in body.get("messages") or []
        if turn.get("role") == "assistant"
        and (
            isinstance(turn.get("content"), str)
            or any(isinstance(b, dict) and b.get("type") == "text" for b in turn.get("content") or [])
        )
    )


def message(blocks: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "id": f"msg_stand_in_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def events(blocks: list[dict[str, Any]], stop: str) -> bytes:
    """The same message as Messages API server-sent events."""
    start = message([], "")
    start["stop_reason"] = None
    out = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        out += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    out += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in out).encode()


def handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

        def answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            script.record(self.path, None)
            self.answer(
                404, b'{"type":"error","error":{"type":"not_found_error","message":"no"}}', "application/json"
            )

        def do_HEAD(self) -> None:
            self.answer(200, b"", "text/plain")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"unparsed": raw.decode(errors="replace")}
            script.record(self.path, body)
            route = self.path.split("?")[0]
            if route.endswith("/count_tokens"):
                self.answer(200, json.dumps({"input_tokens": len(raw) // 4}).encode(), "application/json")
            elif route.endswith("/v1/messages"):
                blocks, stop = script.blocks(body)
                if body.get("stream"):
                    self.answer(200, events(blocks, stop), "text/event-stream")
                else:
                    self.answer(200, json.dumps(message(blocks, stop)).encode(), "application/json")
            else:
                self.answer(
                    404,
                    b'{"type":"error","error":{"type":"not_found_error","message":"no"}}',
                    "application/json",
                )

    return Handler


def main() -> None:
    port, log, gate, tool, args, *finals = sys.argv[1:]
    script = Script(Path(log), Path(gate), tool, json.loads(args), finals)
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), handler(script))
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
