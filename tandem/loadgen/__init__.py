"""A load generator for any OpenAI-compatible endpoint (`tandem bench`); a client that never imports torch."""
