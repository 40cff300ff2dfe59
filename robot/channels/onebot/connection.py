"""OneBot v11 wire pieces shared by both modes: sockets, the token check, echo-matched actions."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from robot.channels.base import ChannelUnavailable, SendFailed, SendReceipt, SendRejected

__all__ = [
    "ActionLost",
    "ActionTimeout",
    "ClientRole",
    "Connection",
    "OneBotActionFailed",
    "PendingActions",
    "Sockets",
    "auth_rejection",
    "check_response",
    "final",
    "peer_rejection",
    "receipt_of",
    "role_for",
    "wire_id",
]

ClientRole = Literal["Universal", "API", "Event"]
_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse
log = logging.getLogger("robot.channels.onebot.channel")
_ROLES: dict[str, ClientRole] = {"universal": "Universal", "api": "API", "event": "Event"}
_LATE_KEEP = 256  # timed-out echos still awaited: a slow implementation may answer after all
LateAnswer = Callable[[dict[str, Any]], None]


class OneBotActionFailed(SendRejected):
    """The implementation refused an action (``status: failed``); ``retcode`` says why."""

    def __init__(self, action: str, retcode: object, detail: str = "") -> None:
        self.action = action
        self.retcode = retcode
        suffix = f": {detail}" if detail else ""
        super().__init__(f"onebot action {action!r} failed with retcode {retcode}{suffix}")


class ActionTimeout(SendFailed):
    """No answer within ``action_timeout_s``: the action may still have happened (retried, bounded)."""


class ActionLost(SendFailed):
    """The socket closed after the action's frame was written, before its answer: the action may have
    happened (retried, a bounded number of times: the chat may see a message twice)."""


@dataclass(eq=False)
class Connection:
    """One open socket: its role and the account id it speaks for (if known)."""

    ws: _Socket
    role: ClientRole
    self_id: str | None
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Why the implementation refused this connection (a ``retcode 1403`` frame), if it did.
    refused: str | None = None

    @property
    def carries_actions(self) -> bool:
        return self.role != "Event" and not self.ws.closed


def auth_rejection(request: web.Request, token: str | None) -> web.Response | None:
    """The OneBot access-token check, before the upgrade: 401 if missing, 403 if wrong, else None.

    Accepts ``Authorization: Bearer <token>`` (or the older ``Token <token>``) and ``?access_token=``.
    """
    if token is None:
        return None
    supplied: str | None = None
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() in ("bearer", "token") and value.strip():
        supplied = value.strip()
    elif request.query.get("access_token"):
        supplied = request.query["access_token"]
    if supplied is None:
        return web.Response(status=401, text="missing access token")
    if not hmac.compare_digest(supplied.encode(errors="surrogateescape"), token.encode()):  # (a header's bytes)
        return web.Response(status=403, text="invalid access token")
    return None


class Sockets:
    """The open sockets, newest last, and which one carries a given account's actions."""

    def __init__(self, on_accounts: Callable[[set[str]], None] = lambda accounts: None) -> None:
        self._conns: list[Connection] = []
        #: Told the accounts with an action socket open whenever that may have changed (the channel
        #: then holds exactly their leases: an account is served by the process its socket is open to).
        self._on_accounts = on_accounts

    def all(self) -> list[Connection]:
        return list(self._conns)

    def add(self, conn: Connection) -> None:
        if conn.self_id and conn.role != "Event" and any(
            other.self_id == conn.self_id and other.carries_actions for other in self._conns
        ):
            log.warning("onebot: a new %s socket for account %s replaces its open one", conn.role, conn.self_id)
        self._conns.append(conn)
        self._on_accounts(self.accounts())

    def remove(self, conn: Connection) -> None:
        self._conns.remove(conn)
        self._on_accounts(self.accounts())

    def learn(self, conn: Connection, self_id: str) -> str:
        """``conn`` speaks for ``self_id`` (its events say so); returns it."""
        conn.self_id = self_id
        self._on_accounts(self.accounts())
        return self_id

    def accounts(self) -> set[str]:
        return {conn.self_id for conn in self._conns if conn.carries_actions and conn.self_id}

    def carries_actions(self) -> bool:
        return any(conn.carries_actions for conn in self._conns)

    def for_account(self, account: str) -> Connection:
        """The newest action socket of ``account``; with ``""``, of the only account connected.

        Raises :class:`ChannelUnavailable` when that account is offline and
        :class:`SendRejected` when ``""`` is ambiguous (several accounts are connected).
        """
        live = [conn for conn in reversed(self._conns) if conn.carries_actions]
        if not live:
            raise ChannelUnavailable("onebot: no OneBot implementation is connected")
        if account:
            mine = [conn for conn in live if conn.self_id == account]
            if not mine:
                raise ChannelUnavailable(f"onebot: account {account} is not connected")
            return mine[0]
        if len({conn.self_id for conn in live}) > 1:
            raise SendRejected("onebot: several accounts are connected and this message names none")
        return live[0]


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def peer_rejection(request: web.Request, token: str | None) -> web.Response | None:
    """Who may open a reverse socket, before the token check: 403 for a browser or an outsider.

    OneBot implementations (NapCat, Lagrange, LLOneBot) send no ``Origin``; a browser always
    does, so an upgrade carrying one is a web page trying to speak for the bot. With no access
    token configured only loopback peers are accepted.
    """
    if "Origin" in request.headers:
        return web.Response(status=403, text="browser origins are refused")
    if token is None and not _is_loopback(request.remote):
        return web.Response(status=403, text="set an access token to accept connections from other hosts")
    return None


