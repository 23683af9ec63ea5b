"""Prompts of a given token count for `tandem bench`, default and calibrated to a real tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, processors, trainers

from tandem.loadgen.prompts import (
    DEFAULT_VOCABULARY,
    WORDS,
    Vocabulary,
    load_vocabulary,
    prompt_for_tokens,
    vocabulary_for,
)


def test_default_prompt_has_n_words_and_depends_on_rng() -> None:
    prompt = prompt_for_tokens(300, random.Random(0))
    words = prompt.split(" ")
    assert len(words) == 300 and set(words) <= set(WORDS)
    assert prompt == prompt_for_tokens(300, random.Random(0))
    assert prompt != prompt_for_tokens(300, random.Random(1))
    assert len(prompt_for_tokens(1, random.Random(0)).split()) == 1
    with pytest.raises(ValueError):
        prompt_for_tokens(0, random.Random(0))


def test_vocabulary_keeps_single_token_words_when_there_are_enough() -> None:
    vocab = vocabulary_for(lambda text: 1 if len(text) <= 4 else 3)  # " the" is 4 chars
    assert vocab.words and all(len(w) <= 3 for w in vocab.words) and set(vocab.costs) == {1}


def test_multi_token_vocabulary_fills_to_the_budget() -> None:
    vocab = vocabulary_for(lambda text: len(text) - 1)  # cost = letters; too few one-letter words
    assert vocab.words == WORDS
    cost = dict(zip(vocab.words, vocab.costs, strict=True))
    first = dict(zip(vocab.words, vocab.first_costs or (), strict=True))
    assert first["the"] == 2 and cost["the"] == 3  # no space before the opening word
    for n in (1, 7, 50, 333):
        words = prompt_for_tokens(n, random.Random(n), vocab).split(" ")
        total = first[words[0]] + sum(cost[w] for w in words[1:])
        assert total <= max(n, min(first.values())) and total >= n - (min(vocab.costs) - 1)


def test_costly_first_word_is_still_one_word() -> None:
    vocab = Vocabulary(("alpha", "beta"), (3, 2))
    assert len(prompt_for_tokens(1, random.Random(0), vocab).split()) == 1


def _train_small_tokenizer(
    path: Path, known: list[str], prefix_space: bool = True, bos: bool = False
) -> None:
    """A byte-level BPE trained so that `known` words are whole tokens and the rest are split; without
    `prefix_space` a prompt's first word has no space before it (as in Llama 3's and GPT-2's), with `bos`
    every encoding starts with <s> (as Llama's)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=["<s>"] if bos else [],
    )
    tok.train_from_iterator([" ".join(known)] * 50, trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    tok.save(str(path))


def test_calibrated_prompts_tokenize_to_exactly_n(tmp_path: Path) -> None:
    known = list(WORDS[:60])
    _train_small_tokenizer(tmp_path / "tokenizer.json", known)
    vocab = load_vocabulary(tmp_path)  # a directory holding tokenizer.json
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert set(known) <= set(vocab.words) < set(WORDS)  # plus pieces like "man" (from "many")
    assert all(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in vocab.words)
    for n in (1, 64, 500):
        prompt = prompt_for_tokens(n, random.Random(n), vocab)
        assert len(tok.encode(prompt, add_special_tokens=False).ids) == n
    # the uncalibrated default overshoots on this tokenizer: that is what calibration fixes
    default_prompt = prompt_for_tokens(500, random.Random(0), DEFAULT_VOCABULARY)
    assert len(tok.encode(default_prompt, add_special_tokens=False).ids) > 600


def test_a_prompt_costs_n_tokens_as_the_server_counts_them_bos_and_opening_word_included(
    tmp_path: Path,
) -> None:
    # A trace's 512-token prompt must not reach the server as 514: a router deciding by prompt length
    # (localPrefillMaxTokens 512) would route it as a longer prompt.
    known = list(WORDS[:60])
    _train_small_tokenizer(tmp_path / "tokenizer.json", known, prefix_space=False, bos=True)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    vocab = load_vocabulary(tmp_path)
    assert vocab.special_tokens == 1
    assert any(c > 1 for c in vocab.first_costs or ())  # words split when they open a prompt
    for n in (2, 64, 512):
        prompt = prompt_for_tokens(n, random.Random(n), vocab)
        assert len(tok.encode(prompt).ids) == n, n  # the BOS and the opening word counted
    assert len(prompt_for_tokens(1, random.Random(0), vocab).split()) == 1  # no room left: still one word
