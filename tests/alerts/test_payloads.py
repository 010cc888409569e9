"""The three shapes of an alert (pure): what Slack-compatible, ntfy and plain JSON receivers get,
and that no shape can carry more than names, reasons, times and links."""

from __future__ import annotations

import pytest

from alerts.payloads import MAX_LINES, AlertItem, alert_post, alert_title, ntfy_root_and_topic
from messaging.errors import Invalid

HOLD = AlertItem(
    kind="escalated_hold",
    subject="hold",
    id="17",
    who="alice [ab12] → bob [cd34]",
    why="sensitive: AWS secret access key",
    at="2026-12-05T08:01:02+00:00",
    url="https://hub.example/alerts/holds/17/",
)
DEAD = AlertItem(
    kind="session_dead",
    subject="session",
    id="5f0c",
    who="worker [ef56] (script)",
    why="busy but silent for 12 min",
    at="2026-12-05T07:50:00+00:00",
    url="https://hub.example/alerts/sessions/5f0c/",
)


def _post(fmt: str, items: list[AlertItem], kind: str = "escalated_hold", **kw: str):
    return alert_post(
        webhook_url=kw.pop("url", "https://hooks.example/services/T/B/x"),
        fmt=fmt,
        kind=kind,
        items=items,
        lead_seconds=60,
        hub_name=kw.pop("hub_name", ""),
        list_url=kw.pop("list_url", "https://hub.example/holds/"),
    )


def test_slack_gets_text_with_a_link_to_acknowledge_each_item():
    post = _post("slack", [HOLD])
    assert post.url == "https://hooks.example/services/T/B/x"
    assert list(post.body) == ["text"]
    assert post.body["text"] == (
        "*Switchboard: An escalated hold needs an operator*\n"
        "• hold 17: alice [ab12] → bob [cd34], sensitive: AWS secret access key; expires 08:01:02 UTC "
        "<https://hub.example/alerts/holds/17/|acknowledge>"
    )


def test_slack_text_shows_names_but_never_obeys_them():
    """A session named like a Slack mention or link is escaped: <!channel> pings nobody."""
    item = AlertItem(**{**HOLD.__dict__, "who": "<!channel> [x1] → <https://evil|click> [x2]"})
    text = _post("slack", [item]).body["text"]
    assert "<!channel>" not in text and "<https://evil|click>" not in text
    assert "&lt;!channel&gt;" in text


def test_ntfy_posts_json_to_the_server_root_with_the_topic_from_the_url():
    post = _post("ntfy", [HOLD], url="https://ntfy.example/ops/switchboard-alerts")
    assert post.url == "https://ntfy.example/ops/"
    assert post.body == {
        "topic": "switchboard-alerts",
        "title": "Switchboard: An escalated hold needs an operator",
        "message": "hold 17: alice [ab12] → bob [cd34], sensitive: AWS secret access key; expires 08:01:02 UTC",
        "priority": 4,
        "tags": ["rotating_light"],
        "click": HOLD.url,
        "actions": [{"action": "view", "label": "Acknowledge", "url": HOLD.url}],
    }


@pytest.mark.parametrize(
    ("url", "root", "topic"),
    [
        ("https://ntfy.sh/mytopic", "https://ntfy.sh/", "mytopic"),
        ("http://127.0.0.1:8080/a/b/topic/", "http://127.0.0.1:8080/a/b/", "topic"),
        ("https://ntfy.sh/mytopic?auth=abc", "https://ntfy.sh/", "mytopic"),
    ],
)
def test_ntfy_root_and_topic(url, root, topic):
    assert ntfy_root_and_topic(url) == (root, topic)


def test_an_ntfy_url_without_a_topic_is_refused():
    with pytest.raises(Invalid):
        ntfy_root_and_topic("https://ntfy.sh/")


def test_json_carries_the_items_as_data_and_a_text_for_chat_receivers():
    post = _post("json", [DEAD], kind="session_dead", hub_name="lab")
    body = post.body
    assert body["title"] == "Switchboard lab: An agent went silent"
    assert body["kind"] == "session_dead" and body["count"] == 1 and body["url"] == DEAD.url
    assert body["items"] == [DEAD.__dict__]
    assert body["text"].startswith(body["title"] + "\n")
    assert "worker [ef56] (script): busy but silent for 12 min; last heard from 07:50:00 UTC" in body["text"]


def test_many_items_make_one_alert_that_lists_the_first_and_counts_the_rest():
    items = [AlertItem(**{**HOLD.__dict__, "id": str(i)}) for i in range(MAX_LINES + 4)]
    slack = _post("slack", items).body["text"]
    assert slack.splitlines()[0] == f"*Switchboard: {MAX_LINES + 4} escalated holds need an operator*"
    assert slack.count("acknowledge>") == MAX_LINES
    assert slack.endswith("… and 4 more: <https://hub.example/holds/|open the console>")
    ntfy = _post("ntfy", items, url="https://ntfy.example/t").body
    assert ntfy["click"] == "https://hub.example/holds/" and ntfy["actions"][0]["label"] == "Open"
    assert _post("json", items).body["count"] == MAX_LINES + 4


def test_titles_say_what_and_how_many():
    assert alert_title("hold_expiring", 1, lead_seconds=60) == "Switchboard: A hold expires within 60 s"
    assert alert_title("hold_expiring", 3, lead_seconds=90) == "Switchboard: 3 holds expire within 90 s"
    assert alert_title("session_dead", 2, lead_seconds=60) == "Switchboard: 2 agents went silent"


def test_without_a_console_url_there_is_no_link():
    item = AlertItem(**{**HOLD.__dict__, "url": ""})
    assert "<" not in _post("slack", [item], list_url="").body["text"]
    assert "click" not in _post("ntfy", [item], url="https://ntfy.example/t", list_url="").body
