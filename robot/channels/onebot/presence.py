"""Whether each bot account is logged in to QQ, as its OneBot implementation reports it.

A socket can be open while its account is logged out (QQ kicked the session, a login expired):
NapCat then refuses every send (``retcode 1200``). Heartbeats (``status.online``), lifecycle
``enable``/``disable`` and ``get_status`` say so; while an account is reported offline its
messages wait (``ChannelUnavailable``) instead of spending their attempts, and go once it is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from robot.channels.base import ChannelError, ChannelUnavailable

__all__ = ["Presence", "online_of"]

log = logging.getLogger("robot.channels.onebot.channel")
#: An account reported offline with no word since for this long is asked again (``get_status``):
#: heartbeats may be off, and a parked chat must not wait forever on an old report.
RECHECK_S = 30.0
Ask = Callable[[], Awaitable[Mapping[str, Any]]]


def online_of(status: object) -> bool | None:
    """The ``online`` flag of a heartbeat's ``status`` or a ``get_status`` answer's ``data`` (NapCat:
    ``{online, good}``, Lagrange adds ``app_*``); ``None`` when it says nothing (NapCat omits it at times)."""
    online = status.get("online") if isinstance(status, Mapping) else None
    return online if isinstance(online, bool) else None


class Presence:
    """The last reported online state of each account (``""``: the account whose id is unknown)."""

    def __init__(self, on_back: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        #: Called when an account reported offline is back (the outbox sends what waited for it).
        self._on_back = on_back
        self._clock = clock
        self._state: dict[str, tuple[bool, float]] = {}  # account -> (online, when last reported)

    def online(self, account: str) -> bool | None:
        """What the implementation last said (``None``: nothing yet, since the socket connected)."""
        state = self._state.get(account)
        return None if state is None else state[0]

    def report(self, account: str, online: bool | None) -> None:
        """Record a report; ``None`` forgets (a new socket: not known yet)."""
        before = self.online(account)
        if online is None:
            self._state.pop(account, None)
        else:
            self._state[account] = (online, self._clock())
        if online is False and before is not False:
            log.warning("onebot: account %s is logged out of QQ (offline): its messages wait until it is back",
                        account or "?")
        elif before is False and online is not False:
            log.info("onebot: account %s is %s", account or "?", "online again" if online else "reconnected")
            self._on_back()

    def on_meta(self, account: str, event: Mapping[str, Any]) -> None:
        """A ``meta_event`` of ``account``'s socket: lifecycle and heartbeat."""
        kind = event.get("meta_event_type")
        if kind == "lifecycle":
            sub_type = event.get("sub_type")
            log.info("onebot: lifecycle %s (self_id=%s)", sub_type, account or None)
            if sub_type in ("enable", "disable"):
                self.report(account, sub_type == "enable")
            elif sub_type == "connect":  # a socket (re)opened: whether it is logged in, its heartbeat says
                self.report(account, None)
        elif kind == "heartbeat":
            online = online_of(event.get("status"))
            if online is not None:
                self.report(account, online)
            log.debug("onebot: heartbeat (self_id=%s)", account or None)

    async def check(self, account: str, ask: Ask, *, recheck: bool = False) -> None:
        """Raise :class:`ChannelUnavailable` (the chat waits, its attempts unspent) while ``account`` is
        reported offline. ``ask`` (``get_status``) is called when ``recheck`` (a send was just refused)
        or when it has been reported offline without a word for a while."""
        state = self._state.get(account)
        if recheck or (state is not None and not state[0] and self._clock() - state[1] >= RECHECK_S):
            try:
                response = await ask()
            except ChannelError as exc:  # (an implementation without get_status): the last word stands
                log.debug("onebot: get_status for account %s failed: %s", account or "?", exc)
                online = None
            else:
                online = online_of(response.get("data"))
            if online is not None:
                self.report(account, online)
            elif state is not None:
                self._state[account] = (state[0], self._clock())  # asked again after a while, not at every retry
        if self.online(account) is False:
            raise ChannelUnavailable(f"onebot: account {account or '?'} is logged out of QQ (offline)")
