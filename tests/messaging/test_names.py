"""Session names: validation and the matching key (NFKC + casefold)."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.names import clean_name, is_invisible, name_problem, normalize_name, strip_invisible


@pytest.mark.parametrize(
    "name",
    ["alice", "Bob Builder", "reviewer-2", "test_runner.v1", "Zoë", "研究员", "ｆｕｌｌｗｉｄｔｈ"],
)
def test_acceptable_names(name):
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "visible"),
        ("   ", "visible"),
        ("a" * 65, "at most"),
        ("ali\u200bce", "invisible"),  # zero-width space
        ("ali\u202ece", "invisible"),  # right-to-left override
        ("bob\U000e0041", "invisible"),  # tag character
        ("tab\there", "invisible"),
        ("bob@host", "letters, digits"),
        ("team*", "letters, digits"),
        ("name [ab12]", "letters, digits"),
        ("\u0301accent-first", "combining"),
    ],
)
def test_rejected_names_say_why(name, why):
    problem = name_problem(name)
    assert problem is not None and why in problem


def test_normalization_folds_case_width_and_spaces():
    assert normalize_name("  Bob   BUILDER ") == "bob builder"
    assert normalize_name("ｂｏｂ") == "bob"
    assert normalize_name("Straße") == normalize_name("STRASSE")
    assert clean_name("  Bob   Builder ") == "Bob Builder"


def test_strip_invisible_keeps_newlines_and_tabs():
    text, removed = strip_invisible("a\u200bb\u202ec\n\td\U000e0067")
    assert text == "abc\n\td"
    assert removed == 3


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)


@given(names)
def test_normalize_is_idempotent(name):
    assert normalize_name(normalize_name(name)) == normalize_name(name)


@given(names)
def test_normalized_key_has_no_invisible_or_leading_space_when_name_is_valid(name):
    if name_problem(name) is None:
        key = normalize_name(name)
        assert key == key.strip()
        assert not any(is_invisible(c) for c in key)
        assert "  " not in key


@given(names)
def test_case_and_compatibility_variants_share_a_key(name):
    assert normalize_name(name.upper()) == normalize_name(name.upper().lower().upper())
    assert normalize_name(unicodedata.normalize("NFKD", name)) == normalize_name(
        unicodedata.normalize("NFKC", name)
    )


@given(names)
def test_stripped_text_has_no_invisible_characters(text):
    cleaned, removed = strip_invisible(text)
    assert not any(is_invisible(c) and c not in "\n\t\r" for c in cleaned)
    assert len(cleaned) + removed == len(text)


def _every_character_asked(text: str) -> tuple[str, int]:
    """What strip_invisible must give: each character's category asked, one by one."""
    kept = [c for c in text if c in "\n\t\r" or not is_invisible(c)]
    return "".join(kept), len(text) - len(kept)


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(max_codepoint=127)),
            st.text(alphabet=st.characters(codec="utf-8")),
            st.sampled_from(
                ["\u200b", "\u202e", "\U000e0041", "\u00ad", "\u0085", "\x0b", "\t\n\r", "—", "“", "中文"]
            ),
        ),
        max_size=12,
    )
)
def test_strip_invisible_removes_exactly_what_asking_each_character_does(pieces: list[str]) -> None:
    """ASCII, a few characters beyond it, or mostly beyond it: the same as asking every character."""
    text = "".join(pieces)
    assert strip_invisible(text) == _every_character_asked(text)
