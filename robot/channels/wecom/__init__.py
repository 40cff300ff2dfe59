"""WeCom (企业微信) channels.

* :class:`WeComChannel`: a self-built app (``mode="app"``), private chats, XML callbacks,
  replies through ``message/send``.
* :class:`WeComAIBotChannel`: the 智能机器人 (``mode="aibot"``), private and group chats,
  JSON callbacks, streamed passive replies.
* :class:`WeComWebhook` / :class:`WeComWebhookChannel`: a group-robot webhook, send only.

:func:`create_channel` picks the callback channel for ``settings.mode``.
"""

from __future__ import annotations

import aiohttp

from robot.channels.wecom.aibot import WeComAIBotChannel
from robot.channels.wecom.app import WeComChannel
from robot.channels.wecom.callback import WeComCallbackChannel
from robot.channels.wecom.crypto import WeComCrypto, WeComCryptoError
from robot.channels.wecom.settings import WeComSettings
from robot.channels.wecom.webhook import WeComWebhook, WeComWebhookChannel

__all__ = [
    "WeComAIBotChannel",
    "WeComCallbackChannel",
    "WeComChannel",
    "WeComCrypto",
    "WeComCryptoError",
    "WeComSettings",
    "WeComWebhook",
    "WeComWebhookChannel",
    "create_channel",
]


def create_channel(
    settings: WeComSettings, *, session: aiohttp.ClientSession | None = None
) -> WeComCallbackChannel:
    """The callback channel for ``settings.mode``: WeComChannel ("app") or WeComAIBotChannel ("aibot")."""
    if settings.mode == "aibot":
        return WeComAIBotChannel(settings, session=session)
    return WeComChannel(settings, session=session)
