"""Chaos under load (`python -m bench.chaos`): a deployment of the real processes under a
steady mixed load while faults of every kind come at random, then a check of the whole
history for anything lost or done twice. See bench/chaos/__main__.py."""
