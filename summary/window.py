"""Which stored messages a summary reads, and each chat's "summarised up to here" mark.

The mark is the ``history`` row id of the newest message a summary covered, kept in this
plugin's own table ``summary_marks``. Row ids grow in the order messages are stored, so
"since the last summary" means ``id > last_id``: a message stored after a summary is never
skipped (on PostgreSQL a summary's read waits for the writes in flight) and never counted twice, even when platform timestamps are whole seconds (OneBot) and
it carries the same second as the mark.

The message that asked for the summary (``Caller.message_id``) is never part of the window,
but the mark moves past it, so the request is not summarised next time either.

:func:`parse_period` reads the windows people name: ``昨天``, ``2026-11-20``, ``09:00-12:00``,
``昨天 09:00-12:00``, from when the message asking was sent (:func:`said_at`). ``summary_optout`` holds the members who asked not to be summarised in a chat
(in a whole group: a forum topic's opt-out is its group's).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from robot import KEEP, ChatRef, Engine, ForgetRequest, HistoryEntry, Tx, bytewise, iso, parse_iso
from summary.authors import forget_authors_sync, move_authors_sync, quoted_chats_sync, quoting_label_sync
from summary.extractive import HEADER, PRIVATE_HEADER
from summary.signals import weekday

__all__ = [
    "MARKS_TABLE",
    "OPTOUT_TABLE",
    "Fetched",
    "Span",
    "advance_mark",
    "create_marks_table",
    "fetch",
    "forget_summaries_sync",
    "move_chat_sync",
    "opted_out",
    "parse_period",
    "read_mark",
    "said_at",
    "set_optout",
    "split_member",
]

MARKS_TABLE = "summary_marks"
_SETTLE_S = 3.0  # the longest a summary's read waits for the writes in flight on PostgreSQL (see _settled)
OPTOUT_TABLE = "summary_optout"


def create_marks_table(db: Tx) -> None:
    """Schema step (idempotent) for the row-id marks and the opt-outs; run it with ``bot.db.ensure``."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {MARKS_TABLE} (chat TEXT PRIMARY KEY, last_id BIGINT NOT NULL)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {OPTOUT_TABLE} (chat TEXT NOT NULL, user_id TEXT NOT NULL, "
               "PRIMARY KEY (chat, user_id))")


def move_chat_sync(db: Tx, old: str, new: str) -> None:
    """A chat's new id (a Telegram group become a supergroup): its mark, opt-outs and authors follow it, or
    an opted-out member's messages would be summarised from the next message on."""
    db.execute(f"INSERT INTO {OPTOUT_TABLE} (chat, user_id) SELECT ?, user_id FROM {OPTOUT_TABLE} WHERE chat = ? "
               "ON CONFLICT (chat, user_id) DO NOTHING", [new, old])
    db.execute(f"INSERT INTO {MARKS_TABLE} (chat, last_id) SELECT ?, last_id FROM {MARKS_TABLE} WHERE chat = ? "
               f"ON CONFLICT (chat) DO UPDATE SET last_id = CASE WHEN excluded.last_id > {MARKS_TABLE}.last_id "
               f"THEN excluded.last_id ELSE {MARKS_TABLE}.last_id END", [new, old])
    for table in (OPTOUT_TABLE, MARKS_TABLE):
        db.execute(f"DELETE FROM {table} WHERE chat = ?", [old])
    move_authors_sync(db, old, new)
    # Admins' private copies ("/summary #<group>") are titled by the group's id: retitled, or /forget me there
    # would no longer find them (it looks for the new id's title).
    was, now = ChatRef.from_key(old), ChatRef.from_key(new)
    before, private = f"{HEADER}群 {was.chat_id} · ", f"{was.platform}:private:"
    c = bytewise(db)
    db.execute(f"UPDATE history SET text = ? || substr(text, ?) WHERE chat{c} >= ? AND chat{c} < ? AND from_bot = 1 "
               "AND substr(text, 1, ?) = ?", [f"{HEADER}群 {now.chat_id} · ", len(before) + 1, private,
                                              private[:-1] + ";", len(before), before])


def _optout_where(db: Tx, chat: ChatRef) -> tuple[str, list[object]]:
    """The opt-out rows that hold in ``chat``: its group's (a forum topic's group), and, for a group, the
    rows kept per topic before opt-outs were the group's (``<group>/<topic>``: they cover it all too)."""
    group = chat.group_key
    if chat.kind != "group":
        return "chat = ?", [group]
    c = bytewise(db)  # "<group>/" up to "<group>0": the topics' keys, and no other group's
    return f"(chat = ? OR (chat{c} >= ? AND chat{c} < ?))", [group, group + "/", group + "0"]


