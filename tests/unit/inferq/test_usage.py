"""Usage's arithmetic: UTC hours and days, buckets (every one listed, empty or not) and
groups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from inferq.domain.usage import Usage, UsageKey, bucket_starts, bucketed, day_of, hour_of

T0 = datetime(2026, 3, 1, 22, 30, tzinfo=UTC)


def test_hours_and_days_are_utc_whatever_the_zone_given() -> None:
    tokyo = T0.astimezone(timezone(timedelta(hours=9)))
    assert hour_of(tokyo) == datetime(2026, 3, 1, 22, tzinfo=UTC)
    assert day_of(tokyo) == datetime(2026, 3, 1, tzinfo=UTC)


def test_every_bucket_from_starts_day_to_before_end_is_listed() -> None:
    starts = bucket_starts(T0, T0 + timedelta(days=2), "1d")
    assert starts == [datetime(2026, 3, d, tzinfo=UTC) for d in (1, 2, 3)]
    # From the hour 22:30 falls in, to the one 01:30 falls in.
    assert len(bucket_starts(T0, T0 + timedelta(hours=3), "1h")) == 4


def test_rows_add_up_by_bucket_and_group() -> None:
    hour = hour_of(T0)
    rows = [
        (UsageKey("t", "k1", "a", hour), Usage(input_tokens=3, output_tokens=2, jobs=1)),
        (UsageKey("t", "k2", "a", hour + timedelta(hours=1)), Usage(output_tokens=5, jobs=1)),
        (UsageKey("t", "k1", "b", hour + timedelta(hours=2)), Usage(batch_lines=2)),  # next day
        (UsageKey("t", "k1", "a", hour - timedelta(days=5)), Usage(jobs=9)),  # not asked for
    ]
    starts = bucket_starts(T0, T0 + timedelta(days=2), "1d")
    days = bucketed(rows, starts, width="1d", group_by=())
    assert [len(d.results) for d in days] == [1, 1, 0]
    assert days[0].results[0].usage == Usage(input_tokens=3, output_tokens=7, jobs=2)
    assert days[1].results[0].usage == Usage(batch_lines=2)
    by_model = bucketed(rows, starts, width="1d", group_by=("model",))[0].results
    assert [(r.model, r.api_key_id, r.usage.requests) for r in by_model] == [
        ("a", None, 2),
    ]
    by_key = bucketed(rows, starts[:1], width="1d", group_by=("api_key_id", "model"))[0].results
    assert [(r.api_key_id, r.model) for r in by_key] == [("k1", "a"), ("k2", "a")]
