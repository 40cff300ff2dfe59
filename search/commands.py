"""``/search``'s own command syntax: the whole line is the question, as typed.

The generic ``/command`` reading fills a field after a text field with any word that fits it, so
``/search how many hours in a day`` asked "how many hours in a" of the last day's pages. Here the
recency filter is set by name only (``recency=week``, anywhere in the line).
"""

from __future__ import annotations

import re
from typing import Any

from robot import CommandLine, CommandSyntax

__all__ = ["SEARCH_SYNTAX", "search_command"]

_RECENCY = re.compile(r"(?:^|\s)recency=(\S*)(?=\s|$)")


def search_command(line: CommandLine) -> dict[str, Any]:
    """``/search <question…> [recency=hour|day|week|month|year]`` → the tool's arguments."""
    args: dict[str, Any] = {}
    found = list(_RECENCY.finditer(line.rest))
    if found:
        args["recency"] = found[-1][1]  # (an invalid value is answered by the arguments' validation)
    query = _RECENCY.sub(" ", line.rest).strip()
    if query:
        args["query"] = query
    return args


SEARCH_SYNTAX = CommandSyntax(parse=search_command, usage="/search <问题> [recency=hour|day|week|month|year]")
