"""Translation between client APIs and channel protocols."""
