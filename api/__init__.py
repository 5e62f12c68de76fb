"""The HTTP API: FastAPI routes, schemas, error mapping. Never imports vLLM or the worker."""