async def set_optout(db: Engine, chat: ChatRef, user_id: str, out: bool) -> bool:
    """Opt ``user_id`` out of (or back into) summaries in ``chat``, a forum group's topics all together;
    whether anything changed."""
    def work(db: Tx) -> bool:
        where, params = _optout_where(db, chat)
        if not out:
            return bool(db.execute(f"DELETE FROM {OPTOUT_TABLE} WHERE {where} AND user_id = ?",
                                   [*params, user_id]).rowcount)
        if db.execute(f"SELECT 1 FROM {OPTOUT_TABLE} WHERE {where} AND user_id = ?", [*params, user_id]).fetchone():
            return False
        return bool(db.execute(f"INSERT INTO {OPTOUT_TABLE} (chat, user_id) VALUES (?, ?) "
                               "ON CONFLICT (chat, user_id) DO NOTHING", [chat.group_key, user_id]).rowcount)

    return await db.transaction(work)


async def opted_out(db: Engine, chat: ChatRef) -> frozenset[str]:
    """The members whose messages summaries of ``chat`` leave out (an opt-out anywhere in a forum group
    holds in all its topics)."""
    def work(db: Tx) -> list[tuple[object, ...]]:
        where, params = _optout_where(db, chat)
        return db.execute(f"SELECT user_id FROM {OPTOUT_TABLE} WHERE {where}", params).fetchall()

    return frozenset(str(r[0]) for r in await db.run(work))


@dataclass(frozen=True)
class Span:
    """A named stretch of time: ``start <= ts < end``."""

    start: datetime
    end: datetime
    title: str


_DAYS = {"今天": 0, "昨天": 1, "前天": 2}
_DATE = re.compile(r"^(?:(\d{4})[-/.年])?(\d{1,2})[-/.月](\d{1,2})[日号]?$")
_RANGE = re.compile(r"^(\d{1,2})[:：](\d{2})\s*(?:-|~|～|—|到|至)\s*(\d{1,2})[:：](\d{2})$")


def parse_period(text: str, now: datetime, zone: ZoneInfo) -> Span:
    """``昨天``, ``2026-11-20``/``11-20``/``11月20日``, ``09:00-12:00`` (today), or a day and a range.

    Raises ``ValueError`` with a message fit to show the user.
    """
    words = text.split()
    if not words or len(words) > 2:
        raise ValueError(f"看不懂时间段「{text}」：可以写 昨天、2026-11-20、09:00-12:00 或 昨天 09:00-12:00")
    today = now.astimezone(zone).date()
    day, named, rest = today, "今天", words
    if words[0] in _DAYS or _DATE.match(words[0]):
        day, named = _day(words[0], today)
        rest = words[1:]
    if day > today:  # (a date with its year: one without it is the last one past)
        raise ValueError(f"{day:%Y-%m-%d} 还没到：只能总结已经说过的话")
    if not rest:
        start = datetime.combine(day, time(), zone)
        return Span(start, start + timedelta(days=1), f"{named}（{day:%m-%d} {weekday(day.weekday())}）")
    match = _RANGE.match(rest[0])
    if match is None:
        raise ValueError(f"看不懂时间段「{text}」：时间范围请写成 09:00-12:00")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if not (h1 < 24 and h2 <= 24 and m1 < 60 and m2 < 60) or (h2 == 24 and m2):
        raise ValueError(f"时间「{rest[0]}」不对：小时 0-24，分钟 0-59")
    start = datetime.combine(day, time(h1, m1), zone)
    end = datetime.combine(day, time(), zone) + timedelta(hours=h2, minutes=m2)
    if end <= start:
        raise ValueError(f"时间范围「{rest[0]}」的结束早于开始")
    if start > now:
        raise ValueError(f"{named} {rest[0]} 还没到：只能总结已经说过的话")
    return Span(start, end, f"{named} {h1:02d}:{m1:02d}-{h2:02d}:{m2:02d}")


def _shaped(words: list[str]) -> bool:
    """Whether ``words`` read as a period (a day, a time range, or both), by their shape only."""
    day = bool(words) and (words[0] in _DAYS or bool(_DATE.match(words[0])))
    return (len(words) == 1 and (day or bool(_RANGE.match(words[0])))) or (
        len(words) == 2 and day and bool(_RANGE.match(words[1])))


