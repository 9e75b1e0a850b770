"""Small curricula written as worked examples for docs/howto.md; each is tested in tests/docs_test.py."""
