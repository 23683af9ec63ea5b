"""One rule for a spec's `model.maxContextLength` against the model's own positions (config.json's
`max_position_embeddings`): the operator's Degraded condition, `tandem up` and the worker say it alike."""

from __future__ import annotations

REASON = "ContextExceedsModel"


def beyond_model(max_context_length: int, max_position_embeddings: int | None) -> str | None:
    """Why the spec asks for more context than the model has, with both numbers (pure); None when it does
    not, or while the model's limit is unknown. Contexts are then served up to the model's limit."""
    if not max_position_embeddings or max_context_length <= max_position_embeddings:
        return None
    return (
        f"maxContextLength {max_context_length} exceeds the model's max_position_embeddings "
        f"{max_position_embeddings}: contexts are served up to {max_position_embeddings} tokens"
    )
