"""What a due reminder says: its message (on time, late, missed, failed) and its state afterwards.

Pure functions of a stored reminder and ``now``; :mod:`reminders.service` commits what they return.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple
from zoneinfo import ZoneInfo

from reminders.schedule import MISSED_FIRES_CAP, Schedule, next_fire
from reminders.store import Reminder
from robot import ChatRef, OutgoingMessage
from robot import iso as _iso

__all__ = ["MERGE_MAX", "ON_TIME", "Draft", "FireReport", "Outcome", "catch_up", "compose", "format_local", "merge",
           "skip"]

ON_TIME = timedelta(seconds=60)
"""Up to this late a reminder counts as on time: no late note, and never "missed"."""
Outcome = Literal["delivered", "missed", "failed", "broken", "skipped"]
iso = functools.lru_cache(maxsize=4096)(_iso)  # a burst formats the same few instants thousands of times
MERGE_MAX = 50
"""At most this many on-time reminders of one chat, due at the same instant, share one message."""


@functools.lru_cache(maxsize=4096)
def format_local(instant: datetime, zone: str, *, seconds: bool = False) -> str:
    """An instant as local wall time, e.g. ``2026-11-21 08:00``."""
    return instant.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


@dataclass
class FireReport:
    """What one pass did: reminders handled per outcome, and the outbox keys it committed."""

    delivered: int = 0
    missed: int = 0
    failed: int = 0
    broken: int = 0
    #: Due in a chat the gate ignores (``[gate] never``, outside ``allowlist``): nothing sent, nothing run.
    skipped: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome, key: str | None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if key is not None:
            self.keys.append(key)


@functools.lru_cache(maxsize=4096)  # a burst is mostly the same schedule ("daily 09:00") many times
def catch_up(schedule: Schedule, planned: datetime, now: datetime) -> tuple[datetime, int, datetime | None]:
    """(latest occurrence <= now, how many occurred since ``planned`` inclusive, next one after now)."""
    latest, count = planned, 1
    upcoming = next_fire(schedule, planned)
    while upcoming is not None and upcoming <= now and count < MISSED_FIRES_CAP:
        latest, count = upcoming, count + 1
        upcoming = next_fire(schedule, upcoming)
    if upcoming is not None and upcoming <= now:  # capped: jump straight past now
        upcoming = next_fire(schedule, now)
    return latest, count, upcoming


class Draft(NamedTuple):
    """A reminder's own message before it is built: most of a burst's are merged (:func:`merge`),
    and building (validating) ten thousand messages to throw them away cost a tenth of the pass."""

    key: str
    chat: ChatRef
    text: str
    mention: tuple[str, ...]
    late_note: str = ""  #: added should it go out late after all (its channel down): OutgoingMessage.late_note

    def message(self) -> OutgoingMessage:
        return OutgoingMessage(key=self.key, chat=self.chat, text=self.text, mention=self.mention,
                               late_note=self.late_note)


def late_note(at: datetime, r: Reminder) -> str:
    """What a message for ``r`` due ``at`` adds if the outbox sends it late (:data:`robot.outbox_store.LATE`)."""
    return f"\n（迟到提醒：原定 {format_local(at, r.zone, seconds=not r.wall.endswith(':00'))}）"


def compose(r: Reminder, now: datetime, grace: timedelta, *, answer: str | None = None,
            failed: bool = False) -> tuple[Reminder, Outcome, Draft | None]:
    """The message a due reminder sends now (if any) and its state afterwards."""
    assert r.next_fire is not None
    latest, count, following = catch_up(r.schedule, r.next_fire, now)
    late = now - latest
    seconds = not r.wall.endswith(":00")
    text: str | None
    note = ""  # (added by the outbox if it goes out late: a channel down when it fired on time)
    if late > grace:
        outcome: Outcome = "missed"
        key = f"rem:{r.id}:{iso(latest)}:missed"
        what = "定时任务" if r.mode != "text" else "提醒"
        text = (f"⚠️ 错过的{what}：{r.content}\n机器人离线，没能按时发出（原定 {format_local(latest, r.zone, seconds=seconds)}，"
                f"共错过 {count} 次）。")
        if following is not None:
            text += f"\n下次：{format_local(following, r.zone, seconds=seconds)}"
    elif r.mode != "text" and answer == "":  # paused for an approval: the request is already posted
        outcome, key, text = "delivered", f"rem:{r.id}:{iso(latest)}", None
    elif failed:
        outcome, key = "failed", f"rem:{r.id}:{iso(latest)}:failed"
        if following is None:  # (a one-time task: it said "will try again on time", and never did)
            text = f"⚠️ 定时任务「{r.content[:60]}」没能执行（一次性任务，不会再试），请重新设置。"
        else:
            text = None if r.failure_reported else (
                f"⚠️ 定时任务「{r.content[:60]}」这次没能执行，之后仍会按时尝试（连续失败不再重复通知）。")
    else:
        outcome, key = "delivered", f"rem:{r.id}:{iso(latest)}"
        text = answer if r.mode != "text" and answer else f"⏰ 提醒：{r.content}"
        if late > ON_TIME:
            text += late_note(latest, r)
        else:
            note = late_note(latest, r)
        if count > 1:  # also when back on time for this one: the earlier ones were still missed
            text += f"\n（另有 {count - 1} 次在机器人离线期间错过）"
    status = "active" if following is not None else ("missed" if outcome == "missed" else "done")
    reported = r.failure_reported if outcome == "missed" else outcome == "failed"
    after = r.evolve(next_fire=following, last_fired=latest, status=status, updated_at=now,
                     failure_reported=reported)
    if text is None:
        return after, outcome, None
    chat = r.chat_ref
    return after, outcome, Draft(key, chat, text, (r.owner_id,) if chat.kind == "group" else (), note)


def skip(r: Reminder, now: datetime) -> tuple[Reminder, Outcome, None]:
    """A due reminder's state when its chat is one the gate ignores: no message, no model run, and
    the schedule moves past ``now``, so a recurring one fires again once the chat is allowed.

    A one-time reminder ends as ``missed``: kept active it would stay due, taken up by every pass
    (and its prompt by every one) while the chat is closed, and a note days late when it reopens
    is noise; it was not delivered, so it is not ``done``.
    """
    assert r.next_fire is not None
    following = catch_up(r.schedule, r.next_fire, now)[2]
    after = r.evolve(next_fire=following, status="active" if following is not None else "missed", updated_at=now)
    return after, "skipped", None


def merge(fired: Sequence[tuple[Reminder, Reminder, Outcome, Draft | None]],
          now: datetime, *, across_owners: bool = False) -> tuple[list[OutgoingMessage], list[str | None]]:
    """The messages for reminders fired together ``(before, after, outcome, own message)``, and the
    key of the message each one went out in.

    On-time text reminders of one person in one chat due at the same instant share one message
    (at most ``MERGE_MAX``); ``across_owners`` (``[reminders] merge_chat``, the default), those of
    everyone in the chat do (owners mentioned): twenty people's "09:00 standup" is one send, not
    twenty; the history records every person it mentions, so ``/forget me`` by any of them removes
    it. Late, missed or failed ones, those with earlier occurrences missed, and scheduled prompts, keep
    their own message.
    """
    messages: list[OutgoingMessage] = []
    keys: list[str | None] = [None] * len(fired)
    groups: dict[tuple[str, str, str, datetime], list[int]] = {}
    for index, (before, after, outcome, message) in enumerate(fired):
        if message is None:
            continue
        if (before.mode == "text" and outcome == "delivered" and after.last_fired is not None
                and now - after.last_fired <= ON_TIME and before.next_fire == after.last_fired):
            owner = "" if across_owners else before.owner
            groups.setdefault((before.chat, before.account, owner, after.last_fired), []).append(index)
        else:
            messages.append(message.message())
            keys[index] = message.key
    for (_, _, _, at), members in groups.items():
        for start in range(0, len(members), MERGE_MAX):
            part = members[start:start + MERGE_MAX]
            single = fired[part[0]][3]
            if len(part) == 1 and single is not None:
                messages.append(single.message())
                keys[part[0]] = single.key
                continue
            rs = [fired[i][0] for i in part]
            chat = rs[0].chat_ref
            group = chat.kind == "group"
            lines = [f"· {r.owner_name}：{r.content}" if group else f"· {r.content}" for r in rs]
            merged = OutgoingMessage(key=f"rem:{rs[0].id}:{iso(at)}:+{len(rs) - 1}", chat=chat,
                                     text=f"⏰ 提醒（{len(rs)} 条）：\n" + "\n".join(lines),
                                     mention=tuple(dict.fromkeys(r.owner_id for r in rs)) if group else (),
                                     late_note=late_note(at, rs[0]))
            messages.append(merged)
            for i in part:
                keys[i] = merged.key
    return messages, keys
