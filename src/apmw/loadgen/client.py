"""One streamed call to an OpenAI-compatible endpoint, timed token by token, faults classified.

Timing: ``ttft_s`` is the wall time from sending the request to the first streamed chunk that
carries text; ``tpot_s`` is (last text chunk - first text chunk) / (output tokens - 1), the usual
definition (vLLM benchmark_serving, GenAI-Perf). Output and prompt token counts come from the
server's ``usage`` (``stream_options.include_usage``); where a server sends none the counted
text chunks stand in and ``usage_reported`` is false.

Faults never raise out of :meth:`Client.call`: they come back as a :class:`CallResult` whose
``fault`` names the kind, so the run keeps going and the summary counts them.
"""

from __future__ import annotations

from urllib.parse import urlsplit
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from apmw.errors import ApmwError

FAULT_KINDS = ("rate_limit", "server_error", "client_error", "timeout", "connect_error", "dropped_connection",
               "bad_response")


class BenchError(ApmwError):
    """A bench that cannot start or continue (bad endpoint, bad results file, bad flags)."""


@dataclass
class CallResult:
    ok: bool
    fault: str | None = None          # one of FAULT_KINDS when not ok
    detail: str = ""
    status: int | None = None
    start_s: float = 0.0              # time.monotonic() offsets from the run start, filled by the caller
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    usage_reported: bool = False
    server_prefill_s: float | None = None    # llama.cpp's own "timings" (prompt_ms), where the server sends them
    server_tpot_s: float | None = None       # llama.cpp "timings.predicted_per_token_ms"
    # when each streamed text chunk arrived, seconds after the request was sent (0.1 ms resolution in the
    # record): the engine's iterations as the call saw them (apmw.loadgen.loop_steps)
    token_times_s: list[float] = field(default_factory=list, repr=False)
    text: str = field(default="", repr=False)

    def record(self) -> dict:
        d = asdict(self)
        d.pop("text")
        d["token_times_s"] = [round(t, 4) for t in self.token_times_s]
        return d


def normalise_endpoint(endpoint: str) -> str:
    """``http://host:port`` from ``http://host:port``, ``.../v1`` or ``.../v1/``."""
    e = endpoint.rstrip("/")
    if not e.startswith(("http://", "https://")):
        raise BenchError(f"--endpoint {endpoint!r}: give a URL such as http://127.0.0.1:8000 (with http:// or https://)")
    try:
        url = urlsplit(e)              # an unclosed or invalid bracketed IPv6 host
    except ValueError as exc:
        raise BenchError(f"--endpoint {endpoint!r}: {exc}; give a host name or an IPv4 address, or an IPv6 one "
                         "in brackets, e.g. http://[::1]:8000") from None
    try:
        port, host = url.port, url.hostname
    except ValueError as exc:          # a port that is not a number, or past 65535
        raise BenchError(f"--endpoint {endpoint!r}: {exc}; give a port from 1 to 65535, e.g. http://127.0.0.1:8000") from None
    if url.username is not None or url.password is not None:
        shown = url._replace(netloc=f"***@{url.netloc.rpartition('@')[2]}").geturl()
        raise BenchError(f"--endpoint {shown}: a name or password in the URL would be written to the results file "
                         "and shown in messages; give the server's key in an environment variable instead "
                         "(--api-key-env, OPENAI_API_KEY unless set)")
    if not host or port == 0:
        raise BenchError(f"--endpoint {endpoint!r}: give a host and a port from 1 to 65535, e.g. http://127.0.0.1:8000")
    return e[:-3] if e.endswith("/v1") else e


