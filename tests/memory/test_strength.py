"""The strength rules, one by one, and a 60-day simulation of level trajectories in a real store (both engines)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function_calls import Caller
from memory import MemoryService, MemorySettings, Rules, Strength
from robot import Engine

T0 = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
H = timedelta(hours=1)
RULES = Rules()


def test_interval_is_one_hour_times_three_to_the_level() -> None:
    assert [RULES.interval(level) for level in range(4)] == [H, 3 * H, 9 * H, 27 * H]


def test_recall_at_level_zero_always_rises_and_moves_time() -> None:
    after = RULES.recalled(Strength(level=0, time=T0), T0 + timedelta(minutes=1))
    assert (after.level, after.time) == (1, T0 + timedelta(minutes=1))


def test_recall_within_the_interval_only_moves_time() -> None:
    after = RULES.recalled(Strength(level=2, time=T0), T0 + 8 * H)  # interval(2) = 9 h
    assert (after.level, after.time) == (2, T0 + 8 * H)
    assert RULES.recalled(Strength(level=2, time=T0), T0 + 10 * H).level == 3


def test_reaching_the_cap_makes_it_long_term_and_frozen() -> None:
    top = RULES.recalled(Strength(level=5, time=T0), T0 + 300 * H)
    assert (top.level, top.long_term) == (6, True)
    assert RULES.recalled(top, T0 + 10_000 * H).level == 6
    assert RULES.missed(top, T0 + 10_000 * H) == top


def test_a_miss_lowers_only_when_idle_beyond_the_interval_and_once_per_interval() -> None:
    s = Strength(level=2, time=T0)
    assert RULES.missed(s, T0 + 8 * H) == s
    once = RULES.missed(s, T0 + 10 * H)
    assert (once.level, once.time) == (1, T0)  # time stays the last successful recall
    assert RULES.missed(once, T0 + 11 * H) == once  # level 1 gets its own 3 h of grace
    assert RULES.missed(once, T0 + 13.5 * H).level == 0
    assert RULES.missed(Strength(level=0, time=T0), T0 + 2 * H).deleted


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_sixty_days_of_recalls_and_sleeps(engine: Engine) -> None:
    """Four memories driven through the real store for 60 days; every row checked after every event.

    The oracle applies :class:`Rules` to the events (recall: top-1 recalled, other matches missed;
    nightly sleep at 03:30: every non-long-term memory missed); the store must agree each time.
    Then the trajectories a person would expect:

    * "spaced": recalled just after its interval each time -> climbs to the cap, long-term;
    * "cramming": recalled twice a day -> plateaus (frequent recall within the interval adds nothing);
    * "fading": matched below the top by the cramming question -> deleted within a day;
    * "sleepy": never matched -> deleted by the first night's sleep, and dreamt of.
    """
    clock = Clock()
    db = engine
    service = MemoryService(db, MemorySettings(top_n=1, sleep_sample=100), clock=clock)
    await db.open()
    await service.prepare()
    me = Caller(platform="t", user_id="u1", chat_id="u1", chat_kind="private")
    texts = {"cramming": "每天的站会在九点", "fading": "站会以前在十点", "spaced": "猫的名字叫年糕",
             "sleepy": "阳台的花要浇水"}
    ids = {name: (await service.remember(me, text, "me")).id for name, text in texts.items()}
    oracle: dict[str, Strength | None] = {name: Strength(level=0, time=T0) for name in texts}
    queries = {"cramming": ("九点的站会", ["fading"]), "spaced": ("年糕是谁", [])}
    trajectory: dict[str, list[int]] = {name: [] for name in texts}
    deleted_at: dict[str, str] = {}
    dreams: list[str] = []

    def miss(name: str) -> None:
        state = oracle[name]
        if state is not None:
            after = RULES.missed(state, clock.now)
            oracle[name] = None if after.deleted else after

    async def check(event: str) -> None:
        rows = await db.run(lambda d: service.store.rows(d, list(ids.values())))
        for name, mid in ids.items():
            state = oracle[name]
            if state is None:
                assert mid not in rows, f"{event}: {name} should be deleted"
                deleted_at.setdefault(name, event)
            else:
                got = rows[mid].strength
                assert (got.level, got.long_term, got.time) == (state.level, state.long_term, state.time), \
                    f"{event}: {name}"
                trajectory[name].append(got.level)

    async def recall(name: str) -> None:
        query, below = queries[name]
        got = await service.recall(me, query)
        assert [r.id for r in got] == [ids[name]]
        state = oracle[name]
        assert state is not None
        oracle[name] = RULES.recalled(state, clock.now)
        for other in below:
            miss(other)
        await check(f"{clock.now:%m-%d %H:%M} recall {name}")

    next_spaced = T0 + timedelta(minutes=30)
    step = timedelta(minutes=30)
    clock.now = T0
    while clock.now < T0 + timedelta(days=60):
        clock.now += step
        local = clock.now.time()
        if (local.hour, local.minute) in ((9, 0), (21, 0)):
            await recall("cramming")
        if clock.now >= next_spaced:
            await recall("spaced")
            state = oracle["spaced"]
            assert state is not None
            next_spaced = clock.now + RULES.interval(state.level) + step
        if (local.hour, local.minute) == (3, 30):
            report = await service.sleep("t:private:u1")
            for name in texts:
                state = oracle[name]
                if state is not None and not state.long_term:
                    miss(name)
            if report.dream:
                dreams.append(report.dream)
            await check(f"{clock.now:%m-%d} sleep")
    assert trajectory["spaced"][-1] == 6 and oracle["spaced"] is not None and oracle["spaced"].long_term
    assert trajectory["spaced"] == sorted(trajectory["spaced"])  # spaced recall never lost ground
    assert max(trajectory["cramming"]) < 6 and trajectory["cramming"][-1] == trajectory["cramming"][-100]
    assert oracle["fading"] is None and oracle["sleepy"] is None
    assert deleted_at["sleepy"] == "01-02 sleep"  # the first night
    assert deleted_at["fading"] == "01-01 21:00 recall cramming"  # idle > 1 h at level 0, then missed
    assert any("浇水" in d for d in dreams)  # what sleep deleted was dreamt of
    assert not any("十点" in d for d in dreams)  # what a miss deleted was not
    await db.close()


@pytest.mark.parametrize("idle_hours", [0.5, 2])
async def test_sleep_weakens_only_the_idle(engine: Engine, idle_hours: float) -> None:
    clock = Clock()
    db = engine
    service = MemoryService(db, MemorySettings(sleep_sample=10), clock=clock)
    await db.open()
    await service.prepare()
    me = Caller(platform="t", user_id="u1", chat_id="g", chat_kind="group")
    row = await service.remember(me, "年会在三亚", "group")
    clock.now = T0 + timedelta(hours=idle_hours)
    report = await service.sleep("t:group:g")
    assert report.deleted == (1 if idle_hours > 1 else 0)
    assert (await db.run(lambda d: service.store.get(d, row.id)) is None) == (idle_hours > 1)
    await db.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["recall", "miss"]), st.floats(min_value=0, max_value=500)),
                max_size=60))
def test_rule_invariants_for_any_event_sequence(events: list[tuple[str, float]]) -> None:
    s, now = Strength(level=0, time=T0), T0
    for kind, hours in events:
        now += timedelta(hours=hours)
        before = s
        s = RULES.recalled(s, now) if kind == "recall" else RULES.missed(s, now)
        assert -1 <= s.level <= RULES.cap
        assert s.long_term == (s.level == RULES.cap)  # long-term exactly at the cap
        assert not before.long_term or s.long_term  # and for good
        assert abs(s.level - before.level) <= 1  # one step at a time
        if kind == "recall":
            assert s.time == now and s.level >= before.level
        else:
            assert s.time == before.time and s.level <= before.level
        if s.deleted:
            break
