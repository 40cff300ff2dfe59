"""The group-chat summary plugin: ``/summary`` and ``/forget me``.

Load it with ``plugins = ["summary"]`` (a default). ``summary`` summarises this chat since its
last summary (or the last N hours / N messages), map-reducing through the bot's model within
``[summary] max_request_tokens`` per call, or extractively when there is no model. ``forget``
deletes the caller's own stored messages in this chat and the bot's earlier summaries there
(they may quote them). ``[summary] retention_max_messages`` and
``retention_days`` set how long the bot keeps chat history (see :mod:`summary.settings`).
"""

from robot import Plugin
from summary.extractive import extractive_summary
from summary.mapreduce import MapReduceResult, SummaryFailed, map_reduce
from summary.settings import SummarySettings
from summary.tools import ForgetArgs, SummaryArgs, SummaryDeps, forget, setup, summary, toolset

__all__ = [
    "ForgetArgs",
    "MapReduceResult",
    "SummaryArgs",
    "SummaryDeps",
    "SummaryFailed",
    "SummarySettings",
    "extractive_summary",
    "forget",
    "map_reduce",
    "plugin",
    "setup",
    "summary",
    "toolset",
]

plugin: Plugin[SummaryDeps] = Plugin("summary", tools=toolset, setup=setup, settings_model=SummarySettings)