class Client:
    """An httpx client bound to one endpoint, model and API flavour (completions or chat)."""

    def __init__(self, endpoint: str, model: str, api: str = "completions", api_key: str | None = None,
                 timeout_s: float = 60.0, ignore_eos: bool = True, max_connections: int = 64):
        self.base = normalise_endpoint(endpoint)
        self.model, self.api, self.ignore_eos, self.timeout_s = model, api, ignore_eos, timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            base_url=self.base, headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def close(self) -> None:
        await self.http.aclose()

    async def token_counts(self, words: list[str]) -> dict[str, int] | None:
        """Tokens that ``" word"`` adds mid-text, per word, via ``/tokenize``; None without that endpoint.

        Measured as tokens(" w w") - tokens(" w"): SentencePiece tokenizers prefix a space to the
        whole text, which would count an extra token for a word at the very start.
        """
        counts = {}
        for w in words:
            one = await self._tokenize(" " + w)
            if one is None:
                return None
            counts[w] = await self._tokenize(f" {w} {w}") - one
        return counts

    async def _tokenize(self, text: str) -> int | None:
        try:
            r = await self.http.post("/tokenize", json={"content": text, "prompt": text, "model": self.model,
                                                        "add_special": False, "add_special_tokens": False})
        except httpx.HTTPError as exc:
            raise BenchError(f"cannot reach {self.base}/tokenize: {exc!r} -- is the server up?") from None
        if r.status_code != 200:
            return None
        try:
            body = r.json()
        except ValueError:
            return None
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list):
            return None                 # no token list: this server does not tokenize the way apmw reads it
        count = body.get("count", len(tokens))
        return count if _token_count(count) else None

    def _body(self, prompt: str | list[dict], max_tokens: int) -> tuple[str, dict]:
        body = {"model": self.model, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            # vLLM, SGLang and llama.cpp honour ignore_eos (and vLLM min_tokens): output is max_tokens long
            body.update(ignore_eos=True, min_tokens=max_tokens)
        if self.api == "chat":
            return "/v1/chat/completions", {**body, "messages": prompt}
        return "/v1/completions", {**body, "prompt": prompt}

    async def call(self, prompt: str | list[dict], max_tokens: int, session_id: str) -> CallResult:
        """Send one streamed request; never raises for a server or network fault."""
        path, body = self._body(prompt, max_tokens)
        t0 = time.monotonic()
        res = CallResult(ok=False)
        try:
            async with asyncio.timeout(self.timeout_s):    # the whole call, not each read
                async with self.http.stream("POST", path, json=body,
                                            headers={"X-Session-Affinity": session_id}) as r:
                    res.status = r.status_code
                    if r.status_code != 200:
                        await r.aread()
                        return _http_fault(res, r, t0)
                    await _read_stream(r, res, t0)
        except (httpx.TimeoutException, TimeoutError) as exc:
            _fault(res, "timeout", f"no complete answer within {self.timeout_s:g} s ({exc!r})", t0)
        except httpx.ConnectError as exc:
            _fault(res, "connect_error", repr(exc), t0)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.NetworkError) as exc:
            _fault(res, "dropped_connection", repr(exc), t0)
        return res


def _fault(res: CallResult, kind: str, detail: str, t0: float) -> CallResult:
    res.ok, res.fault, res.detail = False, kind, detail[:300]
    res.latency_s = time.monotonic() - t0
    return res


def _http_fault(res: CallResult, r: httpx.Response, t0: float) -> CallResult:
    code = r.status_code
    kind = "rate_limit" if code == 429 else "server_error" if code >= 500 else "client_error"
    return _fault(res, kind, f"HTTP {code}: {r.text[:200]}", t0)


class _Malformed(Exception):
    """A stream message that is not shaped as the OpenAI API's (a server fault, counted as ``bad_response``)."""


# The most tokens a usage count may say (2**53: a float still counts them exactly); past it, or negative, or not a
# whole number, the server's count is not one.
MAX_TOKEN_COUNT = 2**53


def _token_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_COUNT


