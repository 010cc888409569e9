"""Which hub session a long-running agent process (the MCP server) acts as, and the process tie
that lets hooks and MCP servers of one agent client find each other.

In order: `SWITCHBOARD_TOKEN` (a session registered elsewhere); with `SWITCHBOARD_ATTACH=hooks`,
the session its own client's hooks registered; otherwise a session of its own, registered on start
and deregistered on exit. Only a session it registered itself is deregistered.

How an attached MCP server knows its own client's session (never "the newest in this folder"):
1. Claude Code's own server (`SWITCHBOARD_CLIENT` `claude`, or unset): `CLAUDE_CODE_SESSION_ID`
   in its environment (Claude Code passes it to stdio MCP servers, and to hooks as `session_id`):
   the saved session that serves (or, after /clear, served) that id. If the hooks have not
   registered it yet, the server registers it under the same lock and key, so the hooks then find
   it. Another client's server ignores the variable: Claude Code passes it to every command its
   Bash tool runs as well, so a client started there inherits the id of the Claude Code session.
2. Otherwise the client process: hooks and MCP servers are both children of the agent client
   (hooks through a shell), so the saved session whose `anchor` is this server's own client process
   (pid and start time) is its session.
3. Neither: it refuses (`no_agent_session`) rather than guess. Two candidates: `ambiguous_session`.

With `SWITCHBOARD_CLIENT=codex` the server owns the session of its Codex process (Codex passes its
MCP servers no session id, and no SessionEnd hook is installed for it): on start it takes the
session its Codex process's hooks registered, or registers it, both under one lock and one key
(`config.process_session_key`); the hooks find it the same way; it deregisters on exit.
A Codex app server (`codex app-server`: the interactive TUI's background daemon, shared by every
TUI of the user) runs many conversations, each with an MCP server of its own, all its children:
there the session is the conversation's, keyed by its thread id, which hooks get as `session_id`
and the MCP server reads from its first tool call's `_meta` (`threadId`; Codex sends no id before).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from switchboard_agent.client import HubClient, HubError
from switchboard_agent.config import (
    SavedSession,
    hub_url,
    process_session_key,
    resumed_session_key,
    session_find,
    session_forget,
    session_lock,
    session_name,
    sessions_of_process,
)
from switchboard_agent.registration import session_register_saved

T = TypeVar("T")
# Interpreters (and wrappers) an agent client runs hook commands through; the client is the first
# ancestor that is none of these and no init. The user's own `$SHELL` counts too (`_is_shell`):
# Codex runs hooks through `$SHELL -lc`, and a shell that starts the command as a child instead of
# exec'ing it (nu, tcsh, xonsh, pwsh, elvish, ...) stays between the hook and Codex.
SHELLS = frozenset(
    {
        "sh", "bash", "rbash", "dash", "ash", "zsh", "fish", "ksh", "ksh93", "mksh", "pdksh", "oksh",
        "loksh", "yash", "posh", "busybox", "tcsh", "csh", "nu", "nushell", "xonsh", "elvish", "pwsh",
        "rc", "es", "osh", "ysh", "ion", "murex", "env", "timeout",
    }
)  # fmt: skip
# Process managers at the top of a (container's) process tree: never an agent client, so a walk
# that reaches one has found none. Any other PID 1 (`docker run -it image codex`) is the client.
INITS = frozenset(
    {
        "systemd", "init", "tini", "tini-static", "dumb-init", "docker-init", "catatonit",
        "s6-svscan", "runit", "runit-init", "openrc-init", "launchd", "sinit",
    }
)  # fmt: skip
COMM_LEN = 15  # /proc/<pid>/stat and ps show at most this much of a command's name
SESSION_ENV = "CLAUDE_CODE_SESSION_ID"


def _process(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, start time, command name) of a process, or None when it cannot be read.
    The start time makes the pair unique for the machine's uptime (pids are reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        return int(fields[1]), fields[19], name
    except (OSError, ValueError, IndexError):
        pass
    import subprocess  # only where there is no /proc: a hook's start does not pay for it

    try:  # no /proc (macOS): ps gives the same three facts
        out = subprocess.run(
            ["ps", "-o", "ppid=,lstart=,comm=", "-p", str(pid)], capture_output=True, text=True, timeout=2
        ).stdout.split()
        return int(out[0]), "-".join(out[1:6]), os.path.basename(" ".join(out[6:]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def _is_shell(name: str) -> bool:
    """Whether a process named `name` is a shell (or wrapper) between a hook and its client: one
    of SHELLS, or the user's `$SHELL` (the login shell Codex runs hooks through), whatever it is."""
    if name in SHELLS:
        return True
    login = os.path.basename(os.environ.get("SHELL", "").strip())[:COMM_LEN]
    return bool(login) and name[:COMM_LEN] == login


