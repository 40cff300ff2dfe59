"""A summary's map-reduce held against the daily token budgets: the estimate is reserved first, and
each model call is charged as it ends (a summary cut short by its timeout is charged too)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from function_calls import Caller, ChatModel, estimate_tokens
from robot import BudgetExceeded, DailyBudget, HistoryEntry
from summary.mapreduce import MapReduceResult, map_reduce
from summary.settings import PROMPT_ALLOWANCE, SummarySettings

__all__ = ["estimate_cost", "map_reduce_reserved"]

log = logging.getLogger(__name__)


def estimate_cost(entries: Sequence[HistoryEntry], settings: SummarySettings, instructions: str | None = None) -> int:
    """About the most a map-reduce over ``entries`` spends: full requests, every answer at its cap;
    each line with its speaker's name and id, each request with the owner's ``instructions``."""
    cap, out_cap, final_cap = settings.max_request_tokens, settings.chunk_output_tokens, settings.summary_output_tokens
    prompt = PROMPT_ALLOWANCE + (estimate_tokens(instructions) + 40 if instructions else 0)
    room = max(1, cap - prompt)
    text = sum(min(estimate_tokens(e.text), settings.max_message_tokens) + 12
               + estimate_tokens(f"{e.name}{e.user_id}") for e in entries)
    chunks = min(settings.max_chunks, max(1, math.ceil(text / room)))
    if chunks == 1:
        return min(cap, text + prompt) + final_cap
    cost, pieces = chunks * (cap + out_cap), chunks
    while True:  # reduce rounds: each merge request holds pieces of at most out_cap tokens
        groups = min(math.ceil(pieces * out_cap / room), (pieces + 1) // 2)
        if groups <= 1:
            return cost + min(cap, pieces * out_cap + prompt) + final_cap
        cost, pieces = cost + groups * (cap + out_cap), groups


async def map_reduce_reserved(budget: DailyBudget | None, model: ChatModel, settings: SummarySettings, caller: Caller,
                              entries: Sequence[HistoryEntry], zone: ZoneInfo, where: str,
                              instructions: str | None) -> MapReduceResult | None:
    """:func:`map_reduce` with its estimated cost (or what is left today, then only the newest part that fits
    is summarised) held against the budgets first; None when not even a part fits."""
    if budget is None:
        return await map_reduce(entries, model, settings, zone=zone, where=where, instructions=instructions)
    # A quarter more than the estimate, which can fall short of the real chunks (the unspent part goes
    # back at once); the hold is the ceiling whatever the estimate said (it once let 126k through 100k)
    estimate = estimate_cost(entries, settings, instructions) * 5 // 4
    try:
        async with budget.reserve(caller, estimate, at_least=1) as hold:
            return await map_reduce(entries, model, settings, zone=zone, where=where, token_budget=hold.held,
                                    instructions=instructions, spend=hold.spend)
    except BudgetExceeded as exc:
        log.info("summary for %s refused by the budget: %s", caller.qualified_user, exc)
        return None
