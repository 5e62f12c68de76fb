# A stand-in for python:3.11-slim, for hosts that cannot pull from a registry: Debian's
# Python 3.11 in a virtual environment on PATH, with Python's headers, as the official image
# has them (vLLM on a CPU compiles kernels against them). Built by scripts/compose-check;
# never pushed.
ARG DEBIAN_IMAGE=inferq-standin/debian:bookworm
FROM ${DEBIAN_IMAGE}
# The certificates this host trusts (a TLS proxy in front of the package registries, say).
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv python3-dev \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python \
    && /usr/local/python/bin/pip install --no-cache-dir --upgrade pip
ENV PATH=/usr/local/python/bin:$PATH \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
CMD ["python3"]
