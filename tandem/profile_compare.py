"""Two capacity profiles side by side (TTFT by prompt length, ITL by batch and context), as each predicts
them: how far one engine is from another on the rows the autoscaler sizes with.

A cell past a profile's measured range (a longer prompt, a larger batch or context than it measured) is its
extrapolation, marked `~`; a decode cell that does not fit one replica of a profile (more sequences than its
batch cap, or more tokens than its KV cache) is `-` for that profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.profile import DEFAULT_GPU_PROFILE, Profile, profile_named

PROMPT_LENGTHS = (128, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Cell:
    ms: float | None  # None: does not fit one replica
    extrapolated: bool

    def text(self) -> str:
        return "-" if self.ms is None else f"{'~' if self.extrapolated else ''}{self.ms:.2f}"


def ttft_cell(p: Profile, prompt_tokens: int) -> Cell:
    measured = max(x.prompt_tokens for x in p.prefill if x.chunk_tokens == p.prefill_chunk_tokens)
    return Cell(p.prefill_ms(prompt_tokens), prompt_tokens > measured)


def itl_cell(p: Profile, batch: int, context: int) -> Cell:
    if batch > p.max_running_sequences or batch * context > p.kv_capacity_tokens:
        return Cell(None, False)
    beyond = batch > max(x.batch for x in p.decode) or context > max(x.context_tokens for x in p.decode)
    return Cell(p.decode_step_ms(batch, context), beyond)


def ratio(a: Cell, b: Cell) -> str:
    return "-" if a.ms is None or b.ms is None else f"{b.ms / a.ms:.2f}"


def describe(p: Profile, label: str) -> str:
    made = p.provenance
    how = (
        f"`{made.command}` on {made.device_name}, torch {made.torch}, {made.date}, "
        f"commit {made.commit or '-'}"
        if made
        else p.scale.note
    )
    return (
        f"- {label}: {p.model} on {p.device} ({p.dtype}), KV {p.kv_capacity_tokens} tokens, batch cap "
        f"{p.max_running_sequences}, cold start {p.cold_start_ms / 1000:.1f} s; {how}"
    )


def profile_caption(profile: str) -> str:
    """A profile (a file or a shipped name; "": the default GPU profile) in a line, for a table's caption."""
    p = profile_named(profile or None)
    made = f", measured {p.provenance.date} on {p.provenance.device_name}" if p.provenance else ""
    return f"{profile or DEFAULT_GPU_PROFILE} ({p.model} on {p.device}, {p.dtype}{made})"


def render(
    a: Profile,
    b: Profile,
    label_a: str = "A",
    label_b: str = "B",
    prompt_lengths: list[int] | None = None,
    batches: list[int] | tuple[int, ...] = (1, 8, 32, 64, 128),
    contexts: list[int] | tuple[int, ...] = (512, 2048, 8192),
) -> str:
    """The two tables, in Markdown, each profile described above them."""
    lines = [
        describe(a, "A " + label_a),
        describe(b, "B " + label_b),
        "",
        "TTFT of one prompt on an idle replica, ms (`~`: extrapolated past the profile's longest prompt):",
        "",
        "| prompt tokens | A | B | B / A |",
        "| --- | --- | --- | --- |",
    ]
    for n in prompt_lengths or PROMPT_LENGTHS:
        ca, cb = ttft_cell(a, n), ttft_cell(b, n)
        lines.append(f"| {n} | {ca.text()} | {cb.text()} | {ratio(ca, cb)} |")
    lines += [
        "",
        "ITL (one decode step), ms (`~`: past the measured batches or contexts; `-`: does not fit one "
        "replica):",
        "",
        "| batch | context | A | B | B / A |",
        "| --- | --- | --- | --- | --- |",
    ]
    for ctx in contexts:
        for batch in batches:
            ca, cb = itl_cell(a, batch, ctx), itl_cell(b, batch, ctx)
            lines.append(f"| {batch} | {ctx} | {ca.text()} | {cb.text()} | {ratio(ca, cb)} |")
    return "\n".join(lines)
