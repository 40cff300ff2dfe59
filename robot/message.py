"""Platform-neutral messages: what channels produce and what the outbox sends."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from function_calls import Caller
from function_calls.problems import mend_text

__all__ = ["ChatKind", "ChatRef", "Message", "OutgoingMessage", "Role", "Sender", "chat_moved", "group_key"]

ChatKind = Literal["group", "private"]
#: Text as UTF-8 can carry it: a peer's lone surrogate (half an emoji) becomes U+FFFD at the boundary,
#: so the database, the model's request and the platform's send all take it.
Text = Annotated[str, AfterValidator(mend_text)]
Role = Literal["owner", "admin", "member"]


def group_key(key: str) -> str:
    """The key of the group a thread's chat is part of: a group chat id ``<group>/<thread>`` (a Telegram
    forum topic, ``telegram:group:-100900/42``) gives ``telegram:group:-100900``; any other key is its own.
    What an owner sets for a group (the gate, zones, daily budgets, rate limits) holds in all its topics,
    while each topic keeps its own history and replies."""
    platform, _, rest = key.partition(":")
    kind, _, chat_id = rest.partition(":")
    base, slash, thread = chat_id.partition("/")
    return f"{platform}:{kind}:{base}" if kind == "group" and slash and base and thread else key


#: Chats the platform gave a new id (new key -> old key: a Telegram group become a supergroup), so that what
#: an owner set for the old id (the gate's lists, zones, summary prompts) still holds (see ChatRef.setting_names).
_FORMER: dict[str, str] = {}


#: setting_names by chat key: asked several times a message (the gate's lists, zones), the same until a move.
_NAMES: dict[str, tuple[str, ...]] = {}


def chat_moved(old_key: str, new_key: str) -> None:
    """Record that the chat ``old_key`` is now ``new_key`` (robot.Bot.move_chat does, and at start)."""
    if old_key != new_key:
        _FORMER[new_key] = old_key
        _NAMES.clear()


class ChatRef(BaseModel):
    """Which chat: the platform, its id there, and whether it is a group or a private chat.

    ``account`` is the bot identity that received or owns the conversation (OneBot ``self_id``);
    ``""`` when the platform has one account. It is not part of :attr:`key`: the chat is the same
    whichever account speaks in it, but replies leave through the account that owns it.
    """

    model_config = ConfigDict(frozen=True)

    platform: str
    chat_id: str
    kind: ChatKind
    account: str = ""

    @property
    def key(self) -> str:
        """A stable string key, e.g. ``onebot:group:123456``."""
        return f"{self.platform}:{self.kind}:{self.chat_id}"

    @property
    def group_key(self) -> str:
        """:func:`group_key` of :attr:`key`: the whole group's, for a thread of one."""
        return group_key(self.key)

    @property
    def setting_names(self) -> tuple[str, ...]:
        """The names a per-chat setting may give this chat, the most specific first: its key, ``platform:id``
        (any chat of that id), those of its former ids (:func:`chat_moved`), then the same of the group it is a
        forum topic of."""
        me = f"{self.platform}:{self.kind}:{self.chat_id}"
        known = _NAMES.get(me)
        if known is not None:
            return known
        names: list[str] = []
        for key in (me, group_key(me)):
            for _ in range(8):  # (the old id's setting after the new one's; a chain of moves, never a loop)
                names += [key, f"{self.platform}:{key.split(':', 2)[2]}"]
                if (key := _FORMER.get(key, "")) == "":
                    break
        if len(_NAMES) >= 10_000:  # a bound, not a policy
            _NAMES.clear()
        found = _NAMES[me] = tuple(dict.fromkeys(names))
        return found

    @classmethod
    def of(cls, caller: Caller) -> ChatRef:
        """The chat a tool call comes from."""
        return cls(platform=caller.platform, chat_id=caller.chat_id, kind=caller.chat_kind,
                   account=caller.account)

    @classmethod
    def from_key(cls, key: str, account: str = "") -> ChatRef:
        """The inverse of :attr:`key`; the key has no account, so pass the stored one."""
        platform, kind, chat_id = key.split(":", 2)
        if kind not in ("group", "private"):
            raise ValueError(f"bad chat key {key!r}")
        return cls(platform=platform, chat_id=chat_id, kind=kind, account=account)


class Sender(BaseModel):
    """Who wrote a message. ``user_id`` is the platform's id; the display name is only a label."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    name: Text = ""
    role: Role = "member"
    #: An anonymous group member (QQ 匿名): ``user_id`` keys the anonymous identity, it is nobody's
    #: account, so it is never @-ed and owns nothing that outlives the conversation (reminders).
    anonymous: bool = False


class Message(BaseModel):
    """One incoming (or recorded outgoing) chat message."""

    model_config = ConfigDict(frozen=True)

    chat: ChatRef
    sender: Sender
    message_id: str
    text: Text = Field(description="plain text with the mentions of the bot stripped")
    timestamp: AwareDatetime
    mentions: tuple[str, ...] = ()
    mentions_bot: bool = False
    reply_to: str | None = None
    reply_to_bot: bool = False
    from_bot: bool = False
    raw: dict[str, object] | None = None

    @property
    def platform(self) -> str:
        return self.chat.platform

    @property
    def qualified_sender(self) -> str:
        """``platform:user_id``, the form admins are configured in."""
        return f"{self.chat.platform}:{self.sender.user_id}"


class OutgoingMessage(BaseModel):
    """A reply or notification waiting in the outbox. ``key`` makes a send idempotent."""

    model_config = ConfigDict(frozen=True)

    key: str
    chat: ChatRef
    text: Text
    mention: tuple[str, ...] = Field(default=(), description="user ids to @ (groups only)")
    reply_to: str | None = None
    #: The user id a message is about when it @s others (an approver's notice quoting a request):
    #: recorded as the history row's ``to_user``, so that person's ``/forget me`` takes it.
    about: str | None = None
    created_at: AwareDatetime | None = None
    #: Appended if it goes out more than :data:`robot.outbox_store.LATE` after it was queued, none of it sent
    #: before (a reminder queued while its channel was down: "（迟到提醒：原定 12:10）").
    late_note: str = ""
