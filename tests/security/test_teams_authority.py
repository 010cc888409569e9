"""Authority between agents (issue 30, items 12-14): who reads a session's final answers, who puts
a session on a team, and how much the hub writes on a session's behalf; and, from an audit with one
session token, who reads a team once off its roster and who reads a request's text. Each test
replays an attack."""

from __future__ import annotations

import json
import uuid
from typing import Any

from messaging.models import AuditEvent
from teams.models import Subscription
from tests.teams import conftest as team_fixtures
from tests.teams.conftest import frames_in, join_team

crew = team_fixtures.crew  # a lead with a team and two teammates, alice and bob


def _idle(api: Any, agent: Any, answer: str) -> None:
    assert api.patch("sessions/me", agent.token, {"status": "busy"}).status_code == 200
    done = api.patch("sessions/me", agent.token, {"status": "idle", "final_answer": answer})
    assert done.status_code == 200, done.json_body


def _inbox(api: Any, agent: Any) -> list[dict[str, Any]]:
    return api.get("inbox", agent.token).json_body["messages"]


# --- 12: final answers reach the lead, teammates and allowed watchers only --------------------------


def test_a_stranger_that_subscribes_gets_the_idle_event_but_never_the_final_answer(api, crew, register):
    stranger = register("stranger")
    _idle(api, crew.alice, "the deploy key is in vault/prod")
    made = [api.post("teams/subscriptions", stranger.token, {"target": crew.alice.id}) for _ in range(60)]
    assert all(m.status_code == 201 for m in made)
    notes = _inbox(api, stranger)
    assert notes and all("vault/prod" not in n["text"] for n in notes)
    assert "is idle now" in notes[0]["text"]
    assert all(m.json_body["final_answer"] is False for m in made)  # the subscriber is told up front


def test_the_lead_a_teammate_and_allowed_watchers_read_the_final_answer(api, crew, register, operator_token):
    mine, theirs = register("mine"), register("theirs")
    assert api.post("teams/watchers", crew.alice.token, {"watcher": mine.id}).status_code == 201
    # A session allows watchers only for itself; an operator for anyone.
    refused = api.post("teams/watchers", mine.token, {"watcher": theirs.id, "target": crew.alice.id})
    assert refused.status_code == 403
    by_operator = api.post("teams/watchers", operator_token, {"watcher": theirs.id, "target": crew.alice.id})
    assert by_operator.status_code == 201, by_operator.json_body
    assert api.patch("sessions/me", crew.alice.token, {"status": "busy"}).status_code == 200
    for reader in (crew.lead, crew.bob, mine, theirs):
        assert api.post("teams/subscriptions", reader.token, {"target": crew.alice.id}).status_code == 201
    _idle(api, crew.alice, "shipped build 42")
    for reader in (crew.lead, crew.bob, mine, theirs):
        notes = [m for m in _inbox(api, reader) if m["kind"] == "notification"]
        assert any("shipped build 42" in n["text"] for n in notes), reader.name

    # Revoked: the next notice carries no answer.
    grant = api.get("teams/watchers", crew.alice.token).json_body["watchers"]
    mine_grant = next(g for g in grant if g["watcher"] == mine.id)
    assert api.delete(f"teams/watchers/{mine_grant['id']}", crew.alice.token).status_code == 200
    api.post("teams/subscriptions", mine.token, {"target": crew.alice.id})
    assert all("shipped build 42" not in n["text"] for n in _inbox(api, mine))


def test_subscriptions_per_subscriber_are_bounded(api, register, settings):
    settings.SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION = 3
    me = register("collector")
    targets = [register(f"busy-{i}") for i in range(4)]
    for target in targets:
        assert api.patch("sessions/me", target.token, {"status": "busy"}).status_code == 200
    for target in targets[:3]:
        assert api.post("teams/subscriptions", me.token, {"target": target.id}).status_code == 201
    refused = api.post("teams/subscriptions", me.token, {"target": targets[3].id})
    assert refused.status_code == 409
    assert refused.json_body["reason"] == "too_many_subscriptions"
    # Withdrawing one makes room.
    first = api.get("teams/subscriptions", me.token).json_body["subscriptions"][-1]
    assert api.delete(f"teams/subscriptions/{first['id']}", me.token).status_code == 200
    assert api.post("teams/subscriptions", me.token, {"target": targets[3].id}).status_code == 201


