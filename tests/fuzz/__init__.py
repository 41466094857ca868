"""Differential fuzzing of deferred_init: random constructor programs, eager vs deferred."""
