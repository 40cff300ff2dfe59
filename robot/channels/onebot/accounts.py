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
from collections.abc import Callable

from robot.channels.base import ACCOUNT_LEASE
from robot.storage.leases import LeaseKeeper

__all__ = ["OwnAccounts"]

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
