"""Translation between client APIs and channel protocols (issue 12)."""