def _mapping(value: object, what: str) -> dict:
    """``value`` where the API writes an object (None as empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is {str(value)[:60]!r}, not an object")
    return value


def _count(usage: dict, key: str, what: str) -> int | None:
    value = usage.get(key)
    if value is not None and not _token_count(value):
        raise _Malformed(f"{what}.{key} is {str(value)[:60]!r}, not a count of tokens")
    return value


def _milliseconds(timings: dict, key: str) -> float | None:
    value = timings.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise _Malformed(f"timings.{key} is {str(value)[:60]!r}, not a number of milliseconds")
    return value / 1e3


def _text_pieces(msg: dict) -> list[str]:
    """The text each choice of a stream message carries (completions' ``text``, chat's ``delta.content``)."""
    choices = msg.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list):
        raise _Malformed(f"choices is {str(choices)[:60]!r}, not a list")
    pieces = []
    for choice in choices:
        choice = _mapping(choice, "a choice")
        piece = choice.get("text") or _mapping(choice.get("delta"), "a choice's delta").get("content") or ""
        if not isinstance(piece, str):
            raise _Malformed(f"a choice's text is {str(piece)[:60]!r}, not a string")
        pieces.append(piece)
    return pieces


def _read_usage(msg: dict, res: CallResult) -> None:
    usage = _mapping(msg.get("usage"), "usage")
    if usage:
        res.usage_reported = True
        res.prompt_tokens = _count(usage, "prompt_tokens", "usage")
        res.output_tokens = _count(usage, "completion_tokens", "usage")
        details = _mapping(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details")
        res.cached_tokens = _count(details, "cached_tokens", "usage.prompt_tokens_details")
    timings = msg.get("timings")
    if isinstance(timings, dict):         # llama.cpp's own; any other server may send anything under the name
        prefill_s, tpot_s = _milliseconds(timings, "prompt_ms"), _milliseconds(timings, "predicted_per_token_ms")
        res.server_prefill_s = res.server_prefill_s if prefill_s is None else prefill_s
        res.server_tpot_s = res.server_tpot_s if tpot_s is None else tpot_s


async def _read_stream(r: httpx.Response, res: CallResult, t0: float) -> None:
    first = last = None
    chunks, parts, done = 0, [], False
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            msg = json.loads(data)
        except json.JSONDecodeError:
            _fault(res, "bad_response", f"unparseable stream line: {data[:120]}", t0)
            return
        if not isinstance(msg, dict):
            _fault(res, "bad_response", f"a stream message is not a JSON object: {data[:120]}", t0)
            return
        if "error" in msg:
            _fault(res, "server_error", f"error in stream: {str(msg['error'])[:200]}", t0)
            return
        try:
            pieces = _text_pieces(msg)
            _read_usage(msg, res)
        except _Malformed as exc:
            _fault(res, "bad_response", f"a stream message is not shaped as the OpenAI API's: {exc}", t0)
            return
        for piece in pieces:
            if piece:
                now = time.monotonic()
                first = first if first is not None else now
                last = now
                chunks += 1
                parts.append(piece)
                res.token_times_s.append(now - t0)
    if not done:
        _fault(res, "dropped_connection", "stream ended before [DONE]", t0)
        return
    res.latency_s = time.monotonic() - t0
    res.text = "".join(parts)
    if first is None:
        _fault(res, "bad_response", "the stream carried no text", t0)
        return
    if res.output_tokens is None:
        res.output_tokens = chunks
    res.ok = True
    res.ttft_s = first - t0
    n = res.output_tokens or chunks
    res.tpot_s = (last - first) / (n - 1) if n > 1 else None


async def wait_ready(endpoint: str, timeout_s: float = 30.0) -> None:
    """Poll ``/v1/models`` until the server answers (used by tests and calibration)."""
    base = normalise_endpoint(endpoint)
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base, timeout=2.0) as http:
        while True:
            try:
                if (await http.get("/v1/models")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"{base} did not answer /v1/models within {timeout_s:g} s")
            await asyncio.sleep(0.1)
