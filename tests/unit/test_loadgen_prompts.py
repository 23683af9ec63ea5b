"""Prompts of a given token count for `tandem bench`, default and calibrated to a real tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

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
    for n in (1, 7, 50, 333):
        words = prompt_for_tokens(n, random.Random(n), vocab).split(" ")
        total = sum(cost[w] for w in words)
        assert total <= max(n, cost[words[0]]) and total >= n - (min(vocab.costs) - 1)


def test_costly_first_word_is_still_one_word() -> None:
    vocab = Vocabulary(("alpha", "beta"), (3, 2))
    assert len(prompt_for_tokens(1, random.Random(0), vocab).split()) == 1


def _train_small_tokenizer(path: Path, known: list[str]) -> None:
    """A byte-level BPE trained so that `known` words are whole tokens and the rest are split."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([" ".join(known)] * 50, trainer=trainer)
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
