"""Many models on one deployment, through the real pieces: each model's jobs run on its
own workers, a LoRA adapter runs on its base's worker and changes the output, a model
whose workers are all down waits, and a model nobody registered is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import BadRequestError, NotFoundError, OpenAI, UnprocessableEntityError
from sqlalchemy import select

from inferq.host.processes import descendants
from inferq.store.models import JobRow
from tests.conftest import ADMIN_KEY
from tests.helpers.broker import Broker
from tests.helpers.processes import http_ok, thread_nices
from tests.helpers.waiting import wait_until
from tests.integration.api.conftest import (
    ADAPTER,
    CHAT_MODEL,
    EMBEDDING_MODEL,
    OTHER_MODEL,
    ModelsStack,
)
from tests.integration.api.test_batches import read_lines, upload, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("models_stack")]

SEEDED = {"max_tokens": 12, "temperature": 0.9, "seed": 1234}
PROMPT = "The quick brown fox"


def openai_client(stack: ModelsStack) -> OpenAI:
    return OpenAI(
        base_url=stack.deployment.url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=120
    )


def http(stack: ModelsStack) -> httpx.Client:
    return stack.deployment.client()


def completion(client: OpenAI, model: str) -> str:
    answer = client.completions.create(model=model, prompt=PROMPT, **SEEDED)
    assert answer.model == model
    return answer.choices[0].text


def worker_of(stack: ModelsStack, job_id: str) -> str | None:
    with stack.deployment.sessions() as session:
        return session.scalar(select(JobRow.worker).where(JobRow.id == job_id))


def test_every_registered_model_is_listed_with_who_serves_it(models_stack: ModelsStack) -> None:
    listed = {m.id: m for m in openai_client(models_stack).models.list()}
    assert set(listed) == {CHAT_MODEL, ADAPTER, OTHER_MODEL, EMBEDDING_MODEL}
    with http(models_stack) as client:
        adapter = client.get(f"/v1/models/{ADAPTER}").json()
        status = client.get("/v1/status").json()
    assert adapter["parent"] == CHAT_MODEL
    assert adapter["root"] == CHAT_MODEL
    serving = {m["name"]: m for m in status["models"]}
    assert serving[ADAPTER]["workers"] == [f"{CHAT_MODEL}@test"]
    assert serving[EMBEDDING_MODEL]["runner"] == "pooling"
    workers = {w["name"]: w for w in status["workers"]}
    assert workers[f"{CHAT_MODEL}@test"]["adapters"] == [ADAPTER]
    assert f"interactive:{OTHER_MODEL}" in status["queues"]
    # What each worker registered: what the API checks that model's requests against.
    registered = {m.name: m for m in models_stack.deployment.models.all()}
    assert registered[ADAPTER].base == CHAT_MODEL
    assert registered[ADAPTER].max_model_len == registered[CHAT_MODEL].max_model_len == 1024
    assert registered[CHAT_MODEL].chat_template  # the engine's tokenizer's
    assert registered[EMBEDDING_MODEL].embedding_size == 128
    assert not registered[EMBEDDING_MODEL].supports_dimensions
    # Each worker's metrics say what it serves.
    metrics = httpx.get(models_stack.workers[CHAT_MODEL].metrics_url).text
    assert f'model="{ADAPTER}"' in metrics
    assert "inferq_served_model{" in metrics


def test_each_models_jobs_run_on_that_models_worker(models_stack: ModelsStack) -> None:
    with http(models_stack) as client:
        jobs = {
            model: client.post("/v1/jobs", json={"model": model, "prompt": "hi", "max_tokens": 4})
            for model in (CHAT_MODEL, ADAPTER, OTHER_MODEL)
        }
        for model, response in jobs.items():
            assert response.status_code == 202, response.text
            done = client.get(f"/v1/jobs/{response.json()['id']}", params={"wait": 60}).json()
            assert done["status"] == "succeeded"
            assert done["model"] == model
    assert worker_of(models_stack, jobs[CHAT_MODEL].json()["id"]) == f"{CHAT_MODEL}@test"
    assert worker_of(models_stack, jobs[ADAPTER].json()["id"]) == f"{CHAT_MODEL}@test"
    assert worker_of(models_stack, jobs[OTHER_MODEL].json()["id"]) == f"{OTHER_MODEL}@test"


def test_each_engine_core_yields_the_cores_by_default_and_the_model_keeps_its_own(
    models_stack: ModelsStack,
) -> None:
    """With no nice set, each worker's vLLM engine core (on a CPU it runs the model in a
    process of its own, and only schedules and spins itself) runs at nice 19, every thread
    of it, those started for work after the start too; the model's process and the
    worker's own keep their priority. Generating and pooling workers alike. Where the
    kernel groups tasks by session, the worker that sets INFERQ_ENGINE_GROUP_NICE (the chat
    model's) runs its session's group at that nice; by default the group is left alone."""
    client = openai_client(models_stack)
    completion(client, CHAT_MODEL)
    client.embeddings.create(model=EMBEDDING_MODEL, input=["a"])
    for model in (CHAT_MODEL, EMBEDDING_MODEL):
        worker = models_stack.workers[model].pid
        engine = [pid for pid in descendants(worker) if _comm(pid).startswith("VLLM::")]
        cores = [pid for pid in engine if _parent(pid) == worker]
        runners = [pid for pid in engine if pid not in cores]
        assert cores, f"{model}: no engine core under the worker"
        assert runners, f"{model}: vLLM on the CPU runs its engine core and its model apart"
        assert {pid: thread_nices(pid) for pid in cores} == {pid: {19} for pid in cores}
        assert {pid: thread_nices(pid) for pid in runners} == {pid: {0} for pid in runners}
        assert thread_nices(worker) == {0}
        if Path("/proc/self/autogroup").exists():
            group = Path(f"/proc/{worker}/autogroup").read_text().split()[-2:]
            assert group == ["nice", "5" if model == CHAT_MODEL else "0"]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_an_adapter_changes_the_output_of_the_same_seeded_request(
    models_stack: ModelsStack,
) -> None:
    client = openai_client(models_stack)
    base = completion(client, CHAT_MODEL)
    adapted = completion(client, ADAPTER)
    assert adapted != base
    # Same seed, same model: same text, so the difference is the adapter's.
    assert completion(client, CHAT_MODEL) == base
    assert completion(client, ADAPTER) == adapted
    # The other name of the same weights, without the adapter, says what the base says.
    assert completion(client, OTHER_MODEL) == base


def test_a_model_nobody_registered_is_refused_naming_it(models_stack: ModelsStack) -> None:
    client = openai_client(models_stack)
    with pytest.raises(NotFoundError, match="nope-model") as refused:
        client.chat.completions.create(
            model="nope-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.code == "model_not_found"
    with http(models_stack) as http_client:
        job = http_client.post("/v1/jobs", json={"model": "nope-model", "prompt": "hi"})
        assert job.status_code == 404
        assert "nope-model" in job.json()["error"]["message"]
        assert http_client.get("/v1/models/nope-model").status_code == 404
        # With several models, a request must say which.
        unnamed = http_client.post("/v1/jobs", json={"prompt": "hi"})
    assert unnamed.status_code == 422
    assert unnamed.json()["error"]["param"] == "model"
    assert CHAT_MODEL in unnamed.json()["error"]["message"]


def test_a_model_of_the_other_kind_is_refused(models_stack: ModelsStack) -> None:
    client = openai_client(models_stack)
    with pytest.raises((BadRequestError, UnprocessableEntityError), match="embeddings"):
        client.completions.create(model=EMBEDDING_MODEL, prompt="hi", max_tokens=2)


def test_a_job_for_a_model_whose_workers_are_down_waits_for_one(
    models_stack: ModelsStack,
) -> None:
    worker = models_stack.workers[OTHER_MODEL]
    worker.stop()
    with http(models_stack) as client:
        submitted = client.post(
            "/v1/jobs", json={"model": OTHER_MODEL, "prompt": "anyone?", "max_tokens": 4}
        )
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        # Maintenance passes go by (publishing nothing again: its message waits in Redis).
        broker = Broker.of(models_stack.deployment.env)
        try:
            broker.wait_maintenance_passes(2, timeout_s=60)
            assert job_id in broker.gpu_jobs()
        finally:
            broker.close()
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
        models_stack.start_worker(OTHER_MODEL)
        # The client waits longer than the server's wait, which may last while the worker loads.
        done = client.get(f"/v1/jobs/{job_id}", params={"wait": 120}, timeout=150).json()
    assert done["status"] == "succeeded"
    assert worker_of(models_stack, job_id) == f"{OTHER_MODEL}@test"
    wait_until(http_ok(models_stack.deployment.url + "/healthz"), timeout_s=10, what="API up")


def test_a_batch_may_mix_models_and_adapters(models_stack: ModelsStack) -> None:
    client = openai_client(models_stack)
    models = [CHAT_MODEL, ADAPTER, OTHER_MODEL, ADAPTER, CHAT_MODEL, OTHER_MODEL]
    lines: list[dict[str, Any]] = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": model, "prompt": PROMPT, **SEEDED},
        }
        for i, model in enumerate(models)
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/completions",
        completion_window="24h",
    )
    assert batch.model == CHAT_MODEL  # a batch's model is its first line's
    batch = wait_for(client, batch.id)
    assert batch.status == "completed", batch
    output = read_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == [line["custom_id"] for line in lines]
    online = {model: completion(client, model) for model in set(models)}
    for line, model in zip(output, models, strict=True):
        body = line["response"]["body"]
        assert body["model"] == model
        assert body["choices"][0]["text"] == online[model], json.dumps(line)


def _cli(stack: ModelsStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args, "--url", stack.deployment.url],
        env={**os.environ, "INFERQ_API_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_cli_takes_a_batch_file_across_models_and_a_prompt_for_any_model(
    models_stack: ModelsStack, tmp_path: Path
) -> None:
    models = [CHAT_MODEL, OTHER_MODEL, ADAPTER]
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"line-{i}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": model, "prompt": PROMPT, "max_tokens": 4},
                }
            )
            + "\n"
            for i, model in enumerate(models)
        )
    )
    out = tmp_path / "results.jsonl"
    # Two chat models are served: the lines name theirs, so no --model is asked for.
    done = _cli(models_stack, "batch", "submit", str(source), "--wait", "-o", str(out))
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["response"]["body"]["model"] for r in results] == models
    # An option such a file would ignore is refused, not ignored.
    refused = _cli(models_stack, "batch", "submit", str(source), "--model", OTHER_MODEL)
    assert refused.returncode == 2
    assert "drop --model" in " ".join(refused.stderr.split())
    # One prompt, to the model named (the deployment could not guess which).
    unnamed = _cli(models_stack, "submit", "hi")
    assert unnamed.returncode != 0
    assert "`model` is required" in unnamed.stderr
    one = _cli(models_stack, "submit", "hi", "--model", OTHER_MODEL, "--max-tokens", "3")
    assert one.returncode == 0, one.stderr
    with http(models_stack) as client:
        job = client.get(f"/v1/jobs/{one.stdout.strip()}").json()
    assert job["model"] == OTHER_MODEL


def test_a_batch_line_naming_an_unknown_model_fails_the_batch_with_the_line(
    models_stack: ModelsStack,
) -> None:
    client = openai_client(models_stack)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": model, "prompt": "hi", "max_tokens": 2},
        }
        for i, model in enumerate([CHAT_MODEL, "ghost"])
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    [error] = batch.errors.data
    assert error.code == "model_not_found"
    assert error.line == 2
    assert error.param == "body.model"
    assert "ghost" in (error.message or "")
