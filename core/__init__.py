"""The shared core: the domain's words, errors, money, usage, SSE, caching
and a process's drain state, which every other package speaks.

It imports nothing of the project (tests/test_layers.py): what the core
needs of a higher layer (a flush at the end of a drain, say), that layer
joins it with.
"""
