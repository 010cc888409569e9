"""The resolver: a pure function, tested rule by rule and with properties."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.addressing import Candidate, parse_address, resolve, validate_address
from messaging.errors import Ambiguous, Invalid, NotFound
from messaging.names import normalize_name


def cand(name, ref, id_=None, cwd=""):
    # An id made from the ref alone: the same in every run (str hashes are salted per process),
    # so the test ids that show it are too.
    digest = int(hashlib.sha256(ref.encode()).hexdigest(), 16)
    return Candidate(
        id=id_ or f"00000000-0000-0000-0000-{digest % 10**12:012d}",
        ref=ref,
        name=name,
        name_key=normalize_name(name),
        cwd=cwd,
    )


ALICE = cand("alice", "aaaaaa")
BOB = cand("Bob Builder", "bbbbbb")
BOB2 = cand("bob builder", "cccccc", cwd="/other")
REVIEWER = cand("reviewer", "dddddd")
REVIEW_BOT = cand("review-bot", "eeeeee")
ALL = [ALICE, BOB, BOB2, REVIEWER, REVIEW_BOT]


@pytest.mark.parametrize(
    ("target", "reason"),
    [("", "empty_target"), ("   ", "empty_target"), ("*", "broadcast"), ("bob@laptop", "at_in_address")],
)
def test_address_validation_has_a_code_per_rule(target, reason):
    with pytest.raises(Invalid) as err:
        validate_address(target)
    assert err.value.reason == reason


def test_lead_alias_resolves_to_the_team_lead_only():
    assert resolve("lead", ALL, lead=ALICE).candidate == ALICE
    assert resolve("LEAD", ALL, lead=ALICE).rule == "lead"
    with pytest.raises(NotFound, match="not a teammate"):
        resolve("lead", ALL, lead=None)


def test_exact_id_and_ref_win_first():
    assert resolve(REVIEWER.id, ALL).rule == "id"
    assert resolve("dddddd", ALL).candidate == REVIEWER
    assert resolve("DDDDDD", ALL).rule == "ref"


def test_exact_name_beats_normalized_duplicates():
    # "Bob Builder" exactly matches one session although two normalize the same.
    res = resolve("Bob Builder", ALL)
    assert res.candidate == BOB and res.rule == "name"


def test_normalized_name_collision_is_ambiguous_with_candidates():
    with pytest.raises(Ambiguous) as err:
        resolve("BOB BUILDER", ALL)
    refs = {c["ref"] for c in err.value.extra["candidates"]}
    assert refs == {"bbbbbb", "cccccc"}
    assert {"name", "ref", "cwd"} <= set(err.value.extra["candidates"][0])


def test_name_with_ref_disambiguates_and_checks_the_name():
    res = resolve("bob builder [cccccc]", ALL)
    assert res.candidate == BOB2 and res.rule == "name_ref" and res.pin_key == "bob builder"
    with pytest.raises(NotFound, match="is named"):
        resolve("alice [cccccc]", ALL)
    with pytest.raises(NotFound, match="ref"):
        resolve("alice [zzzzzz]", ALL)


def test_unique_prefix_of_three_resolves_and_shorter_does_not():
    assert resolve("ali", ALL).candidate == ALICE
    assert resolve("ali", ALL).rule == "prefix"
    with pytest.raises(NotFound, match="at least 3"):
        resolve("al", ALL)


def test_shared_prefix_is_ambiguous_never_a_guess():
    with pytest.raises(Ambiguous):
        resolve("revi", ALL)
    assert resolve("review-", ALL).candidate == REVIEW_BOT
    assert resolve("reviewer", ALL).candidate == REVIEWER  # an exact name beats being a prefix of another


def test_ambiguity_lists_at_most_three():
    many = [cand("worker", f"w{i}w{i}w{i}") for i in range(6)]
    with pytest.raises(Ambiguous) as err:
        resolve("worker", many)
    assert len(err.value.extra["candidates"]) == 3


def test_unknown_name_is_not_found():
    with pytest.raises(NotFound):
        resolve("nobody", ALL)


refs = st.text(alphabet="abcdefghjkmnpqrstuvwxyz23456789", min_size=6, max_size=6)
labels = st.text(alphabet="abcdefgh -_.XYZ", min_size=1, max_size=12).filter(lambda s: s.strip())


@given(st.lists(st.tuples(labels, refs), min_size=1, max_size=8, unique_by=lambda t: t[1]), st.data())
def test_resolver_never_guesses(entries, data):
    """Whatever it returns matches the target by one of the rules; otherwise it raises."""
    candidates = [cand(n, r, id_=f"00000000-0000-0000-0000-{i:012d}") for i, (n, r) in enumerate(entries)]
    target = data.draw(st.sampled_from([c.name for c in candidates] + [c.name[:3] for c in candidates]))
    if not target.strip():
        return
    try:
        res = resolve(target.strip(), candidates)
    except (Ambiguous, NotFound):
        return
    key = normalize_name(target)
    picked = res.candidate
    assert (
        picked.name == target.strip()
        or picked.name_key == key
        or picked.name_key.startswith(key)
        or picked.ref == target.strip().lower()
    )
    if res.rule == "prefix":
        assert [c for c in candidates if c.name_key.startswith(key)] == [picked]
    if res.rule == "normalized":
        assert [c for c in candidates if c.name_key == key] == [picked]


@given(st.lists(st.tuples(labels, refs), min_size=1, max_size=8, unique_by=lambda t: t[1]))
def test_name_with_ref_always_reaches_that_session(entries):
    candidates = [cand(n, r, id_=f"00000000-0000-0000-0000-{i:012d}") for i, (n, r) in enumerate(entries)]
    for c in candidates:
        if c.name.strip():
            assert resolve(f"{c.name.strip()} [{c.ref}]", candidates).candidate == c


@pytest.mark.parametrize(
    "target",
    [
        "alice",
        "ALICE",
        "dddddd",
        REVIEWER.id,
        "Bob Builder",
        "bob builder [cccccc]",
        "ali",
        "review",
        "zed",
        "al",
    ],
)
def test_an_address_parsed_beforehand_resolves_as_the_text_does(target):
    def outcome(address):
        try:
            return resolve(address, ALL).candidate
        except (Ambiguous, NotFound) as err:
            return type(err), str(err)

    assert outcome(parse_address(target)) == outcome(target)
