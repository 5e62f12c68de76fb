"""The GPU worker: engine loop, admission, result writing; and the GPU-less tasks."""
