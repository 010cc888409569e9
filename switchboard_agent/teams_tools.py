"""Team and task tools for the MCP server, over the teams REST API (/api/v1/teams, /api/v1/tasks).

The tools act on the caller's own live team (found with `GET /teams/mine`), so an agent never has
to carry team ids around; tasks are named by their numeric id, members by roster name or member id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult

from switchboard_agent.client import HubClient


def my_team(client: HubClient) -> dict[str, Any]:
    """The caller's live team, or a ToolError telling it how to get one."""
    found = client.my_team()
    if not found.get("team"):
        raise ToolError(
            "You are on no team: create_team to lead one, or join_team to ask a lead. Do not retry."
        )
    return found["team"]


def member_id(team: dict[str, Any], member: str) -> CallToolResult:
    """A roster member by member id or (case-insensitive) name."""
    for row in team.get("members", []):
        if member in (row["member_id"], row["session"]["id"]) or row["name"].casefold() == member.casefold():
            return row["member_id"]
    names = ", ".join(row["name"] for row in team.get("members", []))
    raise ToolError(f"No member {member!r} on your team (members: {names}). Do not retry unchanged.")


def _task_row(task: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "title", "status", "owner", "blocked_by", "blocked", "revision", "gate_pending", "result")
    return {k: task.get(k) for k in keep if task.get(k) not in (None, [], "")}


