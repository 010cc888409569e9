"""What an alert says, in the three shapes a webhook receiver takes (pure: no database, no I/O).

- `slack`: `{"text": ...}` with Slack's mrkdwn links, which Slack incoming webhooks and the
  receivers that copy them (Mattermost, Rocket.Chat, Discord's /slack, ...) accept.
- `ntfy`: ntfy's JSON publishing: the configured URL is the topic's (https://host/topic); the
  JSON goes to the server's root with `topic`, `title`, `message`, `priority`, `tags`, `click`
  and one `view` action.
- `json`: the items as data, with `title` and `text`, for receivers of one's own.

An alert names sessions, hold ids, reasons in words, times and a link to the console: never a
message's text or summary, never a token or key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from messaging.errors import Invalid

MAX_LINES = 10  # items listed in one alert's text; the rest are counted ("and 4 more")

KINDS = ("escalated_hold", "hold_expiring", "session_dead")
NTFY_PRIORITY = {"escalated_hold": 4, "hold_expiring": 5, "session_dead": 4}
NTFY_TAGS = {"escalated_hold": ["rotating_light"], "hold_expiring": ["hourglass"], "session_dead": ["skull"]}


@dataclass(frozen=True)
class AlertItem:
    """One thing an alert is about: a hold (`id` is its delivery id) or a session (its id)."""

    kind: str
    subject: str  # "hold" or "session"
    id: str
    who: str  # "alice [ab12] → bob [cd34]" for a hold, "worker [ef56]" for a session
    why: str  # the reason in words, or how long it has been silent
    at: str  # ISO time: when the hold expires, or when the session was last heard from
    url: str  # the console page that acknowledges it ("" without a console URL)

    def line(self) -> str:
        when = _clock(self.at)
        if self.subject == "hold":
            return f"hold {self.id}: {self.who}, {self.why}; expires {when}"
        return f"{self.who}: {self.why}; last heard from {when}"


@dataclass(frozen=True)
class Post:
    """Where to POST and what."""

    url: str
    body: dict[str, Any]


def alert_title(kind: str, count: int, *, lead_seconds: int, hub_name: str = "") -> str:
    """The alert's headline: what happened, how many, on which hub."""
    if kind == "escalated_hold":
        what = (
            "An escalated hold needs an operator"
            if count == 1
            else f"{count} escalated holds need an operator"
        )
    elif kind == "hold_expiring":
        what = (
            f"A hold expires within {lead_seconds} s"
            if count == 1
            else f"{count} holds expire within {lead_seconds} s"
        )
    else:
        what = "An agent went silent" if count == 1 else f"{count} agents went silent"
    return f"Switchboard{' ' + hub_name if hub_name else ''}: {what}"


def alert_post(
    *,
    webhook_url: str,
    fmt: str,
    kind: str,
    items: list[AlertItem],
    lead_seconds: int,
    hub_name: str = "",
    list_url: str = "",
) -> Post:
    """The request that tells a webhook about `items` (all of one kind). `list_url` is the console
    page for several at once (the holds queue, the dashboard)."""
    if not items:
        raise ValueError("an alert is about at least one item")
    title = alert_title(kind, len(items), lead_seconds=lead_seconds, hub_name=hub_name)
    shown, more = items[:MAX_LINES], len(items) - MAX_LINES
    click = items[0].url if len(items) == 1 else list_url
    if fmt == "slack":
        lines = [f"*{_slack_escape(title)}*"]
        for item in shown:
            link = f" <{item.url}|acknowledge>" if item.url else ""
            lines.append(f"• {_slack_escape(item.line())}{link}")
        if more > 0:
            lines.append(f"… and {more} more" + (f": <{list_url}|open the console>" if list_url else ""))
        return Post(webhook_url, {"text": "\n".join(lines)})
    text = "\n".join([item.line() for item in shown] + ([f"… and {more} more"] if more > 0 else []))
    if fmt == "ntfy":
        root, topic = ntfy_root_and_topic(webhook_url)
        body: dict[str, Any] = {
            "topic": topic,
            "title": title,
            "message": text,
            "priority": NTFY_PRIORITY[kind],
            "tags": NTFY_TAGS[kind],
        }
        if click:
            body["click"] = click
            body["actions"] = [
                {"action": "view", "label": "Acknowledge" if len(items) == 1 else "Open", "url": click}
            ]
        return Post(root, body)
    return Post(
        webhook_url,
        {
            "source": "switchboard",
            "hub": hub_name,
            "kind": kind,
            "title": title,
            "text": f"{title}\n{text}",
            "count": len(items),
            "url": click,
            "items": [asdict(item) for item in items],
        },
    )


def ntfy_root_and_topic(url: str) -> tuple[str, str]:
    """https://host/prefix/topic → (https://host/prefix/, topic): ntfy takes JSON at its root."""
    base, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    path = path.split("?", 1)[0].strip("/")
    prefix, _, topic = path.rpartition("/")
    if not base or not host or not topic:
        raise Invalid("bad_url", "An ntfy alert URL names the topic: https://ntfy.example/your-topic.")
    return f"{base}://{host}/{prefix + '/' if prefix else ''}", topic


def _clock(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%H:%M:%S UTC")
    except ValueError:
        return iso


def _slack_escape(text: str) -> str:
    """Slack reads <...> as links and mentions (<!channel>): names are shown, never obeyed."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
