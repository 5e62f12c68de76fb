"""The `inferq` command: the entry points that start and drive every process."""
