"""What inferq is about, with no I/O: jobs and their results, batches and files, API keys,
served models, webhooks, and the names of each model's queues."""
