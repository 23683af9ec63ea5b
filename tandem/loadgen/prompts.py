"""Prompt text of a given token count: traces carry lengths, not text, so prompts are built from words."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Short, common English words; with a space before them each is one token in the usual BPE and
# SentencePiece vocabularies (GPT-2, Llama, Qwen, Mistral), so n words tokenize to about n tokens.
WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is it you that he was for on are with as his they be at one have this from or
    had by word but what some we can out other were all there when up use your how said an each she
    which do their time if will way about many then them write would like so these her long make
    thing see him two has look more day could go come did number sound no most people my over know
    water than call first who may down side been now find any new work part take get place made live
    where after back little only round man year came show every good me give our under name very
    through just form great think say help low line turn cause much mean before move right boy old
    too same tell does set three want air well also play small end put home read hand port large
    spell add even land here must big high such follow act why ask men change went light kind off
    need house picture try us again animal point mother world near build self earth father head
    stand own page should country found answer school grow study still learn plant cover food sun
    four thought let keep eye never last door between city tree cross since hard start might story
    saw far sea draw left late run while press close night real life few stop open seem together
    next white children begin got walk example ease paper often always music those both mark book
    letter until mile river car feet care second group carry took rain eat room friend began idea
    fish mountain north once base hear horse cut sure watch color face wood main enough plain girl
    usual young ready above ever red list though feel talk bird soon body dog family direct pose
    leave song measure state product black short class wind question happen complete ship area half
    rock order fire south problem piece told knew pass farm top whole king size heard best hour
    better true during hundred am remember step early hold west ground interest reach fast five sing
    listen six table travel less morning ten simple several vowel toward war lay against pattern
    slow center love person money serve appear road map science rule govern pull cold notice voice
    fall power town fine certain fly unit lead cry dark machine note wait plan figure star box noun
    field rest correct able pound done beauty drive stood contain front teach week final gave green
    quick develop sleep warm free minute strong special mind behind clear tail produce fact street
    inch lot nothing course stay wheel full force blue object decide surface deep moon island foot
    yet busy test record boat common gold possible plane age dry wonder laugh thousand ago ran check
    game shape yes hot miss brought heat snow bed bring sit perhaps fill east weight language among
    """.split()
)


@dataclass(frozen=True)
class Vocabulary:
    """Words to build prompts from and how many tokens each costs (with its leading space). A prompt also
    costs its first word without a space before it (`first_costs`, None: as `costs`) and the special tokens
    the tokenizer adds to every prompt (`special_tokens`: a BOS), which a server counts as prompt tokens."""

    words: tuple[str, ...]
    costs: tuple[int, ...]
    first_costs: tuple[int, ...] | None = None
    special_tokens: int = 0


DEFAULT_VOCABULARY = Vocabulary(WORDS, (1,) * len(WORDS))
MIN_SINGLE_TOKEN_WORDS = 32  # below this, keep multi-token words too, for variety


def vocabulary_for(count_tokens: Callable[[str], int], special_tokens: int = 0) -> Vocabulary:
    """Calibrate WORDS to a tokenizer: keep the words that are one token after a space when there are
    enough of them, otherwise keep every word with its real cost; `special_tokens` as on Vocabulary."""
    costs = [max(1, count_tokens(" " + w)) for w in WORDS]
    single = tuple(w for w, c in zip(WORDS, costs, strict=True) if c == 1)
    words, kept = (
        (single, (1,) * len(single)) if len(single) >= MIN_SINGLE_TOKEN_WORDS else (WORDS, tuple(costs))
    )
    return Vocabulary(words, kept, tuple(max(1, count_tokens(w)) for w in words), special_tokens)


def load_vocabulary(tokenizer_path: str | Path) -> Vocabulary:
    """A vocabulary calibrated to a Hugging Face `tokenizer.json` (or a model directory holding one)."""
    import tokenizers  # only when asked for: the default prompts need no tokenizer

    path = Path(tokenizer_path)
    if path.is_dir():
        path = path / "tokenizer.json"
    tok = tokenizers.Tokenizer.from_file(str(path))

    def count(text: str, special: bool = False) -> int:
        return len(tok.encode(text, add_special_tokens=special).ids)

    return vocabulary_for(count, special_tokens=count("the", special=True) - count("the"))


def prompt_for_tokens(n: int, rng: random.Random, vocab: Vocabulary = DEFAULT_VOCABULARY) -> str:
    """A prompt of random words costing about n tokens as a server counts them, its special tokens included
    (exactly n with the default or a calibrated single-token vocabulary, up to tokenizer effects at word
    joins and, for chat, the template; at least one word even where n leaves no room for one).
    Random words keep prefix caches from sharing prompts between requests."""
    if n < 1:
        raise ValueError("n must be >= 1")
    budget = n - vocab.special_tokens
    first = vocab.first_costs or vocab.costs
    cheapest, cheapest_first = min(vocab.costs), min(first)
    words: list[str] = []
    total = 0
    while not words or (total < budget and budget - total >= cheapest):
        i = rng.randrange(len(vocab.words))
        cost = vocab.costs[i] if words else first[i]
        if total + cost > budget and (words or cost > cheapest_first):
            continue  # too long for what is left; the cheapest words still fit, so this ends
        words.append(vocab.words[i])
        total += cost
    return " ".join(words)
