"""tandem: disaggregated prefill/decode LLM serving on Kubernetes (shared root, owned by neither wing)."""

__version__ = "0.1.0"
