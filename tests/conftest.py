"""Shared fixtures. Gateway and simulator fixtures live in tests/gateway.py."""
