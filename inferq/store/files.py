"""The file store: uploaded files kept in Postgres in 1 MiB chunks, written and read as
streams, so no file is ever held whole in memory."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import ColumnElement, insert, or_, select, update
from sqlalchemy.orm import Session

from inferq.domain.batches import FILE_ID_PREFIX, FilePurpose, StoredFile
from inferq.exceptions import InvalidRequest, NotFound, TooLarge
from inferq.ids import new_id
from inferq.store.base import Page, Store, as_utc, newest_first, scoped_row
from inferq.store.models import FileChunkRow, FileRow

CHUNK_BYTES = 1 << 20


class FileSize(NamedTuple):
    """The size of a file inferq makes: its bytes (None: not measured yet) and lines."""

    bytes: int | None
    lines: int


class FileStore(Store):
    def upload(
        self,
        *,
        tenant: str,
        purpose: FilePurpose,
        filename: str,
        chunks: Iterable[bytes],
        max_bytes: int,
        expires_after_s: int | None = None,
    ) -> StoredFile:
        """Store a file read from `chunks`: it must be UTF-8 text, not empty, at most
        `max_bytes`. Nothing is kept if it is refused. Retention deletes it
        `expires_after_s` after now (None: kept)."""
        file_id = new_id(FILE_ID_PREFIX)
        now = self._clock()
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        size = lines = 0
        last = b""
        with self._transaction() as session:
            session.execute(
                insert(FileRow).values(
                    id=file_id,
                    tenant=tenant,
                    purpose=purpose.value,
                    filename=filename,
                    bytes=0,
                    lines=0,
                    created_at=now,
                    expires_at=None
                    if expires_after_s is None
                    else now + timedelta(seconds=expires_after_s),
                )
            )
            for seq, chunk in enumerate(_rechunk(chunks)):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    raise InvalidRequest(
                        f"the file is not valid UTF-8: byte 0x{chunk[exc.start]:02x} at offset "
                        f"{size + exc.start} cannot be decoded; save it as UTF-8",
                        param="file",
                        code="invalid_utf8",
                    ) from exc
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge(f"the file is over the limit of {max_bytes} bytes")
                lines += chunk.count(b"\n")
                last = chunk[-1:]
                session.execute(insert(FileChunkRow).values(file_id=file_id, seq=seq, data=chunk))
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                raise InvalidRequest(
                    "the file is not valid UTF-8: it ends inside a multi-byte character",
                    param="file",
                    code="invalid_utf8",
                ) from exc
            if size == 0:
                raise InvalidRequest("the file is empty", param="file", code="empty_file")
            if last != b"\n":
                lines += 1
            row = session.get(FileRow, file_id)
            assert row is not None
            row.bytes, row.lines = size, lines
            return _file_from_row(row)

    def get(self, file_id: str, *, scope: str | None = None) -> StoredFile:
        with self._transaction() as session:
            return _file_from_row(_scoped(session, file_id, scope, self._clock()))

    def page(
        self,
        *,
        scope: str | None,
        purpose: FilePurpose | None = None,
        after: str | None = None,
        limit: int = 20,
    ) -> Page[StoredFile]:
        query = select(FileRow).where(FileRow.deleted_at.is_(None), _unexpired(self._clock()))
        if scope is not None:
            query = query.where(FileRow.tenant == scope)
        if purpose is not None:
            query = query.where(FileRow.purpose == purpose.value)
        with self._transaction() as session:
            return newest_first(
                session,
                query,
                FileRow.id,
                after=after,
                limit=limit,
                convert=lambda rows: [_file_from_row(row) for row in rows],
            )

    def set_size(self, file_id: str, size: int) -> None:
        """Record the measured size of a file made by inferq (a batch's output or errors)."""
        with self._transaction() as session:
            session.execute(update(FileRow).where(FileRow.id == file_id).values(bytes=size))

    def delete(self, file_id: str, *, scope: str | None = None) -> StoredFile:
        """Delete a file: its chunks go; batches that used it keep their jobs."""
        with self._transaction() as session:
            row = _scoped(session, file_id, scope, self._clock())
            row.deleted_at = self._clock()
            session.query(FileChunkRow).filter(FileChunkRow.file_id == file_id).delete()
            return _file_from_row(row)

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The stored bytes, a chunk at a time (one row read per chunk)."""
        seq = 0
        while True:
            with self._transaction() as session:
                data = session.scalar(
                    select(FileChunkRow.data).where(
                        FileChunkRow.file_id == file_id, FileChunkRow.seq == seq
                    )
                )
            if data is None:
                return
            yield bytes(data)
            seq += 1

    def lines(self, file_id: str) -> Iterator[bytes]:
        """The stored file line by line (without the newline); a UTF-8 BOM is dropped."""
        pending = b""
        for index, chunk in enumerate(self.chunks(file_id)):
            pending += chunk.removeprefix(codecs.BOM_UTF8) if index == 0 else chunk
            *complete, pending = pending.split(b"\n")
            yield from complete
        if pending:
            yield pending


def _rechunk(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Chunks of exactly CHUNK_BYTES (the last may be shorter), whatever came in."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= CHUNK_BYTES:
            yield buffer[:CHUNK_BYTES]
            buffer = buffer[CHUNK_BYTES:]
    if buffer:
        yield buffer


def add_output_file(
    session: Session,
    *,
    tenant: str,
    batch_id: str,
    filename: str,
    size: FileSize,
    now: datetime,
    expires_at: datetime | None,
) -> str:
    """Record a file made by inferq (a batch's output or errors) in the transaction that
    ends the batch. It has no chunks: its content is made from the batch's jobs when read.
    It expires with the batch's output (`expires_at`)."""
    file_id = new_id(FILE_ID_PREFIX)
    session.execute(
        insert(FileRow).values(
            id=file_id,
            tenant=tenant,
            purpose=FilePurpose.BATCH_OUTPUT.value,
            filename=filename,
            bytes=size.bytes,
            lines=size.lines,
            batch_id=batch_id,
            created_at=now,
            expires_at=expires_at,
        )
    )
    return file_id


def _scoped(session: Session, file_id: str, scope: str | None, now: datetime) -> FileRow:
    """The file, unless it was deleted or has expired (retention deletes it soon)."""
    row = scoped_row(session, FileRow, file_id, scope, noun="file")
    if row.deleted_at is not None or (row.expires_at is not None and as_utc(row.expires_at) <= now):
        raise NotFound(f"no file with id {file_id!r}")
    return row


def _unexpired(now: datetime) -> ColumnElement[bool]:
    return or_(FileRow.expires_at.is_(None), FileRow.expires_at > now)


def _file_from_row(row: FileRow) -> StoredFile:
    return StoredFile(
        id=row.id,
        tenant=row.tenant,
        purpose=FilePurpose(row.purpose),
        filename=row.filename,
        bytes=row.bytes,
        lines=row.lines,
        created_at=as_utc(row.created_at),
        batch_id=row.batch_id,
        expires_at=as_utc(row.expires_at),
    )