def register_team_tools(
    server: MCPServer, hub: Callable[..., Any], answer: Callable[..., CallToolResult]
) -> None:
    """Add the team, task, shutdown and notify-when-idle tools to `server`."""
    tool = server.tool

    def _joined(body: dict[str, Any], waiting: str) -> CallToolResult:
        """Joined (a member id), or waiting on the other side's yes (an invitation id)."""
        if body.get("member_id"):
            return answer(f"{body['name']} joined the team.", {"member_id": body["member_id"]})
        return answer(waiting, {"invitation_id": (body.get("invitation") or {}).get("id")})

    @tool(structured_output=False)
    def create_team(name: str = "") -> CallToolResult:
        """Create a team that you lead (one per lead). Then add_member to build the roster."""
        team = hub(lambda c: c.team_create(name=name))
        return answer(
            f"Team {team['name']!r} created; you lead it.", {"id": team["id"], "name": team["name"]}
        )

    @tool(structured_output=False)
    def add_member(session: str, name: str = "") -> CallToolResult:
        """Lead only: invite a session (name or ref) to your team; it joins when it accepts."""

        def add(c: HubClient) -> dict[str, Any]:
            return c.team_add_member(team_id=my_team(c)["id"], session=session, name=name or None)

        return _joined(hub(add), f"Invited {session}; it joins your team when it accepts.")

    @tool(structured_output=False)
    def join_team(lead: str, name: str = "") -> CallToolResult:
        """Ask `lead` to add you to its team; you join at once if it invited you."""
        body = hub(lambda c: c.team_join(lead=lead, name=name or None))
        if body.get("member_id"):
            return _joined(body, "")
        return answer(
            f"Asked {lead} to add you; you join when it does (withdraw_join_request to take it back).",
            {"request_id": (body.get("request") or {}).get("id")},
        )

    @tool(structured_output=False)
    def withdraw_join_request(request_id: str = "") -> CallToolResult:
        """Withdraw your request to join a team by id (no id: list your open requests)."""
        if not request_id:
            mine = hub(lambda c: c.join_requests())
            return answer(f"{len(mine)} open request(s) to join.", mine, key="requests")
        hub(lambda c: c.join_request_withdraw(request_id))
        return answer("Request withdrawn; nothing else changed.")

    @tool(structured_output=False)
    def answer_invitation(invitation_id: str = "", accept: bool = True, before: str = "") -> CallToolResult:
        """Accept or decline a team invitation by id (no id: list open ones, a page at a time; `before`
        is the `next` of the page before)."""
        if not invitation_id:
            page = hub(lambda c: c.invitations(before=before or None))
            sentence = f"{len(page['invitations'])} open invitation(s)"
            if page.get("next"):
                sentence += f"; more: answer_invitation with before={page['next']!r}"
            return answer(f"{sentence}.", {"invitations": page["invitations"], "next": page.get("next")})
        if not accept:
            hub(lambda c: c.invitation_answer(invitation_id, accept=False))
            return answer("Invitation declined; nothing changed.")
        return _joined(hub(lambda c: c.invitation_answer(invitation_id, accept=True)), "")

    @tool(structured_output=False)
    def allow_watcher(watcher: str) -> CallToolResult:
        """Let `watcher` read your final answers in its notify_when_idle notices."""
        grant = hub(lambda c: c.watcher_allow(watcher=watcher))
        return answer(f"{watcher} may read your final answers now.", {"grant": grant["id"]})

    @tool(structured_output=False)
    def list_tasks(status: Literal["any", "pending", "in_progress", "completed"] = "any") -> CallToolResult:
        """Your team's task board, optionally filtered by status."""
        wanted = None if status == "any" else status
        tasks = hub(lambda c: c.tasks(team_id=my_team(c)["id"], status=wanted))
        return answer(
            f"{len(tasks)} task(s) on your team's board.", [_task_row(t) for t in tasks], key="tasks"
        )

    @tool(structured_output=False)
    def create_task(title: str, description: str = "", blocked_by: tuple[int, ...] = ()) -> CallToolResult:
        """Add a task to your team's board; `blocked_by`: ids of tasks that must finish first."""
        task = hub(
            lambda c: c.task_create(
                team_id=my_team(c)["id"], title=title, description=description, blocked_by=list(blocked_by)
            )
        )
        return answer(f"Task {task['id']} created ({task['status']}).", _task_row(task), key="task")

    @tool(structured_output=False)
    def claim_task(task_id: int = 0) -> CallToolResult:
        """Claim a task by id (one winner), or the next unblocked one when task_id is 0."""
        if task_id:
            task = hub(lambda c: c.task_claim(task_id))
        else:
            task = hub(lambda c: c.task_claim_next())
            if task is None:
                return answer("No unblocked pending task to claim; wait, then list_tasks again.")
        return answer(
            f"You own task {task['id']} now; work on it, then update_task.", _task_row(task), key="task"
        )

    @tool(structured_output=False)
    def update_task(
        task_id: int,
        status: Literal["unchanged", "completed", "pending"] = "unchanged",
        result: str = "",
        add_blocked_by: tuple[int, ...] = (),
        remove_blocked_by: tuple[int, ...] = (),
    ) -> CallToolResult:
        """Complete your task (status completed, with result), release it (pending), or edit its blockers."""

        def update(c: HubClient) -> dict[str, Any]:
            task: dict[str, Any] = {}
            if add_blocked_by or remove_blocked_by:
                task = c.task_link(task_id, add=list(add_blocked_by), remove=list(remove_blocked_by))
            if status == "completed":
                task = c.task_complete(task_id, result=result)
            elif status == "pending":
                task = c.task_release(task_id)
            return task or c.task(task_id)

        task = hub(update)
        waiting = " (waiting for the team's quality gate)" if task.get("gate_pending") else ""
        return answer(f"Task {task['id']} is {task['status']}{waiting}.", _task_row(task), key="task")

    @tool(structured_output=False)
    def shutdown_request(member: str, reason: str = "") -> CallToolResult:
        """Lead only: ask a teammate (roster name or member id) to shut down; it approves or rejects."""

        def ask(c: HubClient) -> dict[str, Any]:
            team = my_team(c)
            return c.shutdown_request(team_id=team["id"], member_id=member_id(team, member), reason=reason)

        sent = hub(ask)
        request = sent.get("request") or {}
        return answer(
            f"Shutdown request sent to {member}; wait for its response.", {"request_id": request.get("id")}
        )

    @tool(structured_output=False)
    def shutdown_response(request_id: str, approve: bool, reason: str = "") -> CallToolResult:
        """Answer a shutdown request sent to you: approve (you then stop) or reject with a reason."""

        def respond(c: HubClient) -> dict[str, Any]:
            team_id = my_team(c)["id"]
            return c.shutdown_respond(team_id=team_id, request_id=request_id, approve=approve, reason=reason)

        hub(respond)
        if approve:
            return answer("Shutdown approved: finish up and stop now.")
        return answer("Shutdown rejected; your lead has been told why. Keep working.")

    @tool(structured_output=False)
    def notify_when_idle(agent: str) -> CallToolResult:
        """Be sent one notification when `agent` next goes idle or exits (at once if idle now)."""
        sub = hub(lambda c: c.notify_when_idle(target=agent))
        return answer(
            f"You will be notified when {agent} is next idle (until {sub.get('expires_at')}); keep working.",
            {"subscription": sub["id"], "state": sub["state"]},
        )