def split_member(text: str) -> tuple[str | None, str]:
    """``@name`` and the period typed with it, in either order: ``"@小明 昨天"``, ``"昨天 @小明"`` give
    ``("@小明", "昨天")``; no ``@``: ``(None, text)``. A name may hold spaces (``"@John Smith"``), so only
    period-shaped last words are taken off it."""
    words = text.split()
    at = next((i for i, word in enumerate(words) if word.startswith(("@", "＠"))), None)
    if at is None:
        return None, text
    if at:  # "<period> @name": the period is what comes before
        return " ".join(words[at:]), " ".join(words[:at])
    for n in (2, 1):
        if len(words) > n and _shaped(words[-n:]):
            return " ".join(words[:-n]), " ".join(words[-n:])
    return text.strip(), ""


def _day(word: str, today: date) -> tuple[date, str]:
    if word in _DAYS:
        return today - timedelta(days=_DAYS[word]), word
    match = _DATE.match(word)
    assert match is not None
    year = int(match.group(1)) if match.group(1) else today.year
    try:
        day = date(year, int(match.group(2)), int(match.group(3)))
    except ValueError:
        raise ValueError(f"没有这一天：{word}") from None
    if not match.group(1) and day > today:
        try:  # "12-31" asked in January means last year's ("02-29": if it had one)
            day = day.replace(year=year - 1)
        except ValueError:
            raise ValueError(f"去年没有这一天：{word}") from None
    if day.year < 2000:  # (no chat history that old; 0001-01-01 overflowed in the chat's zone)
        raise ValueError(f"太早了：{word}，聊天记录没有那么早")
    return day, f"{day:%Y-%m-%d}"


async def said_at(db: Engine, chat: ChatRef, message_id: str, user_id: str, now: datetime) -> datetime:
    """When the member's message ``message_id`` in ``chat`` was sent, as stored: the instant its "今天" means
    (one kept while the bot was down and answered after midnight asked for the day it was said). ``now``
    for no such message, or one sent later than now or over a day before (a wrong clock), as commands read it."""
    if not message_id:
        return now

    def work(db: Tx) -> object:
        row = db.execute("SELECT ts FROM history WHERE chat = ? AND ts >= ? AND ts < ? AND from_bot = 0 AND "
                         "message_id = ? AND user_id = ? ORDER BY id DESC LIMIT 1",
                         [chat.key, iso(now - KEEP), iso(now), message_id, user_id]).fetchone()
        return None if row is None else row[0]

    ts = await db.run(work)
    return now if ts is None else parse_iso(str(ts))


async def read_mark(db: Engine, chat: ChatRef) -> int | None:
    """The history row id the chat's last summary reached, or None before any."""

    def work(db: Tx) -> int | None:
        row = db.execute(f"SELECT last_id FROM {MARKS_TABLE} WHERE chat = ?", [chat.key]).fetchone()
        return int(row[0]) if row else None

    return await db.run(work)


async def advance_mark(db: Engine, chat: ChatRef, last_id: int) -> None:
    """Move the chat's mark to ``last_id``; it never moves backwards (a slower, older summary)."""
    await db.run(lambda db: db.execute(
        f"INSERT INTO {MARKS_TABLE} (chat, last_id) VALUES (?, ?) "
        "ON CONFLICT (chat) DO UPDATE SET last_id = excluded.last_id "
        f"WHERE {MARKS_TABLE}.last_id < excluded.last_id",
        [chat.key, last_id],
    ))


@dataclass
class Fetched:
    """Messages of one window (oldest first), the window's full count, and its newest row id."""

    entries: list[HistoryEntry]
    total: int
    newest_id: int | None
    """Highest history row id in the window, the request itself included (where the mark moves)."""


def _entry(row: dict[str, object]) -> HistoryEntry:
    return HistoryEntry(chat=str(row["chat"]), user_id=str(row["user_id"]), name=str(row["name"]),
                        text=str(row["text"]), at=parse_iso(str(row["ts"])), from_bot=bool(row["from_bot"]),
                        message_id=str(row["message_id"] or ""))