# --- 13: joining a team takes the session's consent (or an operator) --------------------------------


def test_a_lead_cannot_put_a_session_on_its_team_without_its_consent(api, register):
    lead, victim, other_lead = register("grabber"), register("victim"), register("fair-lead")
    team = api.post("teams", lead.token, {"name": "grab"}).json_body
    grabbed = api.post(f"teams/{team['id']}/members", lead.token, {"session": victim.id})
    assert grabbed.status_code == 202, grabbed.json_body
    assert grabbed.json_body["member_id"] is None

    # Not a member: its final answer does not reach the lead, and it may join another team.
    assert api.get("teams/mine", victim.token).json_body["team"] is None
    assert victim.id not in {
        m["session"]["id"] for m in api.get(f"teams/{team['id']}", lead.token).json_body["members"]
    }
    _idle(api, victim, "private notes")
    assert all("private notes" not in m["text"] for m in _inbox(api, lead))
    [invitation] = [m for m in _inbox(api, victim) if m["kind"] == "notification"]
    assert json.loads(invitation["text"])["type"] == "team_invitation"

    other = api.post("teams", other_lead.token, {"name": "fair"}).json_body
    joined = join_team(api, other_lead, other["id"], victim)
    assert joined["role"] == "teammate"
    # The first invitation can no longer be accepted while it is on a team.
    late = api.post(f"teams/invitations/{grabbed.json_body['invitation']['id']}/accept", victim.token)
    assert late.status_code == 409


def test_an_invited_session_joins_by_accepting_and_may_decline(api, register):
    lead, yes, no = register("inviter"), register("yes-mate"), register("no-mate")
    team = api.post("teams", lead.token, {"name": "t"}).json_body
    inv_yes = api.post(f"teams/{team['id']}/members", lead.token, {"session": yes.id}).json_body["invitation"]
    inv_no = api.post(f"teams/{team['id']}/members", lead.token, {"session": no.id}).json_body["invitation"]
    seen = api.get("teams/invitations", yes.token).json_body["invitations"]
    assert [i["id"] for i in seen] == [inv_yes["id"]]
    # Only the invited session answers: the lead cannot accept for it.
    assert api.post(f"teams/invitations/{inv_yes['id']}/accept", lead.token).status_code == 403
    assert api.post(f"teams/invitations/{inv_yes['id']}/accept", no.token).status_code == 404
    accepted = api.post(f"teams/invitations/{inv_yes['id']}/accept", yes.token)
    assert accepted.status_code == 201 and accepted.json_body["member_id"]
    declined = api.post(f"teams/invitations/{inv_no['id']}/decline", no.token)
    assert declined.status_code == 200 and declined.json_body["state"] == "declined"
    assert api.get("teams/mine", no.token).json_body["team"] is None
    assert AuditEvent.objects.filter(kind="team.invitation_declined").count() == 1


def test_an_operator_adds_a_session_directly(api, register, operator_token):
    lead, mate = register("op-lead"), register("op-mate")
    team = api.post("teams", lead.token, {"name": "ops"}).json_body
    added = api.post(f"teams/{team['id']}/members", operator_token, {"session": mate.id})
    assert added.status_code == 201 and added.json_body["member_id"]
    assert api.get("teams/mine", mate.token).json_body["member"]["member_id"] == added.json_body["member_id"]


def test_a_session_that_asked_to_join_is_added_by_its_lead_with_no_further_step(api, register):
    lead, mate = register("spawner"), register("spawned")
    team = api.post("teams", lead.token, {"name": "spawn"}).json_body
    asked = api.post("teams/join", mate.token, {"lead": lead.id})
    assert asked.status_code == 202 and asked.json_body["invitation"] is None  # nothing of the team
    added = api.post(f"teams/{team['id']}/members", lead.token, {"session": mate.id})
    assert added.status_code == 201, added.json_body
    assert api.get("teams/mine", mate.token).json_body["team"]["id"] == team["id"]


# --- 14: hub-made notices are bounded --------------------------------------------------------------


