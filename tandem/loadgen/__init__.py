"""Load generator for any OpenAI-compatible endpoint (`tandem bench`); a client tool that never imports torch."""
