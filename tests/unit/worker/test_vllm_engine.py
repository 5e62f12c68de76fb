"""The vLLM adapter without an engine: the arguments it gives vLLM, a start it refuses
early, and its contract with the engine loop (a request vLLM cannot take is that request's
failure, never the worker's)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inferq.domain.jobs import SamplingParams
from inferq.domain.logprobs import PromptLogprob
from inferq.exceptions import EngineStartFailed, RequestRejected
from inferq.host.processes import descendants
from inferq.settings import Settings
from tests.helpers.processes import thread_nices
from worker.engine.protocol import EngineRequest


class _RefusingCore:
    """vLLM's engine as seen past its front end: the request is taken there, then cannot be
    encoded for the engine core (as a number above 2**64 cannot)."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.engine_core = SimpleNamespace(shutdown=lambda: None)

    def add_request(self, *_: Any, **__: Any) -> None:
        raise OverflowError("int too big to convert")

    def abort_request(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)


# Importing vLLM (and torch) warns of their own deprecations.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_request_the_engine_core_cannot_take_is_rejected_and_forgotten() -> None:
    from worker.engine.vllm.generate import VllmEngine

    core = _RefusingCore()
    engine = VllmEngine(SimpleNamespace(llm_engine=core), step_timeout_s=60)  # type: ignore[arg-type]
    try:
        with pytest.raises(RequestRejected, match="int too big"):
            engine.add(
                EngineRequest(
                    job_id="job_1", prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=2)
                )
            )
    finally:
        engine.close()
    assert core.aborted == ["job_1"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_prompt_logprobs_are_asked_of_vllm_only_when_set_and_read_back_finite() -> None:
    from vllm.logprobs import Logprob

    from worker.engine.vllm.generate import _prompt_logprobs, _sampling_params

    asked = _sampling_params(SamplingParams(max_tokens=2, prompt_logprobs=2), stream=False)
    assert asked.prompt_logprobs == 2
    assert _sampling_params(SamplingParams(max_tokens=2), stream=False).prompt_logprobs is None
    # A token ruled out has a logprob of minus infinity, which JSON cannot hold.
    read = _prompt_logprobs([None, {5: Logprob(-1.5, 1, " a"), 7: Logprob(float("-inf"), 3, None)}])
    assert read == (
        None,
        {
            5: PromptLogprob(logprob=-1.5, rank=1, decoded_token=" a"),
            7: PromptLogprob(logprob=-9999.0, rank=3, decoded_token=None),
        },
    )
    assert _prompt_logprobs(None) is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_lora_engine_args_come_only_with_adapters() -> None:
    from worker.engine.vllm.core import engine_args

    plain = engine_args(Settings())
    assert not {"enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"} & plain.keys()
    adapters = {"a": "/x", "b": "org/b", "c": "org/c"}
    args = engine_args(Settings(lora_adapters=adapters, max_loras=2, max_lora_rank=32))
    assert args["enable_lora"] is True
    assert args["max_loras"] == 2
    assert args["max_lora_rank"] == 32
    assert args["max_cpu_loras"] == 3  # every adapter stays in host memory


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_missing_local_adapter_fails_the_start_before_vllm_loads(tmp_path: Path) -> None:
    from worker.engine.vllm.generate import VllmEngine

    missing = tmp_path / "nowhere"
    settings = Settings(model=str(tmp_path / "no-model"), lora_adapters={"a": str(missing)})
    with pytest.raises(EngineStartFailed, match=re.escape(f"adapter 'a' is at {missing}")):
        VllmEngine.from_settings(settings)


class _NoLoras(_RefusingCore):
    """vLLM's engine refusing to load an adapter (as it does one of too high a rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.shut_down = False
        self.engine_core = SimpleNamespace(shutdown=self._shutdown)

    def _shutdown(self) -> None:
        self.shut_down = True

    def add_lora(self, _: Any) -> bool:
        raise RuntimeError("Call to add_lora method failed: LoRA rank 32 is greater than 16.")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_adapter_vllm_cannot_load_fails_the_start_and_closes_the_engine() -> None:
    from worker.engine.vllm.generate import VllmEngine

    core = _NoLoras()
    engine = VllmEngine(
        SimpleNamespace(llm_engine=core),  # type: ignore[arg-type]
        step_timeout_s=60,
        adapters={"big": "/adapters/big"},
    )
    with pytest.raises(EngineStartFailed, match=r"adapter 'big' from /adapters/big: .*rank 32"):
        engine.load_adapters()
    assert core.shut_down


# A stand-in for vLLM's engine core on a CPU: a thread of its own, and the model's
# process under it; prints the model process's pid, then waits to be killed.
_CORE = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
model = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(model.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    ("nice", "core_nice", "core_gets", "model_gets"),
    [(0, 19, 19, 0), (5, 19, 19, 5), (19, 0, 19, 19), (0, 0, 0, 0)],
)
def test_the_engine_core_alone_is_lowered_unless_the_whole_engine_is(
    nice: int, core_nice: int, core_gets: int, model_gets: int
) -> None:
    """`engine_core_nice` lowers every thread of the core and nothing under it;
    `engine_nice` lowers the model's process too, and the core to the higher of the two."""
    from worker.engine.vllm.core import lower_priority

    with subprocess.Popen([sys.executable, "-c", _CORE], stdout=subprocess.PIPE, text=True) as core:
        try:
            assert core.stdout is not None
            model = int(core.stdout.readline())
            ours = os.nice(0)  # what the processes started with (0 unless run under nice)
            lower_priority([core.pid], nice=nice, core_nice=core_nice)
            assert thread_nices(core.pid) == {max(ours, core_gets)}
            assert len(list(Path(f"/proc/{core.pid}/task").iterdir())) == 2
            assert thread_nices(model) == {max(ours, model_gets)}
            assert thread_nices(os.getpid()) == {ours}
        finally:
            for pid in descendants(core.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("backend", "apart"), [("mp", True), ("uni", False), ("ray", False)])
def test_only_a_core_whose_model_runs_in_processes_of_its_own_counts_as_apart(
    backend: str, apart: bool
) -> None:
    from worker.engine.vllm.core import runs_model_apart

    config = SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))
    assert runs_model_apart(llm) is apart  # type: ignore[arg-type]


