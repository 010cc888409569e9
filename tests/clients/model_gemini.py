"""A stand-in for the Gemini API (`GOOGLE_GEMINI_BASE_URL`), enough of it to play one scripted turn
with the real Gemini CLI, started inside the test's network namespace:

    python model_gemini.py --port PORT --log requests.jsonl --release FILE

- `POST /v1beta/models/<model>:streamGenerateContent?alt=sse`: an SSE stream of
  GenerateContentResponse chunks. The conversation's first request that offers the Switchboard
  `send_message` tool is answered with a call to it (to `peer`, "hello from the model"), held until
  the file `--release` exists (the test creates it once its peer has messaged the client). The
  request that carries that call's result is answered "done", held until `--release-final`
  exists (when given); any later request of the conversation (a prompt the CLI sends on after its
  AfterAgent hook said "deny") is answered "done" at once.
- `:generateContent` (the CLI's side requests: its router's complexity score, next-speaker checks)
  gets a JSON answer that fits the schema it asks for (`complexity_score` 10, `next_speaker`
  "user", `model_choice` "flash"), or "ok";
  `:countTokens` a rough count. Anything else is a 404 in the API's error shape.

Each request (path and JSON body) is appended to `--log` as one line, before it is answered.
Standard library only (asyncio); one request per connection (`Connection: close`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

PEER = "peer"
GREETING = "hello from the model"
FINAL = "done"
HOLD_LIMIT = 60.0  # seconds the first answer waits for the release file at most

ROUTE = re.compile(r"^/v1(?:beta|alpha|)/models/(?P<model>[^:/]+):(?P<method>[A-Za-z]+)")


class Script:
    def __init__(self, log: Path, release: Path, release_final: Path | None = None) -> None:
        self.log = log
        self.release = release
        self.release_final = release_final

    def record(self, path: str, body: Any) -> None:
        with self.log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"at": time.time(), "path": path, "body": body}) + "\n")

    async def answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """The GenerateContentResponse for one request of the conversation."""
        if method == "countTokens":
            return {"totalTokens": len(json.dumps(body)) // 4}
        schema = (body.get("generationConfig") or body.get("config") or {}).get("responseJsonSchema") or (
            body.get("generationConfig") or {}
        ).get("responseSchema")
        if schema:
            return _text(json.dumps(_fill(schema)))
        tool = _tool_named(body, "send_message")
        contents = body.get("contents") or [{}]
        last = contents[-1].get("parts") or []
        if any("functionResponse" in p for p in last):
            await _hold(self.release_final)
            return _text(FINAL)
        if any("functionResponse" in p for c in contents for p in c.get("parts") or []):
            return _text(FINAL)
        if tool:
            await _hold(self.release)
            return _response([{"functionCall": {"name": tool, "args": {"to": PEER, "message": GREETING}}}])
        return _text("ok")


async def _hold(release: Path | None) -> None:
    """Wait until the file `release` exists (at most HOLD_LIMIT seconds)."""
    deadline = time.monotonic() + HOLD_LIMIT
    while release is not None and not release.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def _tool_named(body: dict[str, Any], suffix: str) -> str | None:
    """The declared function whose name is `suffix` or ends with `_suffix` (MCP tools may carry
    their server's name as a prefix)."""
    for tool in body.get("tools") or []:
        for declaration in tool.get("functionDeclarations") or []:
            name = str(declaration.get("name", ""))
            if name == suffix or name.endswith("_" + suffix):
                return name
    return None


def _fill(schema: dict[str, Any]) -> Any:
    """A value that fits a (small) JSON schema, with the answers the CLI's checks hope for."""
    kind = schema.get("type", "object")
    kind = kind.lower() if isinstance(kind, str) else "object"
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        known = {"next_speaker": "user", "model_choice": "flash", "complexity_score": 10}
        props = schema.get("properties") or {}
        return {k: known.get(k, _fill(v)) for k, v in props.items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return "ok"


def _text(text: str) -> dict[str, Any]:
    return _response([{"text": text}])


def _response(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "stand-in",
    }


async def handle(script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        verb, target, _ = lines[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        raw = await reader.readexactly(int(headers.get("content-length") or 0))
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"raw": raw.decode("utf-8", "replace")}
        script.record(f"{verb} {target}", body)
        path, _, query = target.partition("?")
        route = ROUTE.match(path)
        if (
            verb != "POST"
            or route is None
            or route["method"]
            not in (
                "streamGenerateContent",
                "generateContent",
                "countTokens",
            )
        ):
            error = {"error": {"code": 404, "message": f"no {verb} {path} here", "status": "NOT_FOUND"}}
            return await _send(writer, 404, "application/json", json.dumps(error).encode())
        answer = await script.answer(route["method"], body)
        if route["method"] == "streamGenerateContent":
            if "alt=sse" in query:
                return await _send(
                    writer, 200, "text/event-stream", f"data: {json.dumps(answer)}\r\n\r\n".encode()
                )
            return await _send(writer, 200, "application/json", json.dumps([answer]).encode())
        await _send(writer, 200, "application/json", json.dumps(answer).encode())
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _send(writer: asyncio.StreamWriter, status: int, kind: str, payload: bytes) -> None:
    reason = {200: "OK", 404: "Not Found"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(payload)}\r\n"
        f"Connection: close\r\n\r\n".encode()
        + payload
    )
    await writer.drain()


async def serve(port: int, script: Script) -> None:
    server = await asyncio.start_server(lambda r, w: handle(script, r, w), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--release-final", type=Path)
    args = parser.parse_args()
    asyncio.run(serve(args.port, Script(args.log, args.release, args.release_final)))


if __name__ == "__main__":
    main()
