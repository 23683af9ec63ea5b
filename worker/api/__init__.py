"""Torch-free request types and wire conversions that the router and the worker servers share."""