def test_a_hundred_and_twenty_idle_reports_leave_the_lead_one_unread_idle_notification(api, crew):
    for i in range(120):
        _idle(api, crew.alice, f"answer {i}")
    notes = frames_in(api, crew.lead, "idle_notification")
    assert [n["frame"]["final_answer"] for n in notes] == ["answer 119"]
    # Direct sends on the same pair still obey their own limits.
    assert (
        AuditEvent.objects.filter(kind="delivery.expired", detail__reason__startswith="superseded").count()
        == 119
    )


def test_idle_notifications_read_as_they_come_respect_the_rate_bound(api, crew, settings):
    settings.SWITCHBOARD_NOTICE_RATE = 5
    settings.SWITCHBOARD_NOTICE_RATE_SECONDS = 600
    received = 0
    for i in range(20):
        _idle(api, crew.alice, f"answer {i}")
        received += len(frames_in(api, crew.lead, "idle_notification"))  # read each: none left to replace
    assert received == 5
    assert AuditEvent.objects.filter(kind="team.notice_dropped").count() == 15


def test_repeated_subscriptions_leave_one_unread_notice(api, register):
    me, worker = register("repeat"), register("idle-worker")
    for _ in range(60):
        assert api.post("teams/subscriptions", me.token, {"target": worker.id}).status_code == 201
    assert Subscription.objects.filter(subscriber_id=me.id).count() == 1  # told already, still unread
    assert len(_inbox(api, me)) == 1
    # Once read, subscribing again tells it again.
    assert api.post("teams/subscriptions", me.token, {"target": worker.id}).json_body["state"] == "fired"
    assert len(_inbox(api, me)) == 1


def test_task_unblocked_notices_are_one_unread_listing_every_ready_task(api, crew):
    def task(title: str, **fields: Any) -> dict[str, Any]:
        return api.post(crew.path("/tasks"), crew.lead.token, {"title": title, **fields}).json_body

    first, second = task("first"), task("second")
    for blocker in (first, second):
        assert api.post(f"tasks/{blocker['id']}/claim", crew.alice.token, {}).status_code == 200
    waiting = [task(f"waits {i}", blocked_by=[first["id"] if i % 2 else second["id"]]) for i in range(2)]
    for t in waiting:
        assigned = api.post(f"tasks/{t['id']}/assign", crew.lead.token, {"member_id": crew.members["bob"]})
        assert assigned.status_code == 200
    api.get("inbox", crew.bob.token)  # bob reads its assignment frames
    for blocker in (first, second):
        assert api.post(f"tasks/{blocker['id']}/complete", crew.alice.token, {}).status_code == 200
    [note] = [m for m in _inbox(api, crew.bob) if '"task_unblocked"' in m["text"]]
    assert sorted(json.loads(note["text"])["ready_tasks"]) == sorted(t["id"] for t in waiting)


def test_a_lead_that_ends_and_starts_teams_leaves_one_unread_invitation_notice(api, register, settings):
    """The attack, with one session token (mallory's): create a team, invite the victim, end the
    team, again and again. Each round made the hub write a new invitation notice, counted per team,
    so a fresh team id meant a fresh bound: the victim's inbox filled with the hub's notices (which
    no sender's share limits) until every other sender was refused (`recipient_queue_full`). The
    notice is bounded per inviting lead, and an ended team's invitations no longer stand."""
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10
    settings.SWITCHBOARD_TEAM_CHANGE_RATE = 1000  # the notice's own bound, whatever the churn's
    mallory, victim, alice = register("mallory"), register("victim"), register("alice")
    for i in range(30):
        team = api.post("teams", mallory.token, {"name": f"round {i}"}).json_body
        invited = api.post(f"teams/{team['id']}/members", mallory.token, {"session": victim.id})
        assert invited.status_code == 202, invited.json_body
        assert api.post(f"teams/{team['id']}/end", mallory.token, {}).status_code == 200
    sent = api.post("messages", alice.token, {"to": victim.id, "message": "the build is green"})
    assert sent.status_code == 201, sent.json_body
    notices = [m for m in _inbox(api, victim) if '"team_invitation"' in m["text"]]
    assert len(notices) <= 1
    # None of the ended teams' invitations is left open for the victim to answer.
    assert api.get("teams/invitations", victim.token).json_body["invitations"] == []
    # A live team's invitation still stands, and is answered as before (its notice may be past
    # the lead's bound after such a run: the invitation is listed all the same).
    live = api.post("teams", mallory.token, {"name": "for real"}).json_body
    invited = api.post(f"teams/{live['id']}/members", mallory.token, {"session": victim.id}).json_body
    [listed] = api.get("teams/invitations", victim.token).json_body["invitations"]
    assert listed["id"] == invited["invitation"]["id"]
    answered = api.post(f"teams/invitations/{invited['invitation']['id']}/accept", victim.token, {})
    assert answered.status_code == 201, answered.json_body


