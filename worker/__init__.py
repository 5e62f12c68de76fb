"""The GPU worker (`inferq worker`): the engine loop, admission, leases and result
writing, around the engine adapter in `worker/engine/`."""
