"""A team's conversation for export: the messages among its roster (every session that was ever a
member, the lead included), rendered by the messaging export core."""

from __future__ import annotations

import uuid
from datetime import datetime

from messaging.errors import NotFound
from messaging.services.export import ExportScope
from teams.models import Team
from teams.selectors import team_roster_ids


def team_export_scope(
    *, team_id: uuid.UUID | str, since: datetime | None = None, until: datetime | None = None
) -> ExportScope:
    """The export scope of a team: sender and recipient both on its roster (members who left
    included, for what they said while they were members), within [since, until)."""
    try:
        team = Team.objects.filter(pk=uuid.UUID(str(team_id))).first()
    except ValueError:
        team = None
    if team is None:
        raise NotFound(f"No team has the id {team_id!r}.")
    return ExportScope(
        kind="team",
        target=f"team:{team.pk}",
        label=f"team {team.name}",
        session_ids=frozenset(team_roster_ids(team)),
        since=since,
        until=until,
    )