def client_anchor(pid: int | None = None) -> str:
    """The agent client process this process runs under, as "pid:start time": the first ancestor
    that is neither a shell nor an init. PID 1 can be it (an agent that is a container's entry
    point). "" when there is none or it cannot be read (then nothing is tied by process).

    Why skip shells rather than look for a known client by name: clients' process names are not
    stable (node scripts show as "node", npm launchers start native binaries, forks rename them),
    while what runs hooks in between is a shell; the MCP server is the client's direct child."""
    current = os.getppid() if pid is None else pid
    for _ in range(8):
        found = _process(current) if current > 0 else None  # PID 1's parent reads as 0
        if found is None:
            return ""
        parent, started, name = found
        name = name.removeprefix("-")
        if name in INITS:
            return ""
        if not _is_shell(name):
            return f"{current}:{started}"
        current = parent
    return ""


def runs_conversations(anchor: str) -> bool:
    """Whether the agent client process `anchor` is a Codex app server (`codex app-server ...`),
    which runs many conversations at once (the interactive TUI's background daemon serves every
    TUI of its user), rather than one Codex run (`codex exec`, `codex --no-daemon`)."""
    pid = anchor.partition(":")[0]
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        import subprocess  # only where there is no /proc (macOS)

        try:
            argv = subprocess.run(
                ["ps", "-o", "args=", "-p", pid], capture_output=True, text=True, timeout=2
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            return False
    return "app-server" in argv[1:]


def _ancestors() -> set[str]:
    """This process's ancestors, each as "pid:start time" (as `client_anchor` writes them)."""
    found, current = set(), os.getppid()
    for _ in range(16):
        facts = _process(current) if current > 0 else None
        if facts is None:
            break
        found.add(f"{current}:{facts[1]}")
        current = facts[0]
    return found


def held_elsewhere(saved: SavedSession, anchor: str) -> bool:
    """Whether `saved` is the session of another agent client process that still runs than
    `anchor`, this process's own client: one conversation open in two clients. A session of no
    recorded process, of one that is gone (see `anchor_alive`), or of an ancestor of this process
    (an MCP server its client started through a wrapper) is not another's. False when this
    process's client is unknown (`anchor` ""): then nothing tells the two apart."""
    if not saved.anchor or not anchor or saved.anchor == anchor:
        return False
    return anchor_alive(saved.anchor) and saved.anchor not in _ancestors()


def own_session_key(key: str, hub: str, anchor: str) -> str:
    """The saved-session key under which agent client process `anchor` keeps its hub session for
    the client's session id `key` (hooks and MCP server alike): `key`, unless the session saved for
    it is another live process's (`held_elsewhere`: a conversation resumed while its first client
    still runs), then `config.resumed_session_key`. A process that keeps its session under that
    key goes on doing so once the other has quit (and its saved session is gone), to its own end.
    Each live process so has exactly one hub session, and neither takes, re-ties or ends the
    other's."""
    own = resumed_session_key(key, anchor)
    if anchor and session_find(own, hub) is not None:
        return own
    found = session_find(key, hub)
    return own if found is not None and held_elsewhere(found, anchor) else key


class NoAgentSession(HubError):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail, status=409)


