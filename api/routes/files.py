"""`/v1/files`: upload, read and delete files (OpenAI's Files API, purpose 'batch')."""

from __future__ import annotations

from email.utils import encode_rfc2231
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from api.batch_schemas import FileDeleted, FileList, FilePublic
from api.deps import FileOpsDep, PrincipalDep
from api.errors import error_responses
from inferq.domain.batches import FilePurpose
from inferq.exceptions import InvalidRequest
from inferq.store.files import CHUNK_BYTES
from inferq.wire.public import MAX_EXPIRES_AFTER_S, ExpiresAfter

router = APIRouter(prefix="/v1/files", tags=["files"], responses=error_responses(401, 429, 503))


@router.post("", response_model=FilePublic, responses=error_responses(413, 422))
def upload_file(
    files: FileOpsDep,
    principal: PrincipalDep,
    file: Annotated[UploadFile, File(description="JSONL in OpenAI's Batch input format.")],
    purpose: Annotated[str, Form(description="Must be 'batch'.")],
    anchor: Annotated[
        str | None,
        Form(alias="expires_after[anchor]", description="'created_at' (OpenAI's expires_after)."),
    ] = None,
    seconds: Annotated[
        str | None,
        Form(
            alias="expires_after[seconds]",
            description="How long the file is kept; INFERQ_JOB_RETENTION_S by default.",
        ),
    ] = None,
) -> FilePublic:
    """Upload a batch input file (UTF-8 JSONL)."""
    if purpose != FilePurpose.BATCH.value:
        raise InvalidRequest(f"purpose must be 'batch', not {purpose!r}", param="purpose")
    expires = _expires_after(anchor, seconds)
    stored = files.upload(
        tenant=principal.tenant,
        filename=file.filename or "upload.jsonl",
        chunks=iter(lambda: file.file.read(CHUNK_BYTES), b""),
        expires_after_s=None if expires is None else expires.seconds,
    )
    return FilePublic.from_file(stored)


def _expires_after(anchor: str | None, seconds: str | None) -> ExpiresAfter | None:
    """OpenAI's `expires_after`, as its clients send it in a form (`expires_after[...]`)."""
    if anchor is None and seconds is None:
        return None
    try:
        return ExpiresAfter.model_validate({"anchor": anchor, "seconds": seconds})
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = problem["loc"][0] if problem["loc"] else "seconds"
        raise InvalidRequest(
            f"expires_after[{field}]: {problem['msg']} (anchor 'created_at', seconds from 1 to "
            f"{MAX_EXPIRES_AFTER_S})",
            param=f"expires_after[{field}]",
        ) from exc


@router.get("", response_model=FileList, responses=error_responses(422))
def list_files(
    files: FileOpsDep,
    principal: PrincipalDep,
    purpose: Annotated[FilePurpose | None, Query(description="Only files of this purpose.")] = None,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="Files a page.")] = 20,
) -> FileList:
    """Files, newest first."""
    page = files.page(scope=principal.scope, purpose=purpose, after=after, limit=limit)
    return FileList.of(page, FilePublic.from_file)


@router.get("/{file_id}", response_model=FilePublic, responses=error_responses(404))
def get_file(file_id: str, files: FileOpsDep, principal: PrincipalDep) -> FilePublic:
    """A file's details."""
    return FilePublic.from_file(files.get(file_id, scope=principal.scope))


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes."},
        **error_responses(404),
    },
)
def file_content(file_id: str, files: FileOpsDep, principal: PrincipalDep) -> StreamingResponse:
    """A file's content, streamed; a batch's output and error files are made from its
    results, in input order."""
    file = files.get(file_id, scope=principal.scope)
    return StreamingResponse(
        files.content(file),
        media_type="application/octet-stream",
        headers={"Content-Disposition": attachment(file.filename)},
    )


def attachment(filename: str) -> str:
    """The `Content-Disposition` of a download named `filename`, whatever it holds (quotes,
    NUL, any script): the name itself as UTF-8 in `filename*` (RFC 6266), and for clients
    that read only `filename`, the name with every character outside printable ASCII, `"`
    and `\\` made `_`."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    if plain == filename:
        return f'attachment; filename="{filename}"'
    return f'attachment; filename="{plain}"; filename*={encode_rfc2231(filename, "utf-8")}'


@router.delete("/{file_id}", response_model=FileDeleted, responses=error_responses(404))
def delete_file(file_id: str, files: FileOpsDep, principal: PrincipalDep) -> FileDeleted:
    """Delete a file. Batches made from it keep their lines and results."""
    file = files.delete(file_id, scope=principal.scope)
    return FileDeleted(id=file.id)
