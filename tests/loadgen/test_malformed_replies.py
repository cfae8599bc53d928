"""A server whose replies are not shaped as the OpenAI API's: every call is a ``bad_response`` fault, never a
traceback and never a call counted as answered; an agent stopped by an error of apmw's own fails the run
instead of leaving its task counted as completed.

The broken servers are ``httpx.MockTransport`` handlers (a stand-in: no real server sends these replies; the real
server's faults are tests/loadgen/test_bench.py's). Each reply below made ``apmw bench`` print a traceback, or
exit 0 with "SLO met" over tasks of no calls, when fuzzing found them.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from apmw.loadgen import Client, RunConfig, slo_dict, workload_dict
from apmw.loadgen.results import ResultsWriter, read_records
from apmw.loadgen.runner import Run
from apmw.loadgen.text import CANDIDATE_WORDS, TextMaker
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict

GOOD = [{"choices": [{"text": "a"}]}, {"choices": [{"text": " b"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 4}}},
        {"choices": [], "timings": {"prompt_ms": 12.5, "predicted_per_token_ms": 3.0}}]


def _client(handler) -> Client:
    client = Client("http://broken.test:8000", "m")
    client.http = httpx.AsyncClient(base_url=client.base, transport=httpx.MockTransport(handler))
    return client


def _stream(messages: list) -> httpx.Response:
    body = "".join(f"data: {m if isinstance(m, str) else json.dumps(m)}\n\n" for m in messages) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


async def _call(messages: list):
    client = _client(lambda request: _stream(messages))
    try:
        return await client.call("hello", 2, "s-1")
    finally:
        await client.close()


def test_a_well_shaped_stream_is_read():
    res = asyncio.run(_call(GOOD))
    assert res.ok and res.text == "a b" and (res.prompt_tokens, res.output_tokens, res.cached_tokens) == (9, 2, 4)
    assert (res.server_prefill_s, res.server_tpot_s) == (0.0125, 0.003)


@pytest.mark.parametrize("message, said", [
    ("5", "not a JSON object"), ("[1, 2]", "not a JSON object"), ('"text"', "not a JSON object"),
    ("null", "not a JSON object"),
    ({"choices": "a"}, "choices is 'a', not a list"),
    ({"choices": ["a"]}, "a choice is 'a', not an object"),
    ({"choices": [{"delta": "a"}]}, "a choice's delta is 'a', not an object"),
    ({"choices": [{"text": 5}]}, "a choice's text is '5', not a string"),
    ({"usage": [1]}, "usage is '\\[1\\]', not an object"),
    ({"usage": {"prompt_tokens_details": [1]}}, "usage.prompt_tokens_details is"),
    ({"usage": {"completion_tokens": "7"}}, "usage.completion_tokens is '7', not a count of tokens"),
    ({"usage": {"prompt_tokens": -5}}, "usage.prompt_tokens is '-5'"),
    ({"usage": {"completion_tokens": 1e308}}, "usage.completion_tokens is '1e\\+308'"),
    ({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": "x"}}},
     "usage.prompt_tokens_details.cached_tokens is 'x'"),
    ({"timings": {"prompt_ms": "x"}}, "timings.prompt_ms is 'x', not a number of milliseconds"),
])
def test_a_message_not_shaped_as_the_api_s_is_a_bad_response(message, said):
    res = asyncio.run(_call([GOOD[0], message, *GOOD[1:]]))
    assert not res.ok and res.fault == "bad_response", res
    assert "not shaped as the OpenAI API's" in res.detail or "not a JSON object" in res.detail
    assert re.search(said, res.detail), res.detail


@pytest.mark.parametrize("reply", [{"tokens": [1, 2], "count": "abc"}, {"tokens": [1, 2], "count": float("nan")},
                                   {"tokens": 5}, {"tokens": [1], "count": -1}, {"tokens": [1], "count": True}])
def test_a_tokenize_reply_that_counts_nothing_is_no_tokenizer(reply):
    """The words' token counts fall back to one a word (``token_counts`` gives None), as without /tokenize."""
    client = _client(lambda request: httpx.Response(200, content=json.dumps(reply).encode()))

    async def counts():
        try:
            return await client.token_counts(["apple", "stone"])
        finally:
            await client.close()
    assert asyncio.run(counts()) is None


def test_an_agent_stopped_by_an_error_of_apmw_s_own_fails_the_run_and_its_task(tmp_path):
    """The task an exception ends is recorded as failed (it was recorded as completed, with no calls, and the
    summary said the SLO was met), and the run raises it rather than summarise what the agents left."""
    spec = spec_from_dict(small_spec_dict())
    cfg = RunConfig(endpoint="http://broken.test:8000", model="m", agents=2, duration_s=1.0, warmup_s=0.0, seed=3,
                    workload=workload_dict(spec), slo=slo_dict(spec), drain_s=1.0, stagger_s=0.0)
    client = _client(lambda request: httpx.Response(404))

    async def broken_call(*args, **kwargs):
        raise RuntimeError("a bug of apmw's own")
    client.call = broken_call  # type: ignore[method-assign]
    out = tmp_path / "results.jsonl"
    writer = ResultsWriter(out)

    async def run():
        try:
            await Run(cfg, client, TextMaker(list(CANDIDATE_WORDS), "assumed-one-token-per-word"), writer, 0).run()
        finally:
            writer.close()
            await client.close()
    with pytest.raises(RuntimeError, match="a bug of apmw's own"):
        asyncio.run(run())
    tasks = [r for r in read_records(out) if r["type"] == "task"]
    assert tasks and all(t["status"] == "failed" and t["fault"] == "internal_error" for t in tasks)
