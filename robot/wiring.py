"""What a configuration opens: the built-in platforms (each imported only when enabled), and the model."""

from __future__ import annotations

from function_calls import ChatModel, OpenAIChatModel
from robot.channels.base import Channel
from robot.config import Settings

__all__ = ["build_channels", "build_model"]


def build_channels(settings: Settings) -> list[Channel]:
    """The channels enabled in config; none at all means the web playground."""
    cfg = settings.channels
    channels: list[Channel] = []
    if cfg.onebot.enabled:
        from robot.channels.onebot import OneBotChannel

        channels.append(OneBotChannel(cfg.onebot, bot_name=settings.bot.name))
    if cfg.wecom.enabled:
        from robot.channels.wecom import create_channel

        channels.append(create_channel(cfg.wecom))
    if cfg.wecom.webhook_key is not None:
        from robot.channels.wecom import WeComWebhookChannel

        channels.append(WeComWebhookChannel.from_settings(cfg.wecom))
    if cfg.console.enabled:
        from robot.channels.console import ConsoleChannel

        channels.append(ConsoleChannel(bot_name=settings.bot.name))
    if cfg.weixin.enabled:
        from robot.channels.weixin import WeixinChannel

        weixin = WeixinChannel(cfg.weixin, settings.bot.data_dir)
        channels.append(weixin)
    if cfg.telegram.enabled:
        from robot.channels.telegram import TelegramChannel

        channels.append(TelegramChannel(cfg.telegram, settings.bot.data_dir))
    if cfg.web.enabled or not channels:
        from robot.channels.web import WebChannel
        from robot.channels.web.protocol import is_loopback

        playground = WebChannel(cfg.web, bot_name=settings.bot.name, max_message_chars=settings.limits.max_message_chars)
        channels.append(playground)
        # Binding a WeChat account is the owner's act: only a loopback playground offers the login page.
        if cfg.weixin.enabled and is_loopback(cfg.web.host):
            from robot.channels.weixin.web_login import login_app

            # The channel's own state: where the bot attaches its database, a login lands there too.
            playground.mount("/weixin", lambda: login_app(cfg.weixin, weixin.state))
    return channels


def build_model(settings: Settings) -> ChatModel | None:
    """The configured OpenAI-compatible model; None when ``[llm]`` names none."""
    llm = settings.llm
    if not llm.configured or llm.model is None:
        return None
    return OpenAIChatModel(model=llm.model, base_url=llm.base_url,
                           api_key=llm.api_key.get_secret_value() if llm.api_key else None,
                           temperature=llm.temperature, timeout_s=llm.timeout_s, stream=llm.stream,
                           strict_tools=llm.strict_tools, reasoning_pass_back=llm.reasoning_pass_back,
                           token_param=llm.token_param)
