"""A Hugging Face model directory's config and tokenizer (torch-free: the router reads them too)."""
