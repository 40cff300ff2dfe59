"""Configuration of the personal-WeChat channel (``[channels.weixin]``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from robot.channels.weixin.api import DEFAULT_API_BASE

__all__ = ["WeixinSettings"]


class WeixinSettings(BaseModel):
    """Personal WeChat through the official iLink bot API.

    Accounts are not configured here: ``qunbot login weixin`` stores each one under
    ``<data_dir>/weixin``. ``accounts`` narrows which of them this process serves.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    api_base: str = Field(DEFAULT_API_BASE, description="where QR login starts; each account keeps its own baseurl")
    bot_type: str = Field("3", description="get_bot_qrcode's bot_type (the reference client's default)")
    accounts: list[str] = Field(default_factory=list, description="bot ids to serve; empty means every logged-in one")
    state_dir: Path | None = Field(None, description="default: <bot.data_dir>/weixin")
    poll_timeout_ms: int = Field(35_000, ge=1_000, description="until the server suggests its own")
    request_timeout: float = Field(15.0, gt=0)
    max_text_len: int = Field(4000, gt=0, description="the reference client's text chunk limit")
    typing: bool = Field(True, description="show 'typing' while the model runs (private chats)")
    typing_refresh_s: float = Field(5.0, gt=0)
    retry_delay_s: float = Field(2.0, gt=0, description="after a failed poll; doubles up to backoff_max_s")
    backoff_max_s: float = Field(30.0, gt=0)
    account_scan_s: float = Field(10.0, gt=0, description="how often to look for accounts logged in meanwhile")
    session_pause_s: float = Field(3600.0, gt=0, description="after errcode -14, unless the account logs in again")

    @field_validator("api_base")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")
