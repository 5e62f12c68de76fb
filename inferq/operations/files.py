"""What can be done to files: upload a batch input file, read, list and delete files, and
read a file's bytes (an output file's are rendered from its batch's results)."""

from __future__ import annotations

from collections.abc import Iterator

from inferq.domain.batches import FilePurpose, StoredFile
from inferq.operations.batch_output import BatchOutput
from inferq.store.base import Page
from inferq.store.files import FileStore


class FileOperations:
    def __init__(
        self, *, files: FileStore, output: BatchOutput, max_bytes: int, retention_s: int
    ) -> None:
        """`retention_s`: how long a file is kept unless its upload says (0: kept)."""
        self._files = files
        self._output = output
        self._max_bytes = max_bytes
        self._retention_s = retention_s

    def upload(
        self,
        *,
        tenant: str,
        filename: str,
        chunks: Iterator[bytes],
        expires_after_s: int | None,
    ) -> StoredFile:
        """Store a batch input file; `expires_after_s` None: the deployment's retention."""
        return self._files.upload(
            tenant=tenant,
            purpose=FilePurpose.BATCH,
            filename=filename,
            chunks=chunks,
            max_bytes=self._max_bytes,
            expires_after_s=expires_after_s
            if expires_after_s is not None
            else self._retention_s or None,
        )

    def get(self, file_id: str, *, scope: str | None) -> StoredFile:
        """A file, with its size (a batch's output file's measured now if it was not)."""
        return self._output.measured(self._files.get(file_id, scope=scope))

    def page(
        self, *, scope: str | None, purpose: FilePurpose | None, after: str | None, limit: int
    ) -> Page[StoredFile]:
        """A page of files, each with its size (as `get`)."""
        page = self._files.page(scope=scope, purpose=purpose, after=after, limit=limit)
        return page._replace(items=[self._output.measured(file) for file in page.items])

    def delete(self, file_id: str, *, scope: str | None) -> StoredFile:
        return self._files.delete(file_id, scope=scope)

    def content(self, file: StoredFile) -> Iterator[bytes]:
        return self._output.content(file)
