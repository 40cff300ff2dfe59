"""The run-time state of one logged-in personal-WeChat account (:mod:`.channel` keeps one per account)."""

from __future__ import annotations

import asyncio
import time

from robot.channels.weixin.api import WeixinApi
from robot.channels.weixin.state import WeixinAccount

__all__ = ["FORGOTTEN_GRACE_S", "LiveAccount"]

#: How long a forgotten private chat's token stays usable, in memory only: the reply to
#: ``/forget me`` itself (and its outbox retries) must still go out.
FORGOTTEN_GRACE_S = 600.0


class LiveAccount:
    """One account's client, context tokens and poll state."""

    def __init__(self, account: WeixinAccount, api: WeixinApi, tokens: dict[str, str] | None = None) -> None:
        self.account = account
        self.api = api
        self.tokens: dict[str, str] = tokens or {}
        #: Tokens of chats whose person said ``/forget me``: chat id -> (token, monotonic deadline); never on disk.
        self.forgotten: dict[str, tuple[str, float]] = {}
        self.expired = False  # errcode -14 seen and not yet cleared by a good poll or a new login
        #: Set when the account scan swaps in a new login: a poller paused on the expired one resumes.
        self.renewed = asyncio.Event()
        self.poller: asyncio.Task[None] | None = None
        self.commit: asyncio.Task[bool] | None = None  # the latest batch's cursor write (True: written)

    @property
    def bot_id(self) -> str:
        return self.account.bot_id

    def forgotten_token(self, chat_id: str) -> str | None:
        """A forgotten chat's token while its grace lasts."""
        held = self.forgotten.get(chat_id)
        if held is None:
            return None
        if time.monotonic() > held[1]:
            del self.forgotten[chat_id]
            return None
        return held[0]
