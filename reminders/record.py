"""One stored reminder, as the ``reminders`` table holds it (:mod:`reminders.store` reads and writes it)."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from reminders.schedule import Kind, Schedule
from robot import ChatRef, iso

__all__ = ["COLUMNS", "Mode", "Reminder", "Status", "new_id", "parse_instant"]

Mode = Literal["text", "prompt", "command"]
Status = Literal["active", "done", "missed", "deleted", "broken"]
COLUMNS = ("id", "owner", "owner_name", "chat", "type", "wall", "zone", "weekday", "content", "mode",
           "created_at", "updated_at", "next_fire", "last_fired", "status", "failure_reported", "account", "source")
"""The table's columns of a :class:`Reminder`, in its fields' order."""


def new_id() -> str:
    """A fresh reminder id: 32 hex characters of a uuid4."""
    return uuid.uuid4().hex


@functools.lru_cache(maxsize=8192)  # rows fired together share their instants
def parse_instant(text: str | None) -> datetime | None:
    """Stored UTC text -> aware datetime (``fromisoformat`` is ~30x faster than ``strptime``)."""
    return None if text is None else datetime.fromisoformat(text)


@functools.lru_cache(maxsize=4096)
def _schedule(kind: Kind, wall: str, zone: str, weekday: int | None) -> Schedule:
    return Schedule(kind, wall, zone, weekday)


@functools.lru_cache(maxsize=4096)  # ChatRef is frozen: reminders of one chat can share it
def _chat_ref(chat: str, account: str) -> ChatRef:
    return ChatRef.from_key(chat, account)


@dataclass(frozen=True, slots=True)
class Reminder:
    """One stored reminder. ``owner`` is ``platform:user_id``; ``chat`` a :class:`ChatRef` key."""

    id: str
    owner: str
    owner_name: str
    chat: str
    type: Kind
    wall: str
    zone: str
    weekday: int | None
    content: str
    mode: Mode
    created_at: datetime
    updated_at: datetime
    next_fire: datetime | None
    last_fired: datetime | None = None
    status: Status = "active"
    failure_reported: bool = False
    #: The bot account that owns the chat (``ChatRef.account``): the reminder leaves through it.
    account: str = ""
    #: Digest of the request that created it (message and arguments; "" when none): a redelivered
    #: message finds the reminder it already made instead of creating a second one.
    source: str = ""

    @property
    def schedule(self) -> Schedule:
        """The validated schedule (raises ``ScheduleError`` for a corrupted row)."""
        return _schedule(self.type, self.wall, self.zone, self.weekday)

    @property
    def chat_ref(self) -> ChatRef:
        return _chat_ref(self.chat, self.account)

    @property
    def owner_id(self) -> str:
        """The platform's user id (what a mention needs)."""
        return self.owner.split(":", 1)[1]

    def evolve(self, **changes: Any) -> Reminder:
        """A copy with ``changes`` (what ``dataclasses.replace`` does, a third faster: a burst evolves
        every reminder it fires)."""
        values = list(_values(self))
        for name, value in changes.items():
            values[_FIELD_AT[name]] = value
        return Reminder(*values)

    def row(self) -> tuple[object, ...]:
        return (self.id, self.owner, self.owner_name, self.chat, self.type, self.wall, self.zone, self.weekday,
                self.content, self.mode, iso(self.created_at), iso(self.updated_at),
                None if self.next_fire is None else iso(self.next_fire),
                None if self.last_fired is None else iso(self.last_fired), self.status, int(self.failure_reported),
                self.account, self.source)

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Reminder:
        """A reminder from its :data:`COLUMNS`' values."""
        (id_, owner, owner_name, chat, kind, wall, zone, weekday, content, mode, created, updated, next_fire,
         last_fired, status, reported, account, source) = values
        return cls(id_, owner, owner_name, chat, kind, wall, zone, weekday, content, mode, _instant(created),
                   _instant(updated), parse_instant(next_fire), parse_instant(last_fired), status, bool(reported),
                   account or "", source or "")


def _instant(text: str) -> datetime:
    at = parse_instant(text)
    assert at is not None
    return at


_FIELD_AT = {name: i for i, name in enumerate(COLUMNS)}
_values = operator.attrgetter(*COLUMNS)