class Identity:
    def __init__(
        self,
        *,
        url: str | None = None,
        cwd: str | None = None,
        token: str | None = None,
        attach_to_hooks: bool = False,
        client_key: str | None = None,
        owns_client_session: bool = False,
        kind: str = "mcp",
        make_client: Callable[[str, str | None], HubClient] | None = None,
    ) -> None:
        self.url = url or hub_url()
        self.cwd = cwd or os.getcwd()
        self.kind = kind
        self.attach_to_hooks = attach_to_hooks
        self.client_key = client_key  # the agent client's session id, when it passes one
        self.owns_client_session = owns_client_session
        self._make_client = make_client or (lambda u, t: HubClient(u, t))
        self._client: HubClient | None = self._make_client(self.url, token) if token else None
        self.owned = False  # True when this process registered the session and must deregister it
        self.session: dict[str, Any] = {}
        self._saved_key: str | None = None
        self._registration_key: str | None = None  # of a registration of its own not answered yet
        self._lock = threading.Lock()
        self._ended = threading.Event()  # set when a close that took the client has finished
        self._ending = False  # a close took the client and may still be telling the hub

    @classmethod
    def from_env(cls, **kwargs: Any) -> Identity:
        client = os.environ.get("SWITCHBOARD_CLIENT", "").strip().lower()
        return cls(
            token=os.environ.get("SWITCHBOARD_TOKEN", "").strip() or None,
            attach_to_hooks=os.environ.get("SWITCHBOARD_ATTACH", "").strip().lower() == "hooks",
            # Claude Code's id is its own servers' only: it passes the variable to every command
            # its Bash tool runs too, so another client started there inherits it.
            client_key=(os.environ.get(SESSION_ENV, "").strip() or None)
            if client in ("", "claude")
            else None,
            owns_client_session=client == "codex",
            kind="codex" if client == "codex" else "mcp",
            **kwargs,
        )

    def register(self, *, stale_token: str | None = None, status: str = "busy") -> HubClient:
        """Register a session of this process's own. A Codex MCP server owns its Codex process's
        session instead: the one its hooks registered (or it registers, under the same lock and
        key, as `status`), saved so the hooks find it; it ends that session when it exits with Codex.
        `stale_token`: a saved token the hub refused (then a fresh registration replaces it)."""
        if not self.owns_client_session:
            client = self._make_client(self.url, None)
            # Kept until an answer arrives: a retry after a lost answer gets the same session back.
            self._registration_key = self._registration_key or secrets.token_urlsafe(32)
            self.session = client.register(
                name=session_name(self.cwd),
                cwd=self.cwd,
                kind=self.kind,
                status="busy",
                registration_key=self._registration_key,
            )
            self._client, self.owned, self._registration_key = client, True, None
            return client
        anchor = client_anchor()
        key = self._owned_key(anchor)
        if key is None:
            raise NoAgentSession(
                "no_agent_session",
                "This MCP server does not know its Codex conversation yet: a Codex app server "
                "names it only with a tool call. Retry the call.",
            )
        self._saved_key = key
        with session_lock(key):
            saved = session_find(key, self.url)
            if saved is None or saved.token == stale_token:
                saved = self._register_saved(
                    key=key, anchor=anchor, kind=self.kind, client=self.kind, status=status
                )
        self.owned = True
        return self._use(saved)

    def _owned_key(self, anchor: str) -> str | None:
        """The saved-session key of the client session a Codex MCP server owns: its Codex
        process's, or under an app server its conversation's thread id (its hooks' `session_id`),
        None until a tool call has named that conversation (`in_conversation`)."""
        if anchor and runs_conversations(anchor):
            return self.client_key or None
        return process_session_key(self.kind, anchor) if anchor else f"{self.kind}-{os.getpid()}"

    def client(self) -> HubClient:
        """The client acting as this process's session, resolved on first use."""
        with self._lock:
            if self._client is not None:
                return self._client
            return self._resolve(stale_token=None)

    def _use(self, saved: SavedSession) -> HubClient:
        self._client = self._make_client(self.url, saved.token)
        self.session = {"id": saved.id, "name": saved.name, "ref": saved.ref}
        return self._client

    def _resolve(self, *, stale_token: str | None) -> HubClient:
        if not self.attach_to_hooks or self.owns_client_session:
            return self.register(stale_token=stale_token)
        if self.client_key:
            return self._resolve_by_key(self.client_key, stale_token)
        anchor = client_anchor()
        found = [s for s in sessions_of_process(anchor, self.url) if s.token != stale_token]
        if len(found) == 1:
            return self._use(found[0])
        if found:
            raise NoAgentSession(
                "ambiguous_session",
                f"{len(found)} hub sessions were registered from this MCP server's client process; "
                "it will not guess which one is its own. End the others (`switchboard deregister "
                "--session KEY`) or set SWITCHBOARD_TOKEN.",
            )
        raise NoAgentSession(
            "no_agent_session",
            "This MCP server has no hub session yet: its client passes no session id, and its "
            "hooks have not registered one from its client process (they do on the next prompt or "
            "tool call once the hub answers). Retry after that; check that the hooks are installed "
            "(`switchboard install-hooks`).",
        )

    def _resolve_by_key(self, key: str, stale_token: str | None) -> HubClient:
        """The session the client's hooks keep for session id `key`, registered here (under the
        hooks' lock and key, so they find it) when they have not. The same id open in another
        live client process is that one's: this process's session goes by its own key."""
        key = own_session_key(key, self.url, client_anchor())
        saved = self._find_by_key(key)
        if saved is not None and saved.token != stale_token:
            return self._use(saved)
        # The hooks lock the session id they serve now (after /clear, a later one than `key`).
        with session_lock(saved.key if saved is not None else key):
            saved = self._find_by_key(key)
            if saved is not None and saved.token != stale_token:
                return self._use(saved)
            # A refused token is replaced in the same saved session (its ids and process kept).
            saved = self._register_saved(
                key=saved.key if saved is not None else key,
                anchor=saved.anchor if saved is not None else client_anchor(),
                kind="claude-code",
                keys=saved.keys if saved is not None else [key],
            )
        return self._use(saved)

    def _find_by_key(self, key: str) -> SavedSession | None:
        """The saved session serving session id `key`; else, when `key` was never registered (the
        hub away at the client's start, then /clear, after which the hooks registered the later
        id), the one session of this client process, which is that agent session's."""
        saved = session_find(key, self.url)
        if saved is not None:
            return saved
        mine = sessions_of_process(client_anchor(), self.url)
        return mine[0] if len(mine) == 1 else None

    def _register_saved(self, *, key: str, anchor: str, kind: str, **saved_fields: Any) -> SavedSession:
        """Register the saved session `key` as its hooks would (the caller holds its lock): a
        registration of it whose answer was lost is resent with its key, and a few saved sessions
        of agents that are gone are ended first (see `switchboard_agent.registration`)."""

        def make_client(token: str | None) -> HubClient:
            return self._make_client(self.url, token)

        return session_register_saved(
            make_client,
            key=key,
            hub=self.url,
            name=session_name(self.cwd),
            cwd=self.cwd,
            kind=kind,
            anchor=anchor,
            alive=anchor_alive,
            **saved_fields,
        )

    def call(self, fn: Callable[[HubClient], T]) -> T:
        """Run `fn` with the session's client. When the hub no longer knows that session (a
        restarted hub, or the hooks registered afresh), resolve it again once and retry."""
        client = self.client()
        try:
            return fn(client)
        except HubError as exc:
            if exc.status != 401 or not (self.owned or self.attach_to_hooks):
                raise
            with self._lock:
                self._client = None
                client = self._resolve(stale_token=client.token)
            return fn(client)

    def in_conversation(self, thread_id: str) -> None:
        """The Codex conversation (thread id) a tool call came from. An MCP server serves one
        conversation for its whole life, so the first one named is its own; a Codex MCP server
        keys its session by it when it runs under an app server (see `register`)."""
        if self.owns_client_session and thread_id:
            with self._lock:
                self.client_key = self.client_key or thread_id

    def start(self) -> None:
        """Register now unless attaching to a hooks session (those appear a moment later). The
        Codex process's session, registered here as Codex starts, before its first turn, is idle
        (its hooks report each turn's start and end)."""
        if self.owns_client_session:
            with self._lock:  # taken first: a close that comes meanwhile waits for this
                if self._client is not None:
                    return
                try:
                    self.register(status="idle")
                except NoAgentSession:
                    return  # its conversation is named by its first tool call (`in_conversation`)
        elif not self.attach_to_hooks:
            self.client()

    def close(self, *, wait: float = 1.0) -> None:
        """End the session this process registered. A registration still under way (the server
        registers in the background) gets up to `wait` seconds to finish, so that the session it
        makes is ended too; one that takes longer is not waited for. A close while another is
        still ending the session waits up to `wait` seconds for it (the MCP server's signal
        handler exits the process when this returns)."""
        held = self._lock.acquire(timeout=wait)
        try:
            client, self._client = self._client, None
            ending_elsewhere, self._ending = self._ending, self._ending or client is not None
        finally:
            if held:
                self._lock.release()
        if client is None:
            if ending_elsewhere:  # the process may exit when this returns: let that close finish
                self._ended.wait(wait)
            return
        try:
            if self.owned:
                client.deregister()
        finally:
            client.close()
            if self._saved_key:
                session_forget(self._saved_key)
            self._ended.set()


def anchor_alive(anchor: str) -> bool:
    """Whether the agent client process `anchor` ("pid:start time", see `client_anchor`) still
    runs. False only when it surely does not: no process has that pid, or the one that has it
    started at another time (the pid was reused). Unreadable facts count as alive."""
    pid_text, _, started = anchor.partition(":")
    try:
        pid = int(pid_text)
        if pid <= 0:
            return True  # not an anchor this module wrote: never take it for a gone process
        os.kill(pid, 0)
    except ValueError:
        return True
    except ProcessLookupError:
        return False
    except OSError:
        pass  # PermissionError: a process of another user has the pid; its start time tells
    found = _process(pid)
    return found is None or found[1] == started
