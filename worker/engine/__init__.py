"""The engine adapter: the `Engine` protocol the GPU loop drives (`protocol.py`), the
factory that picks one from settings, vLLM's engines (`vllm/`) and the pipeline-only engine."""
