"""vLLM's engines: generation (with LoRA adapters and tool calls) and pooling
(embeddings). The only code that imports vLLM."""
