"""OpenAI's Responses API, `/v1/responses`, over the queue.

Each response is a chat job (in Postgres, listed in /v1/jobs, counted by rate limits, run
ahead of batch lines), answered when it ends, streamed as Responses events while it runs,
or with `background: true` answered at once (`queued`) and read back by its id. A stored
response (`store`, the default) is kept as jobs are, under retention, and can be
continued with `previous_response_id`. A client that hangs up before the answer cancels
its response, unless it asked for `background`.
"""

from __future__ import annotations

import dataclasses
import functools

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.deps import FollowerDep, JobOpsDep, PrincipalDep, ReadDep, Reads, SubmissionDep
from api.errors import ended_error, error_responses
from api.response_events import response_events
from api.streams import event_stream, holds_output
from inferq.constants import JOB_ID_HEADER
from inferq.domain.jobs import Job, JobSpec
from inferq.exceptions import NotFound
from inferq.wire.model_catalog import CatalogModel
from inferq.wire.response_bodies import ResponsesBody
from inferq.wire.response_objects import ResponseState, response_object
from inferq.wire.responses import (
    check_previous,
    finish_response,
    prepare_response,
    response_job_id,
    stored_response,
)

router = APIRouter(
    prefix="/v1/responses", tags=["responses"], responses=error_responses(401, 429, 503)
)

_CREATED = {
    200: {
        "description": "The response; with `stream: true`, Server-Sent Events of Responses "
        "events; with `background: true`, the response as queued.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **error_responses(404, 409, 413, 422),
}


# Shown on /docs under the route.
_EXAMPLES = """A model response (OpenAI's shape): answered when it ends, streamed (`stream`), or
queued in the background (`background`) and read back by its id.

```sh
curl -s $INFERQ/v1/responses -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \\
  -d '{"model": "MODEL", "instructions": "Be brief.", "input": "Name three primes."}'
```

```python
from openai import OpenAI

client = OpenAI(base_url=INFERQ + "/v1", api_key=KEY)
response = client.responses.create(model="MODEL", input="Name three primes.")
print(response.output_text)
with client.responses.stream(model="MODEL", input="Tell me a story.") as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="")
```
"""


@router.post("", response_model=None, responses=_CREATED, description=_EXAMPLES)
async def create_response(
    body: ResponsesBody,
    submission: SubmissionDep,
    read: ReadDep,
    follower: FollowerDep,
    principal: PrincipalDep,
    request: Request,
) -> Response:
    """A model response (OpenAI's shape): answered when it ends, streamed, or queued in
    the background."""
    scope = principal.scope
    previous = None
    if body.previous_response_id is not None:
        previous = await _stored(read, body.previous_response_id, scope)
        check_previous(previous, body.previous_response_id)
    build = functools.partial(_spec, body, previous)
    spec = await submission.checked(body.model, body.input_chars(), build)

    async def reread(job_id: str) -> Job:
        return await read((job_id, scope))

    if not body.stream and not body.background:
        job = await submission.run(principal, spec, read=reread, request=request, announced=True)
        if error := ended_error(job.id, job.status, job.error):
            raise error
        state = ResponseState.of_job(job)
        return JSONResponse(response_object(state), headers={JOB_ID_HEADER: job.id})
    job = await submission.submit(principal, spec)
    headers = {JOB_ID_HEADER: job.id}
    if body.stream:
        followed = follower.follow(job, read=reread, held=holds_output(job, chat=True))
        hangup = None
        if not body.background:
            hangup = functools.partial(submission.cancel_abandoned, job.id, scope=scope)
        events = response_events(followed, job=job)
        return event_stream(events, on_hangup=hangup, headers=headers, send_done=False)
    return JSONResponse(response_object(ResponseState.of_job(job)), headers=headers)


def _spec(body: ResponsesBody, previous: Job | None, model: CatalogModel) -> JobSpec:
    validator = model.validator
    prepared = prepare_response(validator, body, previous=previous)
    [token_ids] = validator.encode([prepared])
    return dataclasses.replace(finish_response(validator, prepared, token_ids), stream=body.stream)


@router.get("/{response_id}", response_model=None, responses=error_responses(404))
async def get_response(response_id: str, read: ReadDep, principal: PrincipalDep) -> JSONResponse:
    """A stored response as it is now: queued, in progress, or ended with its output."""
    job = await _stored(read, response_id, principal.scope)
    return JSONResponse(response_object(ResponseState.of_job(job)))


@router.post("/{response_id}/cancel", response_model=None, responses=error_responses(404, 409))
async def cancel_response(
    response_id: str, read: ReadDep, jobs: JobOpsDep, principal: PrincipalDep
) -> JSONResponse:
    """Cancel a response that has not ended; a running one is aborted in the engine."""
    job = await _stored(read, response_id, principal.scope)
    cancel = functools.partial(jobs.cancel, job.id, scope=principal.scope)
    return JSONResponse(response_object(ResponseState.of_job(await run_in_threadpool(cancel))))


async def _stored(read: Reads, response_id: str, scope: str | None) -> Job:
    """The stored response `response_id` names, or `NotFound`."""
    try:
        job = await read((response_job_id(response_id), scope))
    except NotFound:
        job = None
    if job is None or not stored_response(job):
        raise NotFound(f"no stored response {response_id!r}")
    return job
