"""`billed_usage`: what a call that ended without the provider's final count is billed (docs/billing.md)."""

from __future__ import annotations

from agentvm.domain.models import Usage
from agentvm.drivers.base import LLMRequest
from agentvm.drivers.token_bounds import billed_usage, worst_input_tokens

REQUEST = LLMRequest("gpt-4o-mini", [{"role": "user", "content": "What is the capital of France?"}],
                     system="Be brief.", max_tokens=50)


def test_a_final_report_is_billed_as_it_stands() -> None:
    assert billed_usage(Usage(0, 0), REQUEST, unreported_bytes=0, started=True, final=True) == (Usage(0, 0), False)
    assert billed_usage(Usage(12, 3), REQUEST, unreported_bytes=0, started=True, final=True) == (Usage(12, 3), False)


def test_a_started_call_without_any_input_count_bills_the_input_bound() -> None:
    bound = worst_input_tokens(REQUEST)
    assert bound == 57 + 11 + 16  # messages (their strings' bytes + 2 each, + 2 per list and dict), system, 16
    assert billed_usage(Usage(), REQUEST, unreported_bytes=0, started=True, final=False) == (Usage(bound, 0), True)
    # with the output streamed since the last count: a token per byte on top, at most max_tokens
    assert billed_usage(Usage(), REQUEST, unreported_bytes=11, started=True, final=False) == (Usage(bound, 11), True)
    assert billed_usage(Usage(0, 40), REQUEST, unreported_bytes=30, started=True, final=False) == \
        (Usage(bound, 50), True)


def test_an_input_count_already_reported_is_kept() -> None:
    assert billed_usage(Usage(7, 2), REQUEST, unreported_bytes=5, started=True, final=False) == (Usage(7, 7), True)
    cached = Usage(0, 0, cache_read_tokens=900)
    assert billed_usage(cached, REQUEST, unreported_bytes=0, started=True, final=False) == (cached, False)


def test_a_call_that_never_started_bills_nothing() -> None:
    # refused before the message started (an HTTP error, a connection that never answered): no input read
    assert billed_usage(Usage(), REQUEST, unreported_bytes=0, started=False, final=False) == (Usage(), False)