# --- only the current roster reads a live team; an ended team's last roster keeps its history ------


def _ask_plan(api: Any, crew: Any, plan: str) -> dict[str, Any]:
    """Alice asks the lead to approve `plan`: the send's answer (message and request)."""
    asked = api.post(
        crew.path("/frames"), crew.alice.token, {"type": "plan_approval_request", "body": {"plan": plan}}
    )
    assert asked.status_code == 201, asked.json_body
    return asked.json_body


def test_a_member_the_lead_removed_no_longer_reads_the_live_team(api, crew):
    removed = api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.lead.token)
    assert removed.status_code == 200, removed.json_body
    assert api.get("teams/mine", crew.bob.token).json_body["team"] is None
    # Work the team does after bob was taken off: a new task and a new request.
    task = api.post(crew.path("/tasks"), crew.alice.token, {"title": "rotate the prod database password"})
    assert task.status_code == 201, task.json_body
    _ask_plan(api, crew, "step 2")

    assert api.get(crew.path("/tasks"), crew.bob.token).status_code == 404
    assert api.get(f"tasks/{task.json_body['id']}", crew.bob.token).status_code == 404
    assert api.get(crew.path("/requests"), crew.bob.token).status_code == 404
    assert api.get(crew.path("/gates"), crew.bob.token).status_code == 404
    assert api.get(crew.path(), crew.bob.token).status_code == 404
    assert api.get("teams", crew.bob.token).json_body["teams"] == []
    # The ones still on the roster read on.
    assert api.get(crew.path("/tasks"), crew.alice.token).status_code == 200


def test_an_ended_team_is_read_by_its_last_roster_not_by_who_left_before(api, crew):
    """Given bob leaves the live team and the lead ends it later, then alice (on the roster at the
    end) still reads its history, and bob does not."""
    assert api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.bob.token).status_code == 200
    task = api.post(crew.path("/tasks"), crew.alice.token, {"title": "after bob left"}).json_body
    assert api.post(crew.path("/end"), crew.lead.token).status_code == 200

    for reader in (crew.lead, crew.alice):
        assert api.get(crew.path(), reader.token).status_code == 200, reader.name
        assert [t["id"] for t in api.get(crew.path("/tasks"), reader.token).json_body["tasks"]] == [
            task["id"]
        ]
        assert api.get(f"tasks/{task['id']}", reader.token).status_code == 200
        listed = api.get("teams?include_ended=true", reader.token).json_body["teams"]
        assert [t["id"] for t in listed] == [crew.team_id]
    assert api.get(crew.path(), crew.bob.token).status_code == 404
    assert api.get(crew.path("/tasks"), crew.bob.token).status_code == 404
    assert api.get(f"tasks/{task['id']}", crew.bob.token).status_code == 404
    assert api.get("teams?include_ended=true", crew.bob.token).json_body["teams"] == []


# Every route that names a team by id, with a body it would take from a member: (method, path
# below /teams/{id}, body). Member and request ids are filled in from the crew.
def _team_routes(crew: Any) -> list[tuple[str, str, Any]]:
    lead, alice, some_request = crew.members["lead-one"], crew.members["alice"], uuid.uuid4()
    return [
        ("GET", "", None),
        ("GET", "/tasks", None),
        ("GET", "/requests", None),
        ("GET", "/gates", None),
        ("POST", "/end", None),
        ("POST", "/members", {"session": crew.bob.id}),
        ("DELETE", f"/members/{alice}", None),
        ("DELETE", f"/members/{lead}", None),
        ("POST", "/messages", {"to_member": lead, "message": "still there?"}),
        ("POST", "/frames", {"type": "plan_approval_request", "body": {"plan": "p"}}),
        ("POST", f"/requests/{some_request}/respond", {"approve": True}),
        ("POST", f"/members/{alice}/shutdown", {}),
        ("POST", f"/shutdown/{some_request}", {"approve": True}),
        ("PUT", "/gates/task_created", {"url": "http://127.0.0.1:9/hook"}),  # never called
        ("DELETE", "/gates/task_created", None),
        ("POST", "/tasks", {"title": "one more"}),
    ]


