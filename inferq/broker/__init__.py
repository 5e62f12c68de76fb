"""Redis and Celery: publishing work to each model's queues, queue depths, job events
(ends, cancels, submissions) on pub/sub, token streams, and the registry of live workers."""
