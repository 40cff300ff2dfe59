"""The small abstract channel every platform adapter implements.

A channel turns platform traffic into :class:`robot.Message` values, hands them to the
sink the bot binds, and sends :class:`robot.OutgoingMessage` values back. Vendor details
(wire formats, auth, reconnects) stay inside the channel.

Errors::

    ChannelError
    ├── ChannelUnavailable   the platform is not reachable now (not connected): the chat's messages wait
    │   │                    for a reconnect, without growing their backoff
    │   └── SendFailed       this message failed for now (no answer in time, a transient refusal):
    │                        retried with backoff, a bounded number of times
    └── SendRejected         the platform refused this message; retrying will not help
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import aiohttp
from pydantic import BaseModel, ConfigDict

from robot.history import HistoryEntry
from robot.message import ChatRef, Message, OutgoingMessage

if TYPE_CHECKING:
    from robot.channels.state_store import ChannelState
    from robot.privacy import Forgetter
    from robot.storage.leases import LeaseKeeper

__all__ = [
    "ACCOUNT_LEASE",
    "CHANNEL_LEASE",
    "Capabilities",
    "Channel",
    "ChannelError",
    "ChannelUnavailable",
    "ChatHistory",
    "ChatMoved",
    "MessageRecalled",
    "MessageSink",
    "NotTaken",
    "PanelProvider",
    "SendFailed",
    "SendReceipt",
    "SendRejected",
    "batch_taken",
    "cut_mention",
    "transport_failure",
]

MessageSink = Callable[[Message], Awaitable[None]]
#: Told when the platform moved a chat to a new id (a Telegram group became a supergroup).
ChatMoved = Callable[[ChatRef, ChatRef], Awaitable[None]]
#: Deletes the stored copy of a message recalled on its platform: (chat, its id as received, its sender
#: if known) -> rows deleted (``HistoryStore.forget_message``).
MessageRecalled = Callable[[ChatRef, str, str | None], Awaitable[int]]
#: A side-panel source, e.g. a chat's reminders: rows of short label -> value strings.
PanelProvider = Callable[[ChatRef], Awaitable[list[dict[str, str]]]]
#: A chat's newest stored messages, oldest first (``HistoryStore.recent``).
ChatHistory = Callable[[ChatRef, int], Awaitable[list[HistoryEntry]]]


log = logging.getLogger(__name__)
#: The lease a process holds while it serves an account's connection (and sends its outbox rows).
ACCOUNT_LEASE = "account:{platform}:{account}"
#: The lease of a channel that runs in one process only (:attr:`Channel.one_process`).
CHANNEL_LEASE = "channel:{platform}"


def cut_mention(mention: re.Pattern[str], text: str) -> str:
    """The text without ``mention``'s matches (each with the blanks after it): one space stays between two
    words, the message's own spaces (code's indentation) stay as sent (the playground's and the console's)."""
    def one(m: re.Match[str]) -> str:
        before, after = text[m.start() - 1:m.start()], text[m.end():m.end() + 1]
        return " " if before.strip() and after.strip() else ""
    return mention.sub(one, text).strip()


async def batch_taken(previous: asyncio.Task[bool] | None, batch: Sequence[asyncio.Task[bool]]) -> bool:
    """Whether a poll's deliveries (``_deliver_logged`` tasks), and the batch before them (``previous``: its
    own check), were all taken by the bot: only then may a poll cursor move past them. A delivery cut
    short by ``stop()`` or not taken as the bot stops (:class:`NotTaken`) keeps it where it was."""
    if previous is not None and (await asyncio.gather(previous, return_exceptions=True))[0] is not True:
        return False  # a cursor past this batch covers the earlier one too
    return all(r is True for r in await asyncio.gather(*batch, return_exceptions=True))


class ChannelError(Exception):
    """Base of channel failures."""


class ChannelUnavailable(ChannelError):
    """Not connected or the platform timed out: the message stays in the outbox and is retried.

    ``retry_after_s`` is the platform's own wait (flood control); the outbox waits at least that.
    """

    def __init__(self, *args: object, retry_after_s: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after_s = retry_after_s


class SendFailed(ChannelUnavailable):
    """The channel is up, but this message failed for now: the outbox retries it a bounded number of times."""


def transport_failure(message: str, cause: BaseException | None) -> ChannelUnavailable:
    """The exception for a request that got no usable answer: a platform it cannot reach at all
    (connection refused, DNS) is :class:`ChannelUnavailable` (the chat waits, no backoff grows);
    anything else (an HTTP 5xx, a timeout, a garbled body) is this message's :class:`SendFailed`."""
    seen = cause
    while seen is not None and not isinstance(seen, TimeoutError):
        if isinstance(seen, ConnectionError | aiohttp.ClientConnectionError | OSError):
            return ChannelUnavailable(message)
        seen = seen.__cause__ or seen.__context__
    return SendFailed(message)


