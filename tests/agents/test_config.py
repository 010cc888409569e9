"""Names the agent side picks for a session are always names the hub accepts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.names import name_problem, normalize_name
from messaging.services.sessions import RESERVED_NAMES as HUB_RESERVED
from switchboard_agent.config import RESERVED_NAMES, session_name


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        ("/work/billing", "billing"),
        ("/work/switchboard", "switchboard-agent"),
        ("/work/项目", "项目"),
        ("/work/my project!!", "my project"),
        ("/", "agent"),
    ],
)
def test_the_folder_name_becomes_the_session_name(folder: str, name: str) -> None:
    assert session_name(folder) == name


@given(st.text(min_size=1, max_size=100).filter(lambda t: "/" not in t and "\x00" not in t))
def test_any_folder_name_gives_a_name_the_hub_accepts(folder: str) -> None:
    name = session_name(f"/work/{folder}")
    assert name_problem(name) is None
    assert normalize_name(name) not in HUB_RESERVED


def test_the_reserved_words_match_the_hub() -> None:
    assert RESERVED_NAMES == HUB_RESERVED
