"""qunbot's bot core: messages, the bot, channels, plugins, config and the durable stores.

Plugins import what they need from here (``from robot import Bot, ChatRef, Plugin``); test seams
live in :mod:`robot.testing`.
"""

from robot.ask_user import AskUserArgs
from robot.bot import Bot
from robot.channels.base import (
    Capabilities,
    Channel,
    ChannelError,
    ChannelUnavailable,
    NotTaken,
    SendFailed,
    SendReceipt,
    SendRejected,
)
from robot.commands import CommandError, CommandLine, CommandSyntax, split_words
from robot.config import ConfigError, Settings, chat_key
from robot.config_file import load_settings
from robot.config_values import check_url
from robot.history import HistoryEntry, HistoryStore
from robot.hooks import ContextHook, ForgetHook, RunExtras
from robot.limits import BudgetExceeded, DailyBudget, Reservation
from robot.message import ChatKind, ChatRef, Message, OutgoingMessage, Role, Sender, group_key
from robot.outbox import Outbox
from robot.parked import KEEP
from robot.pipeline import reply_key
from robot.plugin import Plugin, PluginError, load_plugin
from robot.privacy import ForgetRequest, Forgetter, bytewise
from robot.storage.base import columns, in_chunks, unnest
from robot.store import Database, Engine, StorageError, Tx, iso, parse_iso, utcnow

__all__ = [
    "KEEP",
    "AskUserArgs",
    "Bot",
    "BudgetExceeded",
    "Capabilities",
    "Channel",
    "ChannelError",
    "ChannelUnavailable",
    "ChatKind",
    "ChatRef",
    "CommandError",
    "CommandLine",
    "CommandSyntax",
    "ConfigError",
    "ContextHook",
    "DailyBudget",
    "Database",
    "Engine",
    "ForgetHook",
    "ForgetRequest",
    "Forgetter",
    "HistoryEntry",
    "HistoryStore",
    "Message",
    "NotTaken",
    "Outbox",
    "OutgoingMessage",
    "Plugin",
    "PluginError",
    "Reservation",
    "Role",
    "RunExtras",
    "SendFailed",
    "SendReceipt",
    "SendRejected",
    "Sender",
    "Settings",
    "StorageError",
    "Tx",
    "bytewise",
    "chat_key",
    "check_url",
    "columns",
    "group_key",
    "in_chunks",
    "iso",
    "load_plugin",
    "load_settings",
    "parse_iso",
    "reply_key",
    "split_words",
    "unnest",
    "utcnow",
]
