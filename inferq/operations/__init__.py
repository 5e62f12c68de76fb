"""What can be done to each resource (jobs, batches and their output, files, webhooks):
one object per resource, shared by the API's routes and `inferq run`, built by `inferq.app`."""
