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


def test_the_hub_is_the_environments_else_the_one_that_wrote_its_address_in_the_home_else_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from switchboard_agent.config import DEFAULT_URL, HUB_URL_FILE, hub_url

    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    monkeypatch.delenv("SWITCHBOARD_URL", raising=False)
    assert hub_url() == DEFAULT_URL
    (tmp_path / HUB_URL_FILE).write_text("http://127.0.0.1:8800\n")
    assert hub_url() == "http://127.0.0.1:8800"
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9000/")
    assert hub_url() == "http://127.0.0.1:9000"
