"""Thin shim: metadata and dependencies live in pyproject.toml."""
import setuptools

setuptools.setup()
