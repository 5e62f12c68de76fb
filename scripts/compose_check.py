"""What scripts/compose-check asks of the running stack, through its published ports.

`first-job`: as soon as the API answers, one job, before the worker has loaded its model;
prints how long after `up` it completed. `through-the-ports`: a batch file to completion
with the `openai` client, a streamed chat, a wrong key refused, Flower behind its basic
auth, the worker's metrics. `first-request`: every command of docs/deployment.md's "First
request" section, in order, as a user would type them after `docker compose up -d`, with
this stack's compose command, address and env file in place of the section's. Exits
non-zero, saying what failed, at the first failure.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

MODEL = "demo"
BATCH_LINES = 50
DEPLOYMENT_PAGE = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def first_job(api: str, key: str) -> None:
    up_at = int(os.environ["INFERQ_CHECK_UP_AT"]) / 1000
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}) as client:
        answered = _wait(lambda: _answers(client), 300, "the API to answer")
        response = client.post("/v1/jobs", json={"model": MODEL, "prompt": "hi", "max_tokens": 8})
        if response.status_code != 202:
            sys.exit(f"the first job was refused: {response.status_code} {response.text}")
        job_id = response.json()["id"]
        accepted = time.time()
        job = _wait(lambda: _ended(client, job_id), 600, "the first job to end")
    if job["status"] != "succeeded":
        sys.exit(f"the first job {job['status']}: {job.get('error')}")
    print(
        f"compose-check: API answered {answered - up_at:.0f} s after up; a job accepted then "
        f"({accepted - up_at:.0f} s) completed {time.time() - up_at:.0f} s after up"
    )


def through_the_ports(api: str, key: str, flower: str, flower_auth: str, metrics: str) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=key)
    _batch(client)
    _streamed_chat(client)
    _wrong_key(api)
    _flower(flower, flower_auth)
    _metrics(metrics)


def _batch(client: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"{i}"}],
                "max_tokens": 16,
            },
        }
        for i in range(BATCH_LINES)
    ]
    started = time.time()
    upload = client.files.create(
        file=("lines.jsonl", io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())),
        purpose="batch",
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    ended = {"completed", "failed", "expired", "cancelled"}

    def batch_ended() -> openai.types.Batch | None:
        current = client.batches.retrieve(batch.id)
        return current if current.status in ended else None

    batch = _wait(batch_ended, 600, "the batch to end")
    if batch.status != "completed" or batch.output_file_id is None:
        sys.exit(f"the batch ended {batch.status}: {batch.errors}")
    output = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    ok = [x for x in output if x["response"] and x["response"]["status_code"] == 200]
    if len(ok) != BATCH_LINES:
        sys.exit(f"the batch's output has {len(ok)} answered lines of {BATCH_LINES}")
    print(f"compose-check: a {BATCH_LINES}-line batch completed in {time.time() - started:.1f} s")


def _streamed_chat(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=16, stream=True
    )
    chunks = list(stream)
    reasons = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    if len(chunks) < 2 or not reasons:
        sys.exit(f"the streamed chat came as {len(chunks)} chunks, finish reasons {reasons}")
    print(f"compose-check: a streamed chat came in {len(chunks)} chunks ({reasons[-1]})")


def _wrong_key(api: str) -> None:
    try:
        openai.OpenAI(base_url=f"{api}/v1", api_key="sk-" + "0" * 40).models.list()
    except openai.AuthenticationError:
        print("compose-check: a wrong API key was refused (401)")
    else:
        sys.exit("a wrong API key was let in")


def _flower(flower: str, flower_auth: str) -> None:
    user, _, password = flower_auth.partition(":")
    if (status := httpx.get(f"{flower}/api/workers").status_code) != 401:
        sys.exit(f"Flower answered {status} without its basic auth")

    def workers() -> dict[str, object] | None:
        # refresh=1: Flower asks the workers (it may not have heard from them yet).
        answer = httpx.get(f"{flower}/api/workers?refresh=1", auth=(user, password), timeout=30)
        if answer.status_code != 200:
            sys.exit(f"Flower answered {answer.status_code} with its basic auth: {answer.text}")
        listed: dict[str, object] = answer.json()
        return listed or None

    listed = _wait(workers, 60, "Flower to list the workers")
    print(
        "compose-check: Flower refused a request without its basic auth (401), and with it "
        f"listed the workers: {', '.join(sorted(listed))}"
    )


def _metrics(metrics: str) -> None:
    text = httpx.get(metrics).text
    for series in ("inferq_worker_ready 1.0", "inferq_jobs_admitted_total"):
        if series not in text:
            sys.exit(f"the worker's metrics have no {series!r}")
    print("compose-check: the worker's metrics say it is ready and count admitted jobs")


def first_request(api: str, env_file: str, compose: str) -> None:
    """Runs the section's shell and Python blocks as one bash script, in order."""
    blocks = first_request_blocks(DEPLOYMENT_PAGE.read_text())
    script = ["set -euo pipefail"]
    for language, written in blocks:
        code = (
            written.replace("docker compose ", f"{compose} ")
            .replace("http://localhost:8000", api)
            .replace(" .env)", f" {env_file})")
            .replace("curl -s ", "curl -s --fail-with-body ")
        )
        script.append(
            f"{sys.executable} - <<'PYTHON'\n{code}PYTHON\n" if language == "python" else code
        )
    started = time.time()
    ran = subprocess.run(["bash", "-c", "\n".join(script)], check=False, timeout=900)
    if ran.returncode != 0:
        sys.exit(f"the first-request section of {DEPLOYMENT_PAGE.name} failed (above)")
    python = sum(language == "python" for language, _ in blocks)
    print(  # on a line of its own: the section's last command may end without one
        f"\ncompose-check: the first-request section of docs/{DEPLOYMENT_PAGE.name} ran, "
        f"{len(blocks) - python} shell and {python} Python blocks, in {time.time() - started:.0f} s"
    )


def first_request_blocks(page: str) -> list[tuple[str, str]]:
    """The `sh` and `python` blocks of the page's "First request" section, in order."""
    section = page.split("\n## First request\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(sh|python)\n(.*?)^```", section, re.M | re.S)


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _ended(client: httpx.Client, job_id: str) -> dict[str, object] | None:
    job: dict[str, object] = client.get(f"/v1/jobs/{job_id}").json()
    return job if job["status"] in {"succeeded", "failed", "cancelled"} else None


def _wait(ready, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if value := ready():
            return time.time() if value is True else value
        time.sleep(0.5)
    sys.exit(f"gave up waiting {timeout_s:.0f} s for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("check", choices=["first-job", "through-the-ports", "first-request"])
    parser.add_argument("--api", required=True)
    parser.add_argument("--key")
    parser.add_argument("--env-file")
    parser.add_argument("--compose", help="the compose command that stands for `docker compose`")
    parser.add_argument("--flower")
    parser.add_argument("--flower-auth")
    parser.add_argument("--metrics")
    args = parser.parse_args()
    if args.check == "first-job":
        first_job(args.api, args.key)
    elif args.check == "first-request":
        first_request(args.api, args.env_file, args.compose)
    else:
        through_the_ports(args.api, args.key, args.flower, args.flower_auth, args.metrics)


if __name__ == "__main__":
    main()
