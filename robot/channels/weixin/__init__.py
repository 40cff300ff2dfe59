"""Personal WeChat (个人微信) through the official iLink bot API ("ClawBot").

* :class:`WeixinChannel`: long-polls every logged-in account, replies with the chat's
  latest ``context_token``, shows "typing" while the model works.
* :func:`login`: the QR login behind ``qunbot login weixin``.
* :class:`WeixinApi`: the HTTP client; :mod:`robot.channels.weixin.testing` has a fake server.
"""

from __future__ import annotations

from robot.channels.weixin.api import SessionExpired, WeixinApi, WeixinApiError, WeixinError, WeixinHTTPError
from robot.channels.weixin.channel import WeixinChannel
from robot.channels.weixin.convert import flatten_markdown, to_message
from robot.channels.weixin.login import LoginFailed, login
from robot.channels.weixin.settings import WeixinSettings
from robot.channels.weixin.state import WeixinAccount, WeixinState

__all__ = [
    "LoginFailed",
    "SessionExpired",
    "WeixinAccount",
    "WeixinApi",
    "WeixinApiError",
    "WeixinChannel",
    "WeixinError",
    "WeixinHTTPError",
    "WeixinSettings",
    "WeixinState",
    "flatten_markdown",
    "login",
    "to_message",
]
