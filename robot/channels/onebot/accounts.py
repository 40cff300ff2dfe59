"""The bot's own OneBot accounts, as a set: a message one of them sent, seen by another of them in the same
group, is the bot's reply, never a member's words.

Those this process has spoken for are added as they connect. On a database several processes share, the
accounts the others serve (their account leases, :data:`robot.channels.base.ACCOUNT_LEASE`) count too:
they are looked up in the background, at most every :attr:`OwnAccounts.every_s`, so a membership test
never waits on the database (the first test after a start may come before the first look-up)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from robot.channels.base import ACCOUNT_LEASE
from robot.storage.leases import LeaseKeeper

__all__ = ["GroupLines", "OwnAccounts"]

log = logging.getLogger(__name__)
_PREFIX = ACCOUNT_LEASE.format(platform="onebot", account="")


class OwnAccounts(set[str]):
    """This process's accounts (the set itself), and other processes' (looked up through ``leases``)."""

    every_s = 30.0

    def __init__(self, leases: Callable[[], LeaseKeeper | None]) -> None:
        super().__init__()
        self._leases = leases
        self._others: set[str] = set()
        self._at = -float("inf")
        self._task: asyncio.Task[None] | None = None

    def __contains__(self, account: object) -> bool:
        self._look_soon()
        return super().__contains__(account) or account in self._others

    def all(self) -> set[str]:
        """Every account of the bot's: this process's and, as last looked up, the other processes'
        (a reply to an @ of one of theirs is sent by the process that serves it)."""
        self._look_soon()
        return set(self) | self._others

    def _look_soon(self) -> None:
        keeper = self._leases()
        if keeper is None or not keeper.leases.exclusive or time.monotonic() - self._at < self.every_s:
            return  # (one process per SQLite file: no other process serves an account)
        if self._task is not None and not self._task.done():
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to look up with
            self._task = asyncio.get_running_loop().create_task(self._look(keeper), name="onebot-own-accounts")
            self._at = time.monotonic()

    async def _look(self, keeper: LeaseKeeper) -> None:
        try:
            self._others = {name[len(_PREFIX):] for name in await keeper.leases.holders(_PREFIX)}
        except Exception as exc:  # (the database away): the last list stands
            log.debug("onebot: cannot read the other processes' accounts: %s", exc)


class GroupLines:
    """Which of the bot's accounts a group line reached first, by its group-wide number.

    NapCat numbers messages per account (its ``message_id``), so one member line reaching two of the bot's
    accounts is two messages: stored twice, read twice by the model. Its ``real_seq`` is QQ's own sequence
    number in the group, the same on every account: a line is taken from the first account it arrives on.
    Implementations without one (Lagrange, go-cqhttp) give every account the same ``message_id`` already.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._first: OrderedDict[tuple[str, str], str] = OrderedDict()

    def first(self, account: str | None, event: Mapping[str, Any], answering: str | None = None) -> bool:
        """Whether ``event``, received by ``account``, is not a copy of a group line another of the bot's accounts
        already took. A line that @s a sibling (``answering``) is left to that account's own copy: this one's
        message id means nothing to the sibling's NapCat, so a reply quoting it could quote another message
        (another group's, even)."""
        group, seq = event.get("group_id"), event.get("real_seq")
        if not account or event.get("message_type") != "group" or group is None or seq in (None, "", 0, "0"):
            return True
        if answering and answering != account:
            return False
        key = (str(group), str(seq))
        taken = self._first.setdefault(key, account)
        self._first.move_to_end(key)
        while len(self._first) > self._size:
            self._first.popitem(last=False)
        return taken == account
