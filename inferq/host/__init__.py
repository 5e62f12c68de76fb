"""What the host can run: its GPUs and memory, the KV cache a model needs, and the checks
a worker (and `inferq doctor`) make before loading a model."""
