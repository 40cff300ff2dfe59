"""The personal-WeChat channel: one long-poll loop per logged-in account, replies by ``sendmessage``.

Receiving: ``getupdates`` with the account's ``get_updates_buf``. A batch's cursor is stored
(:mod:`.state`) only after every message of that batch has been handed to the bot (deduplicated and
recorded in history), so a crash replays rather than loses; the bot's dedupe drops the replays.

Sending needs the ``context_token`` of the user's latest message; tokens are stored per account and
chat, so a reminder due tomorrow can still go out. Without one, the outbox row fails with
the reason (WeChat does not let a bot start a conversation).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable
from pathlib import Path

import aiohttp
from pydantic import ValidationError

from robot.channels.base import (
    Capabilities,
    Channel,
    ChannelUnavailable,
    SendReceipt,
    SendRejected,
    batch_taken,
    transport_failure,
)
from robot.channels.state_store import ChannelState
from robot.channels.typing_indicator import TypingIndicators
from robot.channels.weixin import tokens
from robot.channels.weixin.api import (
    TYPING_CANCEL,
    SessionExpired,
    WeixinApi,
    WeixinApiError,
    WeixinError,
    WeixinMessage,
)
from robot.channels.weixin.convert import PLATFORM, flatten_markdown, to_message
from robot.channels.weixin.live import LiveAccount
from robot.channels.weixin.settings import WeixinSettings
from robot.channels.weixin.state import WeixinAccount, WeixinState
from robot.message import ChatRef, OutgoingMessage
from robot.privacy import ForgetRequest, Forgetter

__all__ = ["WeixinChannel"]

log = logging.getLogger(__name__)

class WeixinChannel(Channel):
    """Personal WeChat (iLink bot API); several accounts, each with its own poller."""

    platform = PLATFORM
    account_leases = True  # one long poll per account: one process polls (and sends for) it
    typing_max_s = 600.0  # "typing" stops this long after a chat's latest run started, even if none ended

    def __init__(self, settings: WeixinSettings, data_dir: Path | str = "data",
                 *, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.capabilities = Capabilities(max_text_len=settings.max_text_len, mentions=False, markdown=False)
        self.state = WeixinState(settings.state_dir or Path(data_dir) / "weixin")
        self._session = session
        self._own_session = session is None
        self.accounts: dict[str, LiveAccount] = {}
        self._typing = TypingIndicators("weixin")
        self._stopping = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._following = False  # listening for other processes' forgets

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._stopping.clear()
        stored = await self.state.load_accounts()
        wanted = set(self.settings.accounts)
        for account in stored:
            if wanted and account.bot_id not in wanted:
                continue
            tokens = await self.state.load_context_tokens(account.bot_id)
            self.accounts[account.bot_id] = LiveAccount(account, self._api_for(account), tokens)
        missing = wanted - set(self.accounts)
        if missing:
            log.error("weixin: accounts %s are configured but not logged in: run `qunbot login weixin`",
                      sorted(missing))
        if not self.accounts:
            log.error("weixin: no logged-in account in %s: run `qunbot login weixin` first", self.state.where)
        for acc in self.accounts.values():
            await self.serve_account(acc.bot_id, functools.partial(self._poll, acc))
        self._watcher = asyncio.create_task(self._watch_accounts(), name="weixin-accounts")

    async def _watch_accounts(self) -> None:
        """Serve accounts logged in while running, and pick up renewed tokens."""
        wanted = set(self.settings.accounts)
        while not self._stopping.is_set():
            await self._sleep(self.settings.account_scan_s)
            try:  # the database unreachable: look again at the next scan (this task must not die)
                await self._scan_accounts(wanted)
            except Exception as exc:
                (log.warning if isinstance(exc, OSError) else log.exception)("weixin: account scan failed: %s", exc)

    async def _scan_accounts(self, wanted: set[str]) -> None:
        for account in await self.state.load_accounts():
            if (wanted and account.bot_id not in wanted) or self._stopping.is_set():
                continue
            acc = self.accounts.get(account.bot_id)
            if acc is None:  # its tokens read first: a failed read leaves it new for the next scan
                tokens = await self.state.load_context_tokens(account.bot_id)
                log.warning("weixin: new account %s logged in; serving it", account.bot_id)
                acc = self.accounts[account.bot_id] = LiveAccount(account, self._api_for(account), tokens)
                try:
                    await self.serve_account(acc.bot_id, functools.partial(self._poll, acc))
                except BaseException:
                    del self.accounts[acc.bot_id]  # new again at the next scan
                    raise
            elif account.bot_token != acc.account.bot_token:
                acc.account, acc.api = account, self._api_for(account)
                acc.renewed.set()  # a poller paused on the old (expired) token resumes now

    def _api_for(self, account: WeixinAccount) -> WeixinApi:
        assert self._session is not None
        return WeixinApi(self._session, account.base_url, account.bot_token.get_secret_value(),
                         timeout_s=self.settings.request_timeout)

    async def stop(self) -> None:
        self._stopping.set()
        pollers = [acc.poller for acc in self.accounts.values() if acc.poller is not None]
        if self._watcher is not None:
            pollers.append(self._watcher)
            self._watcher = None
        for task in pollers:
            task.cancel()
        await asyncio.gather(*pollers, self._typing.close(), return_exceptions=True)
        # Give handed-over messages a moment, then write the cursors their batches earned.
        await self.finish_deliveries(grace_s=2.0)
        commits = [acc.commit for acc in self.accounts.values() if acc.commit is not None]
        await asyncio.gather(*commits, return_exceptions=True)
        for acc in self.accounts.values():
            if not acc.expired and acc.bot_id in self._serving:  # not an account another process serves
                with contextlib.suppress(WeixinError):
                    await acc.api.notify(start=False)
            acc.poller = acc.commit = None
        await self.stop_serving()
        self.accounts.clear()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def attach_state(self, store: ChannelState) -> None:
        self.state.attach(store)
        if not self._following:  # another process's /forget me drops the person's tokens here too
            self._following = True
            store.db.subscribe(tokens.FORGOTTEN_TOKENS, self._forgotten_elsewhere)
            store.db.after_gap(lambda: tokens.keep_stored(self.state, self.accounts.values()))

    def _forgotten_elsewhere(self, payload: str) -> Awaitable[None] | None:
        recheck = tokens.drop_forgotten(self.state, self.accounts.values(), payload)
        return tokens.keep_stored(self.state, recheck) if recheck else None

    def attach_forgetters(self, forgetters: list[Forgetter]) -> None:
        forgetter = Forgetter("weixin-context-tokens", "个微信会话凭据", self._forget)
        if forgetter not in forgetters:
            forgetters.append(forgetter)

    async def _forget(self, request: ForgetRequest) -> int:
        """``/forget me``: drop the person's private-chat ``context_token`` on every account, in every process."""
        return await tokens.forget(self.state, self.accounts.values(), request)

    def location(self) -> str | None:
        return f"personal WeChat, accounts: {', '.join(self.accounts) or 'none logged in'}"

    # --- receiving ----------------------------------------------------------------------------
    async def _poll(self, acc: LiveAccount) -> None:
        acc.poller = asyncio.current_task()  # run by serve_account: while this process holds the account
        with contextlib.suppress(WeixinError):
            await acc.api.notify(start=True)
        buf: str | None = None
        timeout_ms = self.settings.poll_timeout_ms
        failures = 0
        while not self._stopping.is_set() and self.taking:  # the bot stopping takes nothing more: ask for nothing
            asked, api = time.monotonic(), acc.api
            try:
                if buf is None:  # inside the guard: a database blip delays the poller, never ends it
                    buf = await self.state.load_cursor(acc.bot_id)
                resp = await api.get_updates(buf, timeout_ms)
            except SessionExpired:
                await self._session_expired(acc, api)
                continue
            except Exception as exc:  # WeixinError, or a bug: the poller must not die silently
                if not isinstance(exc, WeixinError):
                    log.exception("weixin %s: unexpected error while polling", acc.bot_id)
                failures += 1
                delay = min(self.settings.backoff_max_s, self.settings.retry_delay_s * 2 ** min(failures - 1, 10))
                log.warning("weixin %s: getupdates failed (%s); retrying in %.0f s", acc.bot_id, exc, delay)
                await self._sleep(delay)
                continue
            failures = 0
            if acc.expired:
                acc.expired = False
                log.warning("weixin %s: the session works again", acc.bot_id)
            if resp.longpolling_timeout_ms and resp.longpolling_timeout_ms > 0:
                timeout_ms = resp.longpolling_timeout_ms
            msgs = [m for m in resp.msgs if isinstance(m, dict)]
            if len(msgs) < len(resp.msgs):
                log.warning("weixin %s: skipped %d entries that are not messages", acc.bot_id,
                            len(resp.msgs) - len(msgs))
            await self._remember_tokens(acc, msgs)  # before delivery: a quick reply needs them
            batch = self._receive(acc, msgs)
            moved = bool(resp.get_updates_buf) and resp.get_updates_buf != buf
            if moved and resp.get_updates_buf:
                buf = resp.get_updates_buf
                acc.commit = asyncio.create_task(self._commit(acc, acc.commit, batch, buf))
            if not (batch or moved) and time.monotonic() - asked < 1:  # nothing new, answered at once (a proxy,
                await self._sleep(self.settings.retry_delay_s)  # a broken server, only junk): no busy loop

    def _receive(self, acc: LiveAccount, raw: list[dict[str, object]]) -> list[asyncio.Task[bool]]:
        tasks: list[asyncio.Task[bool]] = []
        for item in raw:
            try:
                msg = WeixinMessage.model_validate(item)
                message = to_message(acc.bot_id, msg)
            except ValueError as exc:  # pydantic's ValidationError included
                errors = exc.error_count() if isinstance(exc, ValidationError) else 1
                log.warning("weixin %s: skipped a malformed message (%d errors)", acc.bot_id, errors)
                continue
            if message is None:
                continue
            tasks.append(asyncio.create_task(self._deliver_logged(message),
                                             name=f"weixin-deliver-{message.message_id}"))
            self._deliveries.add(tasks[-1])
            tasks[-1].add_done_callback(self._deliveries.discard)
        return tasks

    async def _commit(self, acc: LiveAccount, previous: asyncio.Task[bool] | None,
                      batch: list[asyncio.Task[bool]], buf: str) -> bool:
        """Write ``buf`` once this batch (and every earlier one) has been taken by the bot; whether it was."""
        if not await batch_taken(previous, batch):  # the old cursor stays: the restart replays the batch
            return False
        try:
            await self.state.save_cursor(acc.bot_id, buf)
        except OSError:  # the batch was taken: a later cursor still covers it
            log.exception("weixin %s: could not save the poll cursor", acc.bot_id)
        return True

    async def _remember_tokens(self, acc: LiveAccount, raw: list[dict[str, object]]) -> None:
        await tokens.remember(self.state, acc, raw)

    @staticmethod
    def _mark_expired(acc: LiveAccount) -> None:
        """Flag the account's session as expired (a poll or a send saw errcode -14); told once per expiry."""
        if not acc.expired:
            acc.expired = True
            log.error("weixin %s: 微信登录已失效（errcode -14）。请运行 `qunbot login weixin` 重新登录；"
                      "the session expired, log in again", acc.bot_id)

    async def _session_expired(self, acc: LiveAccount, failed: WeixinApi) -> None:
        """Wait (up to ``session_pause_s``) for a new login after ``failed``'s token expired."""
        if acc.api is not failed:  # the account scan swapped a new login in while that poll was out
            return
        expired = acc.account.bot_token  # (compared with what is stored: the scan may swap it in first)
        self._mark_expired(acc)
        # Wait out the pause, but pick up a new login (a changed token on disk) at once.
        waited = 0.0
        acc.renewed.clear()
        while waited < self.settings.session_pause_s and not self._stopping.is_set():
            step = min(5.0, self.settings.session_pause_s - waited)
            with contextlib.suppress(TimeoutError):  # (stop() cancels this poller)
                await asyncio.wait_for(acc.renewed.wait(), timeout=step)
            waited += step
            try:
                fresh = acc.account if acc.api is not failed else await self.state.load_account(acc.bot_id)
            except OSError:  # a database blip: look again at the next step (the poller must not die)
                continue
            if fresh is not None and fresh.bot_token != expired:
                log.warning("weixin %s: new login found, resuming", acc.bot_id)
                if acc.api is failed:
                    acc.account, acc.api = fresh, self._api_for(fresh)
                return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    # --- sending ------------------------------------------------------------------------------
    def _account_for(self, chat: ChatRef) -> LiveAccount:
        if chat.account:
            acc = self.accounts.get(chat.account)
            if acc is None:
                raise SendRejected(f"weixin account {chat.account!r} is not logged in here")
            return acc
        if len(self.accounts) == 1:
            return next(iter(self.accounts.values()))
        holders = [acc for acc in self.accounts.values() if chat.chat_id in acc.tokens]
        if len(holders) == 1:
            return holders[0]
        if not holders:
            raise SendRejected(f"no weixin account has talked with {chat.chat_id}")
        raise SendRejected(f"several weixin accounts talk with {chat.chat_id} and the message names none")

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if not self.accounts:
            raise ChannelUnavailable("no weixin account is logged in (run `qunbot login weixin`)")
        acc = self._account_for(message.chat)
        async with self._typing.paused(f"{acc.bot_id}|{message.chat.chat_id}"):  # back after it if runs go on
            return await self._send(acc, message)

    async def _send(self, acc: LiveAccount, message: OutgoingMessage) -> SendReceipt:
        token = acc.tokens.get(message.chat.chat_id) or acc.forgotten_token(message.chat.chat_id) \
            or await self.state.context_token(acc.bot_id, message.chat.chat_id)  # learned by the last holder
        if not token:
            raise SendRejected(
                f"no context_token for {message.chat.chat_id} on weixin account {acc.bot_id}: WeChat lets a bot "
                "write only after the user has messaged it")
        if acc.expired:
            raise ChannelUnavailable(f"weixin account {acc.bot_id}: session expired, run `qunbot login weixin`")
        text = flatten_markdown(message.text) or message.text
        client_id = "qunbot-" + hashlib.sha256(message.key.encode()).hexdigest()[:24]
        try:
            mid = await acc.api.send_text(message.chat.chat_id, text, context_token=token, client_id=client_id)
        except SessionExpired as exc:
            self._mark_expired(acc)
            raise ChannelUnavailable(f"weixin account {acc.bot_id}: session expired, run `qunbot login weixin`") \
                from exc
        except WeixinApiError as exc:
            raise SendRejected(str(exc)) from exc
        except WeixinError as exc:
            raise transport_failure(str(exc), exc) from exc
        return SendReceipt(platform_message_id=mid)

    # --- typing -------------------------------------------------------------------------------
    async def typing(self, chat: ChatRef, active: bool) -> None:
        """Show "typing" in a private chat while any run in it goes on (the last one's end clears it)."""
        if chat.kind != "private":
            return
        try:
            acc = self._account_for(chat)
        except SendRejected:
            return
        key, user_id = f"{acc.bot_id}|{chat.chat_id}", chat.chat_id
        if not active:
            await self._typing.end(key)
            return
        if not self.settings.typing or self._stopping.is_set():
            return
        ticket: str | None = None  # asked once per spell of typing (getconfig)

        async def show() -> bool:
            nonlocal ticket
            if ticket is None:
                ticket = await acc.api.typing_ticket(user_id, acc.tokens.get(user_id))
            if ticket:
                await acc.api.send_typing(user_id, ticket)
            return bool(ticket)

        async def clear() -> None:
            if ticket:
                await acc.api.send_typing(user_id, ticket, TYPING_CANCEL)

        self._typing.begin(key, show, clear, every=self.settings.typing_refresh_s, max_s=self.typing_max_s)
