"""`vllm run-batch`, saying when its engine is up, so that its processing time can be told
from its start-up (on a GPU, compiling and capturing CUDA graphs take longer than a few
thousand lines do):

    python -m bench.run_batch -i IN.jsonl -o OUT.jsonl --model ... (run-batch's flags)

prints `ENGINE_UP` once run-batch begins reading its file, then runs the file as
run-batch does.
"""

from __future__ import annotations

import asyncio
from typing import Any

ENGINE_UP = "bench.run_batch: engine up"


def main() -> None:
    try:  # vLLM 0.32
        from vllm.entrypoints.launchers import run_batch as batch
    except ImportError:  # vLLM 0.25
        from vllm.entrypoints.openai import run_batch as batch

    run = batch.run_batch

    async def said_up(engine_client: Any, args: Any) -> None:
        print(ENGINE_UP, flush=True)
        await run(engine_client, args)

    batch.run_batch = said_up  # `main` calls it by its module's name, once the engine is up
    asyncio.run(batch.main(batch.parse_args()))


if __name__ == "__main__":
    main()
