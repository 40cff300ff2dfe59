"""The group-chat summary plugin: ``/summary``.

Load it with ``plugins = ["summary"]`` (a default). ``summary`` summarises this chat since its
last summary (or the last N hours / N messages), map-reducing through the bot's model within
``[summary] max_request_tokens`` per call, or extractively when there is no model. On
``/forget me`` (core) the bot's earlier summaries in the chat go too: they may quote the person.
How long chat history is kept is the core's ``[history]`` table.
"""

from robot import Plugin
from summary.extractive import extractive_summary
from summary.mapreduce import MapReduceResult, SummaryFailed, map_reduce
from summary.settings import SummarySettings
from summary.tools import SummaryArgs, SummaryDeps, setup, summary, toolset

__all__ = [
    "MapReduceResult",
    "SummaryArgs",
    "SummaryDeps",
    "SummaryFailed",
    "SummarySettings",
    "extractive_summary",
    "map_reduce",
    "plugin",
    "setup",
    "summary",
    "toolset",
]

plugin: Plugin[SummaryDeps] = Plugin("summary", tools=toolset, setup=setup, settings_model=SummarySettings)
