"""What docs/hooks.py makes pages from: the code and the repository, read when the site is
built (and by the tests that check those pages)."""