class NotTaken(ChannelError):
    """The bot is stopping and did not take this incoming message: nothing of it was stored. A
    channel leaves it unacknowledged (no poll cursor past it, no "success" to a callback), so the
    platform delivers it again after the restart."""


class SendRejected(ChannelError):
    """The platform answered with a definite refusal: the message is marked failed, not retried."""


class Capabilities(BaseModel):
    """What a channel can do; the pipeline adapts replies to it."""

    model_config = ConfigDict(frozen=True)

    max_text_len: int = 4000
    mentions: bool = True
    streaming: bool = False
    markdown: bool = False


class SendReceipt(BaseModel):
    """The platform's acknowledgement of one sent message."""

    model_config = ConfigDict(frozen=True)

    platform_message_id: str | None = None


class Channel(abc.ABC):
    """A platform adapter. ``platform`` is the prefix of chat keys and admin ids (``onebot``)."""

    platform: str = "abstract"
    capabilities: Capabilities = Capabilities()
    #: Whether the platform's connection is per account (Telegram polling, the Weixin long poll,
    #: OneBot sockets): then one process at a time serves an account, the holder of its lease
    #: (:data:`ACCOUNT_LEASE`), and only it sends the account's outbox rows.
    account_leases: bool = False
    #: Whether what the channel serves lives in this process's memory (the web playground's pages,
    #: the console, WeCom's callback streams): several processes on one database run it in one
    #: process at a time, the holder of :data:`CHANNEL_LEASE` (see :mod:`robot.channels.one_process`).
    one_process: bool = False
    #: This process's leases, once the bot attached them (:meth:`attach_leases`); None: serve anyway.
    leases: LeaseKeeper | None = None
    recall_retry_s: tuple[float, ...] = (2.0, 15.0)  #: seconds before looking again for a recalled message

    def __init__(self) -> None:
        self._sink: MessageSink | None = None
        self._on_moved: ChatMoved | None = None
        self._on_recalled: MessageRecalled | None = None
        self._deliveries: set[asyncio.Task[Any]] = set()
        #: False once the bot is stopping (:meth:`stop_taking`): a message arriving now is not taken
        #: (:class:`NotTaken`); a poller stops asking, a callback answers with a failure.
        self.taking = True
        self._connect_listeners: list[Callable[[], None]] = []
        #: Per account: the task serving it (a poll loop) while this process holds its lease.
        self._serving: dict[str, asyncio.Task[None] | None] = {}
        self._serving_over = False
        self._connected_accounts: set[str] = set()

    def on_connect(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the platform (re)connects (the outbox wakes on it)."""
        self._connect_listeners.append(listener)

    def announce_connected(self) -> None:
        """For channels: a connection to the platform (re)opened; what waited for it can go now."""
        for listener in list(self._connect_listeners):
            try:
                listener()
            except Exception:
                log.exception("%s: a connect listener failed", self.platform)

    def attach_leases(self, leases: LeaseKeeper) -> None:
        """The bot's leases: a channel with :attr:`account_leases` serves an account only while it holds it."""
        self.leases = leases

    def lease_name(self, account: str) -> str:
        return ACCOUNT_LEASE.format(platform=self.platform, account=account)

    def default_account(self) -> str | None:
        """The account an outbox row that names none leaves through (the channel's only one), if any."""
        return None

    async def serve_account(self, account: str, serve: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Serve ``account`` (run ``serve()``, say its poll loop) while this process holds its lease;
        at once when no leases are attached. A lost lease cancels ``serve``; retaking it starts it again."""
        self._serving_over = False
        if self.leases is None:
            self._account_held(account, serve, True)
        else:
            await self.leases.want(self.lease_name(account), functools.partial(self._account_held, account, serve))

    def _account_held(self, account: str, serve: Callable[[], Coroutine[Any, Any, None]] | None, held: bool) -> None:
        if self._serving_over:
            return
        task = self._serving.get(account)
        if held:
            if task is None or task.done():
                self._serving[account] = None if serve is None else asyncio.create_task(
                    serve(), name=f"{self.platform}-serve-{account}")
            self.announce_connected()  # the outbox may send the account's rows now
        elif account in self._serving:
            log.warning("%s: another process serves account %s now; this one stops serving it", self.platform, account)
            if task is not None:
                task.cancel()
            del self._serving[account]

    def serve_accounts_soon(self, accounts: Iterable[str]) -> None:
        """Serve exactly ``accounts`` (those whose connection is open here: OneBot sockets), in the background:
        a newly connected one's lease is wanted, a disconnected one's is given up at once."""
        now = {a for a in accounts if a}
        if now == self._connected_accounts or self._serving_over:
            return
        gone, new = self._connected_accounts - now, now - self._connected_accounts
        self._connected_accounts = now
        task = asyncio.create_task(self._reserve(gone, new), name=f"{self.platform}-accounts")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _reserve(self, gone: set[str], new: set[str]) -> None:
        try:
            for account in sorted(gone):
                # Many processes: another may have the account's socket now, so the lease goes at once.
                # One (SQLite): it stays, and the account's rows wait here, parked, for the reconnect.
                if self.leases is not None and self.leases.leases.exclusive:
                    self._serving.pop(account, None)
                    await self.leases.drop(self.lease_name(account))
            for account in sorted(new):
                await self.serve_account(account)
        except Exception:
            log.exception("%s: taking or giving up account leases failed", self.platform)

    @property
    def served(self) -> frozenset[str]:
        """The accounts this process serves now (holds the lease of)."""
        return frozenset(self._serving)

    async def stop_serving(self) -> None:
        """For :meth:`stop`: end every account's :meth:`serve_account` task (leases stay the bot's to release)."""
        self._serving_over = True
        tasks = [t for t in self._serving.values() if t is not None]
        self._serving.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def bind(self, sink: MessageSink) -> None:
        """Set where incoming messages go; the bot calls this before :meth:`start`."""
        self._sink, self.taking = sink, True  # (a bot started again takes messages again)

    def bind_moves(self, callback: ChatMoved) -> None:
        """Set who moves a chat's stored data when the platform gives the chat a new id."""
        self._on_moved = callback

    async def chat_moved(self, old: ChatRef, new: ChatRef) -> None:
        """Report a chat's new id; the bot moves its history, queued replies and plugin data."""
        if self._on_moved is None:
            return
        try:
            await self._on_moved(old, new)
        except Exception:
            log.exception("%s: moving chat %s to %s failed", self.platform, old.key, new.key)

    def bind_recalls(self, callback: MessageRecalled) -> None:
        """Set who deletes a stored message its sender (or an admin) recalled on the platform (the bot:
        ``HistoryStore.forget_message``)."""
        self._on_recalled = callback

    def recall_soon(self, chat: ChatRef, message_id: str, sender: str | None = None) -> None:
        """For channels: the platform says message ``message_id`` (as received) was recalled; its stored
        copy goes, in the background (the model and summaries no longer read it). A message still on
        its way to the history (delivered a moment before) is looked for again after each of
        :attr:`recall_retry_s`."""
        task = asyncio.create_task(self._recall(chat, message_id, sender), name=f"{self.platform}-recall")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _recall(self, chat: ChatRef, message_id: str, sender: str | None) -> None:
        if self._on_recalled is None:
            log.warning("%s: message %s was recalled, but nothing deletes its stored copy", self.platform, message_id)
            return
        for wait in (0.0, *self.recall_retry_s):
            await asyncio.sleep(wait)
            try:
                if await self._on_recalled(chat, message_id, sender):
                    log.info("%s: recalled message %s deleted from the history", self.platform, message_id)
                    return
            except Exception:
                log.exception("%s: deleting recalled message %s failed", self.platform, message_id)

    def stop_taking(self) -> None:
        """The bot is stopping: take no more messages (the outbox may still send)."""
        self.taking = False

    async def deliver(self, message: Message) -> None:
        """Hand one incoming message to the bot; :class:`NotTaken` when the bot is stopping."""
        if self._sink is None:
            raise ChannelError(f"channel {self.platform!r} received a message before it was bound")
        await self._sink(message)

    def deliver_soon(self, message: Message) -> None:
        """Deliver in the background, so the platform's reader never waits on the bot; failures are logged."""
        task = asyncio.create_task(self._deliver_logged(message),
                                   name=f"{self.platform}-deliver-{message.message_id}")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver_logged(self, message: Message) -> bool:
        """Deliver; False when the bot did not take the message (:class:`NotTaken`): not to be acknowledged."""
        try:
            await self.deliver(message)
        except NotTaken:
            log.info("%s: message %s not taken: the bot is stopping", self.platform, message.message_id)
            return False
        except Exception:
            log.exception("%s: delivering message %s failed", self.platform, message.message_id)
        return True

    async def finish_deliveries(self, grace_s: float = 0.0) -> None:
        """For :meth:`stop`: give deliveries in flight ``grace_s`` to finish, then cancel the rest."""
        pending = set(self._deliveries)
        if pending and grace_s > 0:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @abc.abstractmethod
    async def start(self) -> None:
        """Start listening or connecting; returns once the channel is serving."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop and release sockets; idempotent."""

    @abc.abstractmethod
    async def send(self, message: OutgoingMessage) -> SendReceipt:
        """Send one message; raise :class:`ChannelUnavailable` or :class:`SendRejected` on failure."""

    def location(self) -> str | None:
        """Where people or the platform reach this channel once started (a URL), for start-up logs."""
        return None

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:  # noqa: B027
        """Show a piece of a reply as it streams; only channels with ``capabilities.streaming`` act."""

    async def typing(self, chat: ChatRef, active: bool) -> None:  # noqa: B027
        """Show (``active``) or clear a "typing" indicator while the model works; a no-op by default."""

    async def publish_commands(self, commands: Sequence[tuple[str, str]]) -> None:  # noqa: B027
        """Offer the bot's ``(command, description)`` list in the platform's menu; a no-op by default."""

    async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:  # noqa: B027
        """Observe a run's tool trace (the web playground shows it); a no-op elsewhere."""

    def attach_panels(self, panels: dict[str, PanelProvider]) -> None:  # noqa: B027
        """Receive the bot's side panels (plugins add them at setup); only the web playground shows them."""

    def attach_forgetters(self, forgetters: list[Forgetter]) -> None:  # noqa: B027
        """Receive the bot's ``/forget me`` list; a channel that keeps per-person data (tokens) adds its own."""

    def attach_chats(self, history: ChatHistory, zone_for: Callable[[ChatRef], ZoneInfo]) -> None:  # noqa: B027
        """Receive the stored history and each chat's zone (the web playground shows past messages and
        times in the chat's zone); a no-op elsewhere."""

    def attach_state(self, store: ChannelState) -> None:  # noqa: B027
        """Receive the bot's :class:`~robot.channels.state_store.ChannelState` (before :meth:`start`): a
        channel with cursors or credentials keeps them there, shared by every process on the database."""
