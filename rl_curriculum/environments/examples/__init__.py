"""Small environments written as worked examples for docs/environments.md; each is tested in
tests/environments/."""
