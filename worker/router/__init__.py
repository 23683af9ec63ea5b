"""The router: OpenAI-compatible HTTP in front of the prefill and decode pools."""
