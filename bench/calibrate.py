"""Writes the paced engine's H100 calibration table, bench/gpu_pace/h100-llama-3.1-8b-awq.json.

    python -m bench.calibrate            # writes the table and prints what it implies

The one H100 run (bench/RESULTS.md, On an H100) measured a whole, not its steps: one
`LLM.generate` of the bench workload (3,000 lines, 421,193 prompt and 207,499 output
tokens; max_num_seqs 256, chunked prefill at 16,384 tokens a step) took 22.1 s. How a
step's time splits between the tokens it computes and the context it attends to comes from
a roofline of the H100 and the model: each step reads the INT4 weights once, computes
every scheduled token, and reads each sequence's KV cache, plus a fixed cost. The table is
that shape, scaled so the same 3,000 lines (rebuilt here with the stand-in's tokenizer:
the same token counts) take 22.1 s in the paced engine. A GPU run that measures step
times at several batch sizes replaces the shape with its own points.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import llama8b_awq, workload
from bench.pace import H100, Line, file_ideal
from worker.engine.paced import StepTimes

MEASURED = {
    "what": "one LLM.generate of the bench workload (3,000 lines)",
    "gpu": "NVIDIA H100 80GB HBM3",
    "vllm": "0.25.0",
    "model": "Llama 3.1 8B Instruct AWQ INT4 shapes (bench/llama8b_awq.py), Machete kernels",
    "seconds": 22.1,
    "lines": 3000,
    "prompt_tokens": 421_193,
    "output_tokens": 207_499,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 16_384,
    "async_scheduling": True,
}
# The roofline: H100 SXM's data sheet (HBM3 3.35 TB/s, 989 TFLOP/s dense BF16) at the
# fractions an engine reaches, and Llama 3.1 8B's shape.
HBM_BYTES_PER_S = 3.35e12 * 0.8
FLOPS = 989e12 * 0.45
WEIGHT_BYTES = 5.49 * 2**30  # the INT4 checkpoint as vLLM loaded it
FLOPS_PER_TOKEN = 2 * 8.03e9
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, 16-bit
FIXED_MS = 2.0  # launches, sampling and the host's share of a step
POINTS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16_384)


def roofline() -> StepTimes:
    weights_ms = 1000 * WEIGHT_BYTES / HBM_BYTES_PER_S
    return StepTimes(
        tokens_ms=tuple(
            (n, FIXED_MS + max(weights_ms, 1000 * n * FLOPS_PER_TOKEN / FLOPS)) for n in POINTS
        ),
        context_ms_per_1k=1000 * 1000 * KV_BYTES_PER_TOKEN / HBM_BYTES_PER_S,
        max_num_batched_tokens=int(MEASURED["max_num_batched_tokens"]),  # type: ignore[call-overload]
        async_scheduling=True,
    )


def measured_lines() -> list[Line]:
    """The H100 run's 3,000 lines, by their token counts."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as work:
        llama8b_awq.write_tokenizer(Path(work), llama8b_awq.VOCAB)
        tokenizer = AutoTokenizer.from_pretrained(work)
        requests = workload.bulk(tokenizer, 3000, context=8192)
        lines = [
            Line(len(workload.chat_token_ids(tokenizer, r.prompt)), r.max_tokens) for r in requests
        ]
    prompts, outputs = sum(x.prompt_tokens for x in lines), sum(x.max_tokens for x in lines)
    assert (prompts, outputs) == (MEASURED["prompt_tokens"], MEASURED["output_tokens"]), (
        f"the bench workload is no longer the measured one: {prompts} and {outputs} tokens"
    )
    return lines


def calibrate(path: Path) -> dict[str, object]:
    lines = measured_lines()
    shape = roofline()
    seats = int(MEASURED["max_num_seqs"])  # type: ignore[call-overload]
    scale = float(MEASURED["seconds"]) / file_ideal(shape, lines, max_num_seqs=seats).seconds  # type: ignore[arg-type]
    times = shape.scaled(scale)
    ideal = file_ideal(times, lines, max_num_seqs=seats)
    implied = {
        "ideal_seconds": round(ideal.seconds, 2),
        "ideal_steps": ideal.steps,
        "mean_step_ms": round(ideal.mean_step_ms, 2),
        "decode_step_ms_256_sequences_of_300_tokens": round(
            1000 * times.step_s(tokens=256, context=256 * 300), 2
        ),
        "decode_step_ms_1_sequence": round(1000 * times.step_s(tokens=1, context=300), 2),
        "prefill_tokens_per_s_in_full_chunks": round(
            16_384 / times.step_s(tokens=16_384, context=0)
        ),
    }
    table = {
        "name": "H100 80GB HBM3, Llama 3.1 8B AWQ INT4, vLLM 0.25.0",
        "source": (
            "A roofline of the H100 and the model (bench/calibrate.py), scaled so that the "
            "measured run's 3,000 lines take its 22.1 s in the paced engine"
        ),
        "measured": MEASURED,
        "roofline_scale": round(scale, 4),
        "tokens_ms": [[n, round(ms, 4)] for n, ms in times.tokens_ms],
        "context_ms_per_1k": round(times.context_ms_per_1k, 5),
        "max_num_batched_tokens": times.max_num_batched_tokens,
        "async_scheduling": times.async_scheduling,
        "implied": implied,
    }
    path.write_text(json.dumps(table, indent=2) + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=H100)
    args = parser.parse_args()
    table = calibrate(args.out)
    print(args.out)
    print(json.dumps({k: table[k] for k in ("roofline_scale", "implied")}, indent=2))


if __name__ == "__main__":
    main()
