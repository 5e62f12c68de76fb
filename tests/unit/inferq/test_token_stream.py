"""Token events: merging a job's deltas for one write, and their encoding in a stream."""

from __future__ import annotations

import json

from inferq.broker.token_stream import ChoiceDelta, JobDelta, RunStarted, coalesce, decode_entry
from inferq.domain.logprobs import TokenLogprob


def delta(job_id: str, *choices: ChoiceDelta) -> JobDelta:
    return JobDelta(job_id=job_id, choices=choices)


def piece(index: int, text: str, offset: int, *, finish: str | None = None) -> ChoiceDelta:
    logprobs = tuple(TokenLogprob(token=ch, logprob=-1.0) for ch in text)
    return ChoiceDelta(
        index=index,
        text=text,
        offset=offset,
        tokens=len(text),
        logprobs=logprobs,
        finish_reason=finish,
    )


def test_a_jobs_consecutive_deltas_become_one_per_choice() -> None:
    events = [
        delta("a", piece(0, "he", 0), piece(1, "x", 0)),
        delta("b", piece(0, "q", 0)),
        delta("a", piece(0, "llo", 2, finish="stop")),
        delta("a", piece(1, "yz", 1)),
    ]
    merged = coalesce(events)
    assert [e.job_id for e in merged] == ["a", "b"]
    first = merged[0]
    assert isinstance(first, JobDelta)
    zero, one = first.choices
    assert (zero.text, zero.offset, zero.tokens, zero.finish_reason) == ("hello", 0, 5, "stop")
    assert [lp.token for lp in zero.logprobs or ()] == list("hello")
    assert (one.text, one.offset, one.tokens, one.finish_reason) == ("xyz", 0, 3, None)


def test_a_run_start_is_never_merged_across() -> None:
    events = [
        delta("a", piece(0, "ab", 0)),
        RunStarted(job_id="a"),
        delta("a", piece(0, "c", 0)),
        delta("a", piece(0, "d", 1)),
    ]
    merged = coalesce(events)
    assert merged[1] == RunStarted(job_id="a")
    assert [c.text for e in merged if isinstance(e, JobDelta) for c in e.choices] == ["ab", "cd"]


def test_entries_decode_to_what_was_encoded() -> None:
    original = piece(2, "héllo", 7, finish="length")
    fields = {b"delta": json.dumps([original.to_dict()]).encode()}
    assert decode_entry(fields) == [original]
    assert decode_entry({b"start": b""}) is None
