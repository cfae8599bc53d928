"""NVIDIA AIPerf ``multi_turn`` custom-dataset JSONL: one conversation per line.

``{"session_id": "...", "turns": [{"input_length"|"text"|"texts"|"messages": ..,
"output_length": .., "delay": ms}, ...]}``. A turn carries only its *new* input
(AIPerf appends the history itself), so a call's prompt is the sum of earlier
turns' inputs and outputs plus its own. Text without counts is estimated (see
:mod:`apmw.traces.tokens`); a turn without ``output_length`` is skipped (the
output size is what the fit needs and the format does not record it otherwise). A later turn
without ``delay`` is sent at once (AIPerf's default, unless its run sets a turn delay), so its wait
is 0 ms, and a note counts them.
"""

from __future__ import annotations

from pathlib import Path

from apmw.traces.jsonl import convert_each
from apmw.traces.records import NAN, Call, CallStream, LineErrors, field_number, require_counts, session_key
from apmw.traces.tokens import estimate_text_tokens

NAME = "aiperf-multi-turn"
DESCRIPTION = "AIPerf multi_turn JSONL (session_id, turns[] with input_length or text, output_length, delay)"


def matches_record(obj: dict) -> bool:
    return isinstance(obj.get("turns"), list)


class Reader:
    def __init__(self) -> None:
        self.estimated_lines = 0
        self.undelayed_turns = 0                     # later turns without a delay, read as 0 ms
        self._lines_of: dict[object, int] = {}       # session id -> the line that gave it

    def _convert(self, line: int, obj: dict):
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError("'turns' must be a non-empty list")
        # a conversation without a session_id is its line's own, apart from any session_id a line gives
        session = session_key(obj.get("session_id"), "session_id")
        session = ("line", line) if session is None else session
        first = self._lines_of.setdefault(session, line)
        if first != line:
            raise ValueError(f"session_id {obj.get('session_id')!r} is the conversation of line {first} already: each "
                             "line is one whole conversation, so its turns would be read as that one's; give each "
                             "line its own session_id")
        context = 0.0
        calls = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise ValueError(f"turns[{k}] is not an object")
            new = field_number(turn, "input_length", where=f"turns[{k}].")
            if new != new:
                text = turn.get("messages", turn.get("texts", turn.get("text")))
                if text is not None:
                    new = estimate_text_tokens(text)
                    if new == 0:
                        raise ValueError(f"turns[{k}]: the prompt holds no text to count its tokens from "
                                         "(give input_length)")
                    self.estimated_lines += 1
            out = field_number(turn, "output_length", where=f"turns[{k}].")
            bad = require_counts(new, out)
            if bad:
                raise ValueError(f"turns[{k}]: {bad}")
            context += new
            delay_ms = field_number(turn, "delay", where=f"turns[{k}].")
            if k and delay_ms != delay_ms:      # AIPerf sends a later turn without a delay at once
                delay_ms = 0.0
                self.undelayed_turns += 1
            calls.append(Call(session, float(k), context, out, NAN, NAN, NAN, NAN,
                              delay_ms / 1e3 if k else NAN))
            context += out
        return calls

    def read(self, path: str | Path, errors: LineErrors) -> CallStream:
        return convert_each(path, errors, self._convert)
