"""The shared core: the domain words, errors, money and caching that the
gateway (``hopbase``), the channels (``channels_pool``) and the money side
(``billing``) all speak.

Dependencies run one way: ``hopbase`` may use ``channels_pool`` and
``billing``; those two use only ``core`` and the shared models; ``core``
uses nothing of the three but their models (tests/test_layers.py).
"""
