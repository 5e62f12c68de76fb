"""A batch's output: its output and error files made once every line has ended, read as
they are made (results rendered on the fly), and read in part while the batch runs."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from inferq.domain.batches import Batch, FilePurpose, ResultRow, StoredFile
from inferq.domain.jobs import JobStatus
from inferq.store.batches import BatchStore
from inferq.store.files import FileSize, FileStore
from inferq.wire.batch_output import needs_extras, render


@dataclass(frozen=True, kw_only=True)
class PartialOutput:
    """Rendered `lines` of a batch that have ended since a cursor; every line up to
    `cursor` has ended and is covered (ask again after it); `ended`: so has every line."""

    cursor: int
    ended: bool
    lines: Iterator[bytes]


@dataclass(frozen=True, kw_only=True)
class OutputPart:
    """Rendered lines of a batch (each with its number) that have ended since a cursor, as
    `PartialOutput` but at most a given number: `more` says whether lines that have ended
    were left for the next read; `ended`, whether every line has (and has been read)."""

    cursor: int
    ended: bool
    more: bool
    lines: list[tuple[int, bytes]]


class BatchOutput:
    def __init__(self, *, files: FileStore, batches: BatchStore) -> None:
        self._files = files
        self._batches = batches

    def finalize(self, batch_id: str) -> Batch | None:
        """If every line has ended: record the output and error files and end the batch.
        Nothing is rendered: the files' sizes are measured after (`measure`), so a batch
        ends as its last line does, whatever its size."""
        batch = self._batches.start_finalizing(batch_id)
        if batch is None:
            return None
        succeeded, others = self._batches.ended_lines(batch_id)
        return self._batches.finish_finalizing(
            batch_id, output=FileSize(None, succeeded), errors=FileSize(None, others)
        )

    def measure(self, batch: Batch) -> None:
        """Measure an ended batch's output and error files, those not measured yet."""
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is not None:
                self.measured(self._files.get(file_id))

    def measured(self, file: StoredFile) -> StoredFile:
        """`file` with its size: a batch's output or error file not measured yet is
        rendered to measure it, and its size recorded."""
        if file.bytes is not None:
            return file
        size = sum(len(chunk) for chunk in self.content(file))
        self._files.set_size(file.id, size)
        return dataclasses.replace(file, bytes=size)

    def content(self, file: StoredFile) -> Iterator[bytes]:
        """A file's bytes, streamed: stored chunks, or a batch's results rendered now."""
        if file.purpose is FilePurpose.BATCH or file.batch_id is None:
            return self._files.chunks(file.id)
        batch = self._batches.get(file.batch_id)
        return self._rendered(batch, errors=file.id == batch.error_file_id)

    def partial_output(self, batch: Batch, *, after: int, include_errors: bool) -> PartialOutput:
        """The lines numbered after `after` that have ended, up to the first still queued
        or running, rendered as in the batch's output file (and, with `include_errors`,
        its error file, interleaved in input order). Lines never come back to queued once
        ended, so going on from the cursor neither misses nor repeats one."""
        first_active = self._batches.first_active_line(batch.id, after=after)
        if first_active is None:
            cursor = max(after, self._batches.last_line(batch.id) or 0)
        else:
            cursor = max(after, first_active - 1)
        rows = self._batches.results(
            batch.id,
            errors=None if include_errors else False,
            after=after,
            before=first_active,
            extras=needs_extras(batch.endpoint),
        )
        return PartialOutput(
            cursor=cursor,
            ended=first_active is None,
            lines=_interleaved(rows, endpoint=batch.endpoint),
        )

    def part(self, batch: Batch, *, after: int, include_errors: bool, limit: int) -> OutputPart:
        """What `partial_output` gives, read at once and cut to the `limit` lines after
        `after`, each rendered with its line number."""
        first_active = self._batches.first_active_line(batch.id, after=after)
        last = self._batches.last_line(batch.id) if first_active is None else None
        end = first_active if first_active is not None else (last or 0) + 1
        before = min(end, after + limit + 1)
        rows = self._batches.results(
            batch.id,
            errors=None if include_errors else False,
            after=after,
            before=before,
            extras=needs_extras(batch.endpoint),
        )
        lines = [(row.line, b"".join(_interleaved([row], endpoint=batch.endpoint))) for row in rows]
        return OutputPart(
            cursor=max(after, before - 1),
            ended=first_active is None and before == end,
            more=before < end,
            lines=lines,
        )

    def _rendered(self, batch: Batch, *, errors: bool) -> Iterator[bytes]:
        """The batch's output file (or, with `errors`, its error file), made from its
        results."""
        return render(
            self._batches.results(batch.id, errors=errors, extras=needs_extras(batch.endpoint)),
            errors=errors,
            endpoint=batch.endpoint,
        )


def _interleaved(rows: Iterable[ResultRow], *, endpoint: str) -> Iterator[bytes]:
    """Succeeded lines as in an output file, the others as in an error file."""
    for failed, run in itertools.groupby(rows, key=lambda row: row.status != JobStatus.SUCCEEDED):
        yield from render(run, errors=failed, endpoint=endpoint)
