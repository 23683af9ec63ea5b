"""Runs the model: the engine step, its loop thread, step inputs, the static-shape decode step and compile."""
