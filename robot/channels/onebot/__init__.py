"""OneBot v11 channel (NapCat, Lagrange, LLOneBot, WeChat bridges) and its test peer."""

from robot.channels.onebot.channel import OneBotChannel
from robot.channels.onebot.connection import (
    ActionTimeout,
    ClientRole,
    Connection,
    OneBotActionFailed,
    PendingActions,
    Sockets,
    auth_rejection,
    check_response,
    peer_rejection,
    role_for,
)
from robot.channels.onebot.cq import (
    CQCodeError,
    Segment,
    at_targets,
    compose_message,
    escape,
    parse_cq,
    parse_message,
    parse_segments,
    placeholder,
    plain_text,
    reply_id,
    to_array,
    to_cq,
    unescape,
)
from robot.channels.onebot.events import message_from_event
from robot.channels.onebot.settings import OneBotSettings
from robot.channels.onebot.testing import OneBotTestPeer

__all__ = [
    "ActionTimeout",
    "CQCodeError",
    "ClientRole",
    "Connection",
    "OneBotActionFailed",
    "OneBotChannel",
    "OneBotSettings",
    "OneBotTestPeer",
    "PendingActions",
    "Segment",
    "Sockets",
    "at_targets",
    "auth_rejection",
    "check_response",
    "compose_message",
    "escape",
    "message_from_event",
    "parse_cq",
    "parse_message",
    "parse_segments",
    "peer_rejection",
    "placeholder",
    "plain_text",
    "reply_id",
    "role_for",
    "to_array",
    "to_cq",
    "unescape",
]
