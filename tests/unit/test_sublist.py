"""The subscription trie against a brute-force matcher (hypothesis), and its cache across changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zonebus.subjects.patterns import is_subset, matches
from zonebus.subjects.sublist import Sublist, Subscription
from zonebus.subjects.validate import is_valid_subject

TOKENS = st.sampled_from(["a", "b", "c", "foo", "bar"])
PATTERN_TOKENS = st.sampled_from(["a", "b", "c", "foo", "bar", "*"])


@st.composite
def patterns(draw) -> str:
    toks = draw(st.lists(PATTERN_TOKENS, min_size=1, max_size=4))
    if draw(st.booleans()) and len(toks) < 5:
        toks.append(">")
    return ".".join(toks)


literals = st.lists(TOKENS, min_size=1, max_size=5).map(".".join)


def _sids(result) -> set[bytes]:
    sids = {s.sid for s in result.psubs}
    for group in result.qsubs:
        sids.update(s.sid for s in group)
    return sids


@settings(max_examples=300, deadline=None)
@given(
    subs=st.lists(st.tuples(patterns(), st.sampled_from([None, "q1", "q2"])), max_size=25),
    removals=st.lists(st.integers(min_value=0, max_value=24), max_size=10),
    probes=st.lists(literals, min_size=1, max_size=10),
)
def test_matches_brute_force_as_subs_come_and_go(subs, removals, probes) -> None:
    sl = Sublist()
    live: dict[bytes, tuple[str, str | None, Subscription]] = {}
    for i, (pattern, queue) in enumerate(subs):
        sid = str(i).encode()
        sub = Subscription(None, pattern.encode(), queue.encode() if queue else None, sid)
        sl.insert(sub)
        live[sid] = (pattern, queue, sub)
    for probe in probes:  # fill the cache before removing, so stale entries would show
        sl.match(probe.encode())
    for r in removals:
        sid = str(r).encode()
        if sid in live:
            assert sl.remove(live.pop(sid)[2])
    assert sl.count == len(live)
    for probe in probes:
        expected = {sid for sid, (pattern, _, _) in live.items() if matches(pattern, probe)}
        result = sl.match(probe.encode())
        assert _sids(result) == expected
        # queue subs grouped by queue name, one group per name
        names = [g[0].queue for g in result.qsubs]
        assert len(names) == len(set(names))
        assert all(s.queue == g[0].queue for g in result.qsubs for s in g)


def test_cache_is_dropped_on_insert() -> None:
    sl = Sublist()
    sl.insert(Subscription(None, b"foo.bar", None, b"1"))
    assert len(sl.match(b"foo.bar").psubs) == 1
    gen = sl.generation
    sl.insert(Subscription(None, b"foo.*", None, b"2"))
    assert sl.generation > gen
    assert len(sl.match(b"foo.bar").psubs) == 2


def test_removing_prunes_empty_nodes() -> None:
    sl = Sublist()
    sub = Subscription(None, b"a.b.c.d", None, b"1")
    sl.insert(sub)
    assert sl.remove(sub)
    assert not sl.remove(sub)
    assert sl._root.children == {}


def test_empty_token_in_published_subject_matches_nothing() -> None:
    sl = Sublist()
    sl.insert(Subscription(None, b">", None, b"1"))
    assert not sl.match(b"foo..bar")
    assert sl.match(b"foo.bar")


def test_literal_wildcard_publish_reaches_a_sub_once() -> None:
    sl = Sublist()
    sl.insert(Subscription(None, b"foo.*", None, b"1"))
    sl.insert(Subscription(None, b"foo.>", None, b"2"))
    assert sorted(s.sid for s in sl.match(b"foo.*").psubs) == [b"1", b"2"]
    assert sorted(s.sid for s in sl.match(b"foo.>").psubs) == [b"1", b"2"]


def test_subject_validation() -> None:
    for good in (b"foo", b"foo.bar", b"foo.*", b"foo.>", b"*", b">", b"a.*.c"):
        assert is_valid_subject(good), good
    for bad in (b"", b"foo.", b".foo", b"foo..bar", b"foo.>.bar", b"foo bar", b"foo\tbar"):
        assert not is_valid_subject(bad), bad


def test_subset() -> None:
    assert is_subset("foo.bar", "foo.*")
    assert is_subset("foo.*", "foo.>")
    assert not is_subset("foo.*.baz", "foo.bar.*")
    assert not is_subset("foo.>", "foo.*")


@settings(max_examples=300, deadline=None)
@given(
    subs=st.lists(st.tuples(patterns(), st.sampled_from([None, "q1"])), max_size=20),
    removals=st.lists(st.integers(min_value=0, max_value=19), max_size=6),
    probes=st.lists(literals, min_size=1, max_size=12),
)
def test_match_reply_agrees_with_the_brute_force_matcher(subs, removals, probes) -> None:
    """match_reply shares results between subjects that differ in their last token; a literal subscription
    on that token (or one added or removed later) must never be missed or kept."""
    sl = Sublist()
    live: dict[bytes, tuple[str, Subscription]] = {}
    for i, (pattern, queue) in enumerate(subs):
        sub = Subscription(None, pattern.encode(), queue.encode() if queue else None, str(i).encode())
        sl.insert(sub)
        live[sub.sid] = (pattern, sub)
    for probe in probes:  # fill the per-prefix results before the removals
        sl.match_reply(probe.encode())
    for r in removals:
        sid = str(r).encode()
        if sid in live:
            assert sl.remove(live.pop(sid)[1])
    for _ in range(2):  # second pass: answered from the per-prefix results
        for probe in probes + [p + ".x" for p in probes]:
            expected = {sid for sid, (pattern, _) in live.items() if matches(pattern, probe)}
            assert _sids(sl.match_reply(probe.encode())) == expected, probe


def test_match_reply_shares_a_prefix_until_a_literal_sub_appears() -> None:
    sl = Sublist()
    sl.insert(Subscription(None, b"_INBOX.abc.*", None, b"1"))
    assert [s.sid for s in sl.match_reply(b"_INBOX.abc.1").psubs] == [b"1"]
    assert [s.sid for s in sl.match_reply(b"_INBOX.abc.2").psubs] == [b"1"]
    assert len(sl._by_prefix) == 1 and sl.cache_size() == 0  # nothing in the per-subject cache
    sl.insert(Subscription(None, b"_INBOX.abc.7", None, b"2"))
    assert [s.sid for s in sl.match_reply(b"_INBOX.abc.7").psubs] == [b"1", b"2"]
    assert [s.sid for s in sl.match_reply(b"_INBOX.abc.8").psubs] == [b"1"]
    assert not sl._by_prefix  # a literal last token: not shareable
