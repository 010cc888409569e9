"""`switchboard hook --client gemini` on what Gemini CLI 0.61 really sends and writes (recorded from
the real CLI by tests/clients/test_gemini.py): its hook input and its session file."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messaging.models import AgentSession
from switchboard_agent import hooks
from switchboard_agent.hooks import run_hook
from switchboard_agent.identity import _process

SESSION_ID = "f5ed9b5b-3378-4166-b5bc-7b1ae9a140d2"


def event(name: str, transcript: Path, **fields: Any) -> dict[str, Any]:
    """A hook input as Gemini CLI sends it: the common fields plus the event's own."""
    return {
        "session_id": SESSION_ID,
        "transcript_path": str(transcript),
        "cwd": "/work/frontend",
        "hook_event_name": name,
        "timestamp": "2026-12-06T23:36:52.980Z",
        **fields,
    }


def hook(payload: dict[str, Any]) -> dict[str, Any] | None:
    stdout = io.StringIO()
    assert run_hook(io.StringIO(json.dumps(payload)), stdout, client_name="gemini") == 0
    return json.loads(stdout.getvalue()) if stdout.getvalue() else None


def session_file(path: Path, *records: dict[str, Any]) -> Path:
    """A Gemini CLI session file (…/chats/session-*.jsonl): a metadata line, then one line per
    message, a message that changes written again under its id; `$set` lines update metadata."""
    head = {"sessionId": SESSION_ID, "startTime": "2026-12-06T23:36:51.154Z", "kind": "main"}
    lines = [head]
    for record in records:
        lines += [record, {"$set": {"lastUpdated": "2026-12-06T23:36:52.113Z"}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"u{len(parts)}", "type": "user", "content": list(parts)}


def model(content: Any, **more: Any) -> dict[str, Any]:
    return {
        "id": "m",
        "type": "gemini",
        "content": content,
        "thoughts": [],
        "model": "gemini-3.1-pro-preview",
        **more,
    }


def test_after_agent_reports_the_last_model_text_not_the_whole_prompt_s(
    inprocess_hub: str, tmp_path: Path
) -> None:
    """Gemini's `prompt_response` joins every text of the prompt's turns: the one before a tool
    call, and the answer an AfterAgent "deny" sent on from. The final answer is the last."""
    call = {"id": "c1", "name": "mcp_switchboard_send_message", "args": {"to": "peer", "message": "hi"}}
    transcript = session_file(
        tmp_path / "session-2026-12-06T23-36-f5ed9b5b.jsonl",
        user({"text": "Say hello to peer."}),
        model("I will message peer first."),
        model("I will message peer first.", toolCalls=[call]),
        user({"functionResponse": {"id": "c1", "name": call["name"], "response": {"output": "Queued."}}}),
        model("Sent it."),
        user({"text": "Switchboard: 1 message from other agent sessions. ..."}),
        model([{"text": "Peer says hi; ", "thought": False}, {"text": "nothing else to do."}]),
    )
    assert hook(event("SessionStart", transcript, source="startup")) is not None

    answer = hook(
        event(
            "AfterAgent",
            transcript,
            prompt="Say hello to peer.",
            prompt_response="I will message peer first.\nSent it.\nPeer says hi; nothing else to do.",
            stop_hook_active=True,
        )
    )

    assert answer is None
    session = AgentSession.objects.get(name="frontend")
    assert (session.status, session.final_answer) == ("idle", "Peer says hi; nothing else to do.")


def test_after_agent_takes_no_model_text_of_an_earlier_prompt(inprocess_hub: str, tmp_path: Path) -> None:
    transcript = session_file(
        tmp_path / "session.jsonl",
        user({"text": "first prompt"}),
        model("An answer to the first prompt."),
        user({"text": "second prompt"}),
        model("", toolCalls=[{"id": "c2", "name": "read_file", "args": {}}]),
    )
    hook(event("SessionStart", transcript, source="startup"))

    hook(
        event(
            "AfterAgent",
            transcript,
            prompt="second prompt",
            prompt_response="Read it.",
            stop_hook_active=False,
        )
    )

    assert AgentSession.objects.get(name="frontend").final_answer == "Read it."


def test_after_agent_without_its_session_file_reports_prompt_response(
    inprocess_hub: str, tmp_path: Path
) -> None:
    gone = tmp_path / "not-written.jsonl"
    hook(event("SessionStart", gone, source="startup"))

    hook(event("AfterAgent", gone, prompt="fix it", prompt_response="Fixed.", stop_hook_active=False))

    assert AgentSession.objects.get(name="frontend").final_answer == "Fixed."


@pytest.mark.parametrize(
    ("launch", "mode"),
    [
        (["-p", "go", "--yolo"], "bypass"),
        (["-y", "-p", "go"], "bypass"),
        (["--approval-mode", "yolo"], "bypass"),
        (["--approval-mode=yolo"], "bypass"),
        (["--yolo", "--approval-mode", "auto_edit"], "default"),  # Gemini takes --approval-mode first
        (["--approval-mode", "auto_edit"], "default"),
        (["-p", "go"], "default"),
    ],
)
def test_a_gemini_started_in_yolo_mode_registers_as_bypass(
    inprocess_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: list[str], mode: str
) -> None:
    """Gemini CLI passes hooks no approval mode; `gemini --yolo` runs every tool without asking, so
    peers' messages to it must be held as to a Claude Code in bypassPermissions."""
    gemini = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *launch])
    try:
        monkeypatch.setattr(hooks, "client_anchor", lambda: f"{gemini.pid}:{_process(gemini.pid)[1]}")
        hook(event("SessionStart", tmp_path / "session.jsonl", source="startup"))
    finally:
        gemini.kill()
        gemini.wait()

    assert AgentSession.objects.get(name="frontend").permission_mode == mode
