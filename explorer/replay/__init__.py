"""Replay: closures of the recorded graph run with real tensors, with eager RNG parity, on chosen devices.

No imports here on purpose: modules are imported by their full path (see `explorer/__init__.py`).
"""
