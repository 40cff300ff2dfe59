"""A summary's map-reduce held against the daily token budgets: the estimate is reserved first, and
each model call is charged as it ends (a summary cut short by its timeout is charged too). One the
model calls is also held to what its request has left (``ToolContext.allowance``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from function_calls import Allowance, Caller, ChatModel, Usage, estimate_tokens
from robot import BudgetExceeded, DailyBudget, HistoryEntry
from summary.mapreduce import MapReduceResult, SummaryUnaffordable, map_reduce
from summary.settings import PROMPT_ALLOWANCE, SummarySettings

__all__ = ["Reserved", "estimate_cost", "map_reduce_reserved"]

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


@dataclass
class Reserved:
    """A summary's map-reduce (None: not even its newest part was affordable) and whether the calling
    request's allowance, not the day's budget, bounded what it could spend."""

    done: MapReduceResult | None
    run_bound: bool = False


async def map_reduce_reserved(budget: DailyBudget | None, model: ChatModel, settings: SummarySettings, caller: Caller,
                              entries: Sequence[HistoryEntry], zone: ZoneInfo, where: str,
                              instructions: str | None, allowance: Allowance | None = None) -> Reserved:
    """:func:`map_reduce` with its estimated cost (or what is left today, then only the newest part that fits
    is summarised) held against the budgets first, and taken from ``allowance`` (what the request that
    called it has left of ``[llm] max_run_tokens``; the unspent part goes back to it)."""
    # A quarter more than the estimate, which can fall short of the real chunks (the unspent part goes
    # back at once); the hold is the ceiling whatever the estimate said (it once let 126k through 100k)
    estimate = estimate_cost(entries, settings, instructions) * 5 // 4
    taken = estimate if allowance is None else allowance.take(estimate)
    bound, spent = taken < estimate, [0]
    hold_spend: Callable[[Usage], None] | None = None

    def spend(usage: Usage) -> None:
        spent[0] += usage.total_tokens
        if hold_spend is not None:
            hold_spend(usage)

    try:
        if taken <= 0:
            return Reserved(None, bound)
        if budget is None:
            return Reserved(await map_reduce(entries, model, settings, zone=zone, where=where, instructions=instructions,
                                             token_budget=taken if bound else None, spend=spend), bound)
        async with budget.reserve(caller, taken, at_least=1) as hold:
            bound, hold_spend = bound and hold.held >= taken, hold.spend  # (else the day's room bounds it)
            done = await map_reduce(entries, model, settings, zone=zone, where=where, token_budget=hold.held,
                                    instructions=instructions, spend=spend)
            return Reserved(done, bound)
    except SummaryUnaffordable:
        return Reserved(None, bound)
    except BudgetExceeded as exc:
        log.info("summary for %s refused by the budget: %s", caller.qualified_user, exc)
        return Reserved(None)
    finally:
        if allowance is not None:  # cut short too: its calls in flight were charged as they were cut
            allowance.give_back(taken - spent[0])