def test_a_former_member_learns_nothing_from_the_team_s_id(api, crew):
    """The attack: bob, taken off the live team, still holds its id and its member ids. Reads
    answer him 404 as if the team did not exist; every other route that names the team by id must
    too, with the very answer of an id no team has. Otherwise ending it, inviting, taking a member
    off, a frame, a gate or a task tells him what the team did after he left: that alice left since
    (409 `stale_member`, naming her), who leads it (400 `lead_cannot_leave`), that it still runs
    (403) or has ended (409 `team_ended`)."""
    assert api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.lead.token).status_code == 200
    assert api.delete(crew.path(f"/members/{crew.members['alice']}"), crew.alice.token).status_code == 200
    nowhere = f"teams/{uuid.uuid4()}"

    def told() -> list[tuple[str, str, int, Any]]:
        """What bob learns: each route whose answer on the team differs from one on no team."""
        differs = []
        for method, suffix, body in _team_routes(crew):
            there = api.call(method, crew.path(suffix), crew.bob.token, body)
            absent = api.call(method, nowhere + suffix, crew.bob.token, body)
            assert absent.status_code == 404, (method, suffix, absent.json_body)
            if (there.status_code, there.json_body) != (absent.status_code, absent.json_body):
                differs.append((method, suffix, there.status_code, there.json_body))
        return differs

    assert told() == []  # the team runs on
    assert api.post(crew.path("/end"), crew.lead.token).status_code == 200
    assert told() == []  # the team has ended


# --- a request's text is read only by whoever may read the frame that carried it -------------------
# (audit with one session token: a held frame's text came back on GET /teams/{id}/requests)

# Synthetic AWS key pair (the documentation example): the sensitive tier holds any text carrying it.
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
LEAKED = f"aws_access_key_id={KEY_ID}\naws_secret_access_key={SECRET_KEY}"


def _requests_seen_by(api: Any, crew: Any, reader: Any) -> list[dict[str, Any]]:
    """The team's requests as `reader` (an agent, or an operator token) gets them."""
    token = getattr(reader, "token", reader)
    answer = api.get(crew.path("/requests"), token)
    assert answer.status_code == 200, answer.json_body
    return answer.json_body["requests"]


def test_a_plan_request_held_as_sensitive_is_not_readable_through_the_requests_list(
    api, crew, operator_token
):
    asked = _ask_plan(api, crew, f"deploy with\n{LEAKED}")
    # The frame itself is held for a human: the lead's inbox has nothing.
    assert asked["message"]["status"] == "held"
    assert asked["message"]["tier"] == "sensitive"
    assert frames_in(api, crew.lead) == []
    # Nor does the requests list give the lead, or bob who was never addressed, the held text.
    for reader in (crew.lead, crew.bob):
        [seen] = _requests_seen_by(api, crew, reader)
        assert SECRET_KEY not in json.dumps(seen), (
            f"{reader.name} read the held frame's text via GET /requests"
        )
        assert seen["payload"] is None and seen["withheld"] == ["payload", "reason"]
        assert seen["state"] == "open"  # what is asked of whom stays the team's to see
    # Its author reads its own request, and operators read it; masked, as the frame is sensitive.
    for reader in (crew.alice, operator_token):
        [seen] = _requests_seen_by(api, crew, reader)
        assert "deploy with" in seen["payload"]["plan"] and seen["masked"] is True
        assert SECRET_KEY not in json.dumps(seen) and KEY_ID not in json.dumps(seen)
    assert SECRET_KEY not in json.dumps(asked["request"])


