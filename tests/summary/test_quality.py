"""Summary quality on a realistic day of group chat (tests/summary/fixtures/group_day.json).

307 messages from 9 people: 231 are stickers, 哈哈, +1 and one-character replies; 11 carry marked
decisions and action items (two are long links). The extractive summary (no model, a spent budget
or a failed model) must recover most of them, quote no noise and count no stickers or bot.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from robot.history import HistoryEntry
from summary.extractive import extractive_summary
from summary.settings import SummarySettings
from summary.signals import is_noise

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "group_day.json").read_text(encoding="utf-8"))
ZONE = ZoneInfo(FIXTURE["zone"])


def day() -> list[HistoryEntry]:
    rows: list[dict[str, Any]] = FIXTURE["messages"]
    return [HistoryEntry(chat="wechat:group:g", user_id=r["user_id"], name=r["name"], text=r["text"],
                         at=datetime.fromisoformat(r["at"]), from_bot=r["from_bot"]) for r in rows]


def recovered(text: str) -> list[str]:
    return [fact for fact, key in FIXTURE["facts"].items() if key in text]


def test_the_fixture_is_what_it_claims() -> None:
    entries = day()
    assert len(entries) > 300
    assert sum(is_noise(e.text) for e in entries) >= 200
    assert len(FIXTURE["facts"]) == 11
    assert len({e.user_id for e in entries if not e.from_bot}) == 9


def test_extractive_summary_recovers_most_marked_facts_with_defaults() -> None:
    settings = SummarySettings()
    text = extractive_summary(day(), zone=ZONE, title="最近 24 小时", top_members=settings.top_members,
                              salient_count=settings.salient_count, fact_count=settings.fact_count,
                              link_count=settings.link_count)
    found = recovered(text)
    print(f"\nextractive summary recovered {len(found)}/{len(FIXTURE['facts'])} marked facts: {found}")
    assert len(found) / len(FIXTURE["facts"]) >= 0.8
    # Links whole, even the 100-character ones; noise neither quoted nor counted.
    for fact in ("F5", "F10"):
        assert FIXTURE["facts"][fact] in text
    body = text.split("最活跃：", 1)[1]
    assert "[动画表情]" not in body and "+1" not in body.replace("+1 之类", "")
    assert "· 9 人发言" in text.splitlines()[0]
    assert "qunbot" not in text.split("最活跃：", 1)[1].splitlines()[0]
    assert all(section in text for section in ("结论/决定：", "待办：", "话题：", "链接："))
    assert "周四" in text  # the day carries its weekday


def test_action_items_say_who_and_when() -> None:
    text = extractive_summary(day(), zone=ZONE, title="今天", fact_count=12)
    todo = text.split("待办：", 1)[1].split("话题：", 1)[0]
    assert "谁：@小明" in todo  # "@wxid_ming02 你负责…": the mention became a name, and it is who
    assert "谁：韩梅梅" in todo and "我来写发布说明" in todo  # "我来…": the speaker
    assert "何时：周三" in todo