# Calls `lower_group` in a process of its own, leading a session or not; prints what it
# returned and what its scheduling group reads after.
_GROUP = """
import sys
from pathlib import Path
from inferq.host.processes import lower_group
autogroup = Path(sys.argv[2])
print(lower_group(int(sys.argv[1]), autogroup=autogroup))
print(autogroup.read_text().split()[-1] if autogroup.exists() else None)
"""


def _lowered(nice: int, autogroup: Path, *, leader: bool = True) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _GROUP, str(nice), str(autogroup)],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=leader,
        timeout=60,
    )
    return done.stdout.split()


def test_a_worker_leading_its_session_lowers_its_scheduling_group_and_only_lowers_it(
    tmp_path: Path,
) -> None:
    """Written as the kernel's /proc/PID/autogroup reads ("/autogroup-7 nice 0")."""
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    assert _lowered(10, group) == ["10", "10"]
    assert _lowered(5, group) == ["10", "10"]  # a higher nice is kept
    assert _lowered(0, group) == ["None", "10"]  # 0: left alone
    group.write_text("/autogroup-7 nice 0\n")
    # A session the worker does not lead is another's (a shell's, a test runner's).
    assert _lowered(10, group, leader=False) == ["None", "0"]
    # A kernel that does not group by session has no such file.
    assert _lowered(10, tmp_path / "none") == ["None", "None"]


def test_the_lowered_nice_is_the_whole_sessions_and_no_one_elses() -> None:
    """On this kernel's own file: a process leading its session lowers the group its
    children run in, where the kernel groups by session; ours is untouched."""
    real = Path("/proc/self/autogroup")
    ours = real.read_text() if real.exists() else None
    code = (
        "import subprocess; from inferq.host.processes import lower_group; "
        "print(lower_group(12)); "
        "print(subprocess.run(['cat', '/proc/self/autogroup'], capture_output=True, "
        "text=True).stdout.split()[-1:] or ['None'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,
        timeout=60,
    )
    returned, child = done.stdout.splitlines()
    if ours is None:
        assert returned == "None"
    else:
        assert (returned, child) == ("12", "['12']")
        assert real.read_text() == ours