def test_the_django_admin_shows_a_sensitive_request_masked_and_cannot_be_filtered_on_it(api, crew):
    """Given a plan request whose frame was held as sensitive, when a staff user opens it in the
    Django admin or filters the list on its payload, then the secret is neither shown nor
    confirmed: the admin shows the request as operators read it elsewhere, masked."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    request_id = _ask_plan(api, crew, f"deploy with\n{LEAKED}")["request"]["id"]
    staff = get_user_model().objects.create_superuser("root", password="root-password-1")
    admin = Client()
    admin.force_login(staff)

    page = admin.get(f"/admin/teams/framerequest/{request_id}/change/")
    assert page.status_code == 200
    shown = page.content.decode()
    assert SECRET_KEY not in shown and KEY_ID not in shown and "deploy with" in shown
    listing = admin.get(f"/admin/teams/framerequest/?payload__plan__icontains={SECRET_KEY[:12]}")
    assert listing.status_code in (200, 400) and request_id not in listing.content.decode()


def test_a_rejection_reason_held_as_sensitive_is_not_readable_through_the_requests_list(api, crew):
    request_id = _ask_plan(api, crew, "refactor")["request"]["id"]
    answered = api.post(
        crew.path(f"/requests/{request_id}/respond"),
        crew.lead.token,
        {"approve": False, "reason": f"use these instead: {LEAKED}"},
    )
    assert answered.status_code == 201, answered.json_body
    assert answered.json_body["message"]["status"] == "held"  # the response frame waits for a human
    assert [f for f in frames_in(api, crew.alice) if f["kind"] == "frame"] == []
    for reader in (crew.alice, crew.bob):
        [seen] = _requests_seen_by(api, crew, reader)
        assert SECRET_KEY not in json.dumps(seen), (
            f"{reader.name} read the held answer's reason via GET /requests"
        )
        assert seen["reason"] == "" and "reason" in seen["withheld"] and seen["state"] == "rejected"
    # Alice still reads the plan it wrote; bob, who was not addressed, reads neither.
    assert _requests_seen_by(api, crew, crew.alice)[0]["payload"] == {"plan": "refactor"}
    assert _requests_seen_by(api, crew, crew.bob)[0]["payload"] is None


def test_a_request_s_text_reaches_its_addressee_with_the_frame(api, crew, operator_token):
    """Given a plan request held for an operator, when the operator approves the hold, then the
    lead reads the request (masked) and may answer it; its answer's reason reaches alice."""
    asked = _ask_plan(api, crew, f"deploy with\n{LEAKED}")
    [hold] = api.get("holds", operator_token).json_body["holds"]
    approved = api.post(f"holds/{hold['id']}/approve", operator_token, {"reason": "fine"})
    assert approved.status_code == 200, approved.json_body
    [seen] = _requests_seen_by(api, crew, crew.lead)
    assert seen["withheld"] == [] and seen["masked"] is True
    assert "deploy with" in seen["payload"]["plan"] and SECRET_KEY not in json.dumps(seen)
    answered = api.post(
        crew.path(f"/requests/{asked['request']['id']}/respond"),
        crew.lead.token,
        {"approve": False, "reason": "not today"},
    )
    assert answered.status_code == 201, answered.json_body
    [seen] = _requests_seen_by(api, crew, crew.alice)
    assert seen["reason"] == "not today" and seen["withheld"] == []
    assert _requests_seen_by(api, crew, crew.bob)[0]["reason"] == ""


def test_the_lead_cannot_answer_a_request_whose_frame_never_reached_it(api, crew):
    """Given a plan request held for an operator, the lead answering it (by guessing its id from
    the list) is refused as stale, and the request stays open."""
    request_id = _ask_plan(api, crew, f"deploy with\n{LEAKED}")["request"]["id"]
    for approve in (True, False):
        answered = api.post(
            crew.path(f"/requests/{request_id}/respond"),
            crew.lead.token,
            {"approve": approve, "reason": "no"},
        )
        assert answered.status_code == 409, answered.json_body
        assert answered.json_body["reason"] == "stale_frame"
    assert _requests_seen_by(api, crew, crew.alice)[0]["state"] == "open"
    assert [f for f in frames_in(api, crew.alice) if f["kind"] == "frame"] == []
    assert AuditEvent.objects.filter(kind="frame.dropped", detail__why="stale").count() == 2


