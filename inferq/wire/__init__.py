"""The shapes on the wire: OpenAI's request bodies and responses (chat, completions,
embeddings, batch lines and output files), inferq's own JSON for jobs and batches, and the
validation that turns a body into a job for a served model (the model catalog, prompts,
structured outputs). What the batch path or the webhooks share with the API lives here;
HTTP models only the API uses (`JobCreate`, `FilePublic`, ...) live in `api/`."""