async def fetch(db: Engine, chat: ChatRef, *, limit: int, after_id: int | None = None,
                start: datetime | None = None, end: datetime | None = None, skip_message_id: str = "",
                people_only: bool = False) -> Fetched:
    """The newest ``limit`` messages of the chat with ``id > after_id`` and/or ``start <= ts < end``.

    Neither bound means the whole chat (the "last N messages" window). ``skip_message_id`` (the
    request being answered) is left out of the entries and the count, not out of ``newest_id``;
    so are the bot's own messages with ``people_only``.
    """
    where: list[str] = ["chat = ?"]
    params: list[object] = [chat.key]
    if after_id is not None:
        where.append("id > ?")
        params.append(after_id)
    if start is not None:
        where.append("ts >= ?")
        params.append(iso(start))
    if end is not None:
        where.append("ts < ?")
        params.append(iso(end))
    window = " AND ".join(where)
    kept, kept_params = window, list(params)
    if skip_message_id:
        kept += " AND NOT (from_bot = 0 AND message_id IS NOT NULL AND message_id = ?)"
        kept_params.append(skip_message_id)
    if people_only:
        kept += " AND from_bot = 0"

    def work(db: Tx) -> Fetched:
        # One call on the single DB thread: no message can land between these reads.
        newest = db.execute(f"SELECT MAX(id) FROM history WHERE {window}", params).fetchone()[0]
        total = int(db.execute(f"SELECT COUNT(*) FROM history WHERE {kept}", kept_params).fetchone()[0])
        rows = db.execute_returning_dicts(
            f"SELECT * FROM history WHERE {kept} ORDER BY ts DESC, id DESC LIMIT ?", [*kept_params, limit]
        )
        return Fetched([_entry(r) for r in reversed(rows)], total, None if newest is None else int(newest))

    await _settled(db)
    return await db.run(work)


async def _settled(db: Engine) -> None:
    """PostgreSQL hands ids out at INSERT and shows rows at COMMIT: a slower unit's message could take an
    id below the mark and show after it, and no summary would ever read it. So the read waits (a few
    seconds at most) until every transaction that was writing has ended. Nothing waits on the summary
    (a table lock made every process's intake queue behind it, and it behind a long retention pass)."""
    if db.dialect != "postgresql":
        return
    horizon = await db.run(lambda tx: str(tx.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())").fetchone()[0]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SETTLE_S
    while not await db.run(lambda tx: bool(tx.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= ?::xid8", [horizon]).fetchone()[0])):
        if loop.time() > deadline:  # (a long transaction, likely no insert of history: read what is there)
            return
        await asyncio.sleep(0.05)


def forget_summaries_sync(db: Tx, request: ForgetRequest) -> int:
    """The summaries' part of ``/forget me``: every earlier summary in the chats forgotten, and admins'
    private copies of them (``/summary #<group>``); for ``/forget me all`` also in every chat whose
    summaries read the person (:mod:`summary.authors`: their messages there may have aged out).

    Summaries quote members' messages; which ones quote this person cannot be told reliably
    (names change, quotes are cut), so they all go.
    """
    private, gone, chats = f"{request.platform}:private:", 0, list(request.chats)
    if request.everywhere:
        known = {chat.key for chat in chats}
        chats += [chat for chat in quoted_chats_sync(db, request.platform, request.user_id) if chat.key not in known]
        gone += quoting_label_sync(db, request.platform, request.user_id)  # (stored before authors were)
    forget_authors_sync(db, request.user_id, chats)
    c = bytewise(db)  # a key range is a prefix only bytewise
    for chat in chats:
        heads = [chat.key, len(HEADER), HEADER, len(PRIVATE_HEADER), PRIVATE_HEADER]
        gone += db.execute("DELETE FROM history WHERE chat = ? AND from_bot = 1 AND (substr(text, 1, ?) = ? OR "
                           "substr(text, 1, ?) = ?)", heads).rowcount
        # Not sent yet either (the platform unreachable): nothing quoting them goes out after they forgot.
        db.execute("DELETE FROM outbox WHERE chat = ? AND status = 'pending' AND (substr(text, 1, ?) = ? OR "
                   "substr(text, 1, ?) = ?)", heads)
        title = f"{HEADER}群 {chat.chat_id} · "  # "/summary #<group>" in private; private chats as a key range
        if chat.kind == "group":
            gone += db.execute(f"DELETE FROM history WHERE chat{c} >= ? AND chat{c} < ? AND from_bot = 1 AND "
                               "substr(text, 1, ?) = ?", [private, private[:-1] + ";", len(title), title]).rowcount
            db.execute(f"DELETE FROM outbox WHERE chat{c} >= ? AND chat{c} < ? AND status = 'pending' AND "
                       "substr(text, 1, ?) = ?", [private, private[:-1] + ";", len(title), title])
    return gone