def test_the_team_group_hears_of_a_request_without_its_text(
    api, crew, monkeypatch, django_capture_on_commit_callbacks
):
    """Any member may hear `team.<id>`: it learns a request opened, not what it says. Operators'
    consoles get the text, masked."""
    from messaging.services import events

    sent: list[tuple[list[str], dict[str, Any]]] = []
    monkeypatch.setattr(events, "_send", lambda groups, event: sent.append((groups, event)))
    with django_capture_on_commit_callbacks(execute=True):
        _ask_plan(api, crew, f"deploy with\n{LEAKED}")
    told = {tuple(groups): event["data"] for groups, event in sent if event["kind"] == "team.request"}
    assert told[(f"team.{crew.team_id}",)]["payload"] is None
    assert told[(f"team.{crew.team_id}",)]["withheld"] == ["payload", "reason"]
    assert "deploy with" in told[("operators",)]["payload"]["plan"]
    assert SECRET_KEY not in json.dumps(list(told.values()))


def test_a_member_cannot_put_a_credential_on_the_board(api, crew, operator_token):
    """Given alice holds an AWS key, when she writes it into a task's description or result (which
    every member reads, and the hub cannot hold for an operator as it holds a message), then the
    write is refused with a sentence saying why and what to do, and the board does not change.
    An operator may still write what it chooses."""
    refused = api.post(crew.path("/tasks"), crew.alice.token, {"title": "deploy", "description": LEAKED})
    assert refused.status_code == 400, refused.json_body
    assert refused.json_body["reason"] == "secret_on_board"
    assert (
        "send it as a message" in refused.json_body["detail"]
        and SECRET_KEY not in refused.json_body["detail"]
    )
    assert api.get(crew.path("/tasks"), crew.bob.token).json_body["tasks"] == []

    task = api.post(crew.path("/tasks"), crew.alice.token, {"title": "deploy"}).json_body
    assert api.post(f"tasks/{task['id']}/claim", crew.alice.token, {}).status_code == 200
    leak = api.post(f"tasks/{task['id']}/complete", crew.alice.token, {"result": f"done, used {LEAKED}"})
    assert leak.status_code == 400 and leak.json_body["reason"] == "secret_on_board"
    [seen] = api.get(crew.path("/tasks"), crew.bob.token).json_body["tasks"]
    assert seen["status"] == "in_progress" and SECRET_KEY not in json.dumps(seen)

    by_operator = api.post(crew.path("/tasks"), operator_token, {"title": "rotate", "description": LEAKED})
    assert by_operator.status_code == 201, by_operator.json_body


# --- a team's gates are set by its lead or an operator, whichever surface calls -------------------


def test_the_gate_services_refuse_a_teammate(crew, settings):
    """Given a team with a gate an operator set, when a teammate calls `gate_set` or `gate_remove`
    directly (as any surface would), then each is refused and the gate stays as it was; the lead
    and an operator may."""
    import pytest

    from messaging.errors import Forbidden
    from messaging.models import AgentSession
    from messaging.principals import operator_principal, session_principal
    from teams.models import QualityGate
    from teams.services.gates import gate_remove, gate_set
    from teams.services.teams import team_get

    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["127.0.0.1"]
    team = team_get(team_id=crew.team_id)
    alice = session_principal(AgentSession.objects.get(pk=crew.alice.id))
    lead = session_principal(AgentSession.objects.get(pk=crew.lead.id))
    url = "http://127.0.0.1:9/gate"
    gate_set(team=team, event="task_completed", url=url, actor=operator_principal("op"))

    with pytest.raises(Forbidden):
        gate_set(team=team, event="task_completed", url="http://127.0.0.1:9/mine", actor=alice)
    with pytest.raises(Forbidden):
        gate_remove(team=team, event="task_completed", actor=alice)
    assert QualityGate.objects.get(team=team, event="task_completed").url == url

    gate_set(team=team, event="task_created", url=url, actor=lead)
    assert gate_remove(team=team, event="task_created", actor=lead)
    assert gate_remove(team=team, event="task_completed", actor=operator_principal("op"))