def receipt_of(response: Mapping[str, Any], scope: str = "") -> SendReceipt:
    """A send action's answer as a receipt (its ``data.message_id``, when there is one); ``scope``
    (``"group:123:"``) goes before it, as before the ids of the messages received in that chat."""
    data = response.get("data")
    message_id = data.get("message_id") if isinstance(data, Mapping) else None
    return SendReceipt(platform_message_id=None if message_id is None else f"{scope}{message_id}")


def final(exc: OneBotActionFailed) -> bool:
    """A refusal sending again cannot mend (14xx: a wrong request); others (NapCat's 1200) may pass later."""
    return isinstance(exc.retcode, int) and 1400 <= exc.retcode < 1500


def wire_id(chat_id: str) -> int | str:
    """A chat id as OneBot takes it: QQ implementations expect numbers, bridges with textual ids
    (WeChat's wxid_...) strings."""
    if chat_id.isascii() and chat_id.isdigit() and (chat_id == "0" or not chat_id.startswith("0")):
        return int(chat_id)
    return chat_id


def check_response(action: str, response: Mapping[str, Any]) -> dict[str, Any]:
    """The response if the action succeeded, else :class:`OneBotActionFailed`.

    Success is ``status`` ``ok``/``async`` with ``retcode`` 0 or 1 (async), or no status and
    retcode 0. Lagrange reports some failed sends as ``status: "ok"`` with a non-zero retcode.
    """
    status, retcode = response.get("status"), response.get("retcode")
    ok_code = retcode is None or (isinstance(retcode, int) and not isinstance(retcode, bool) and retcode in (0, 1))
    if (status in ("ok", "async") and ok_code) or (status is None and retcode == 0):
        return dict(response)
    detail = response.get("wording") or response.get("message") or response.get("msg") or ""
    raise OneBotActionFailed(action, retcode, str(detail)[:200])


def role_for(request: web.Request, base_path: str) -> ClientRole | None:
    """The socket role: ``X-Client-Role`` if valid, else by path (``base``, ``base/api``,
    ``base/event``); ``None`` for a path that is not ours."""
    base = base_path.rstrip("/")
    path = request.path.rstrip("/")
    by_header = _ROLES.get(request.headers.get("X-Client-Role", "").strip().lower())
    by_path: dict[str, ClientRole] = {base: "Universal", f"{base}/api": "API", f"{base}/event": "Event"}
    if path not in by_path:
        return None
    return by_header or by_path[path]


class PendingActions:
    """Sends action frames and matches answers by a unique ``echo``."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[asyncio.Future[dict[str, Any]], Connection]] = {}
        self._late: OrderedDict[str, tuple[LateAnswer, Connection]] = OrderedDict()

    async def call(
        self, conn: Connection, action: str, params: Mapping[str, object], timeout_s: float,
        *, on_late: LateAnswer | None = None,
    ) -> dict[str, Any]:
        """Send one action on ``conn`` and return its successful response (see ``OneBotChannel.call_action``).

        After a timeout, an answer that still arrives for this echo goes to ``on_late``.
        """
        echo = secrets.token_hex(8)  # not guessable: another account's socket cannot answer for this one
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[echo] = (future, conn)
        frame = json.dumps({"action": action, "params": dict(params), "echo": echo}, ensure_ascii=False)
        try:
            try:
                async with conn.send_lock:
                    await conn.ws.send_str(frame)
            except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
                raise ChannelUnavailable(f"onebot: could not send {action!r}: {type(exc).__name__}") from exc
            try:
                async with asyncio.timeout(timeout_s):
                    response = await future
            except ChannelUnavailable as exc:  # (fail(): the socket closed) the frame went out: it may have acted
                raise ActionLost(f"onebot: the socket closed after {action!r} went out, before its answer: it may "
                                 "have happened (a message sent again, the chat may see it twice)") from exc
            except TimeoutError:
                if on_late is not None:
                    self._late[echo] = (on_late, conn)
                    while len(self._late) > _LATE_KEEP:
                        self._late.popitem(last=False)
                raise ActionTimeout(f"onebot: no answer to {action!r} within {timeout_s:g}s") from None
        finally:
            self._pending.pop(echo, None)
        return check_response(action, response)

    def resolve(self, frame: Mapping[str, Any], conn: Connection) -> bool:
        """Hand an answer that came on ``conn`` to its caller (or to ``on_late`` after a timeout) if
        the action went out on ``conn``; False if nobody there waits for it."""
        echo = str(frame.get("echo"))
        entry = self._pending.get(echo)
        if entry is None:
            late = self._late.get(echo)
            if late is None or late[1] is not conn:
                return False
            del self._late[echo]
            late[0](dict(frame))
            return True
        if entry[1] is not conn:  # another socket (another account) answering this one's action
            return False
        if not entry[0].done():
            entry[0].set_result(dict(frame))
        return True

    def fail(self, conn: Connection) -> None:
        """The socket closed: callers waiting on it fail now (:class:`ActionLost`: their frames were written)."""
        for future, owner in self._pending.values():
            if owner is conn and not future.done():
                future.set_exception(ChannelUnavailable("onebot: the socket closed before answering"))
