"""The built-in synthetic task: recall what followed a word somewhere in a long prompt.

A prompt is a list of distinct words (w000..w999) in random order, then `? <word> =`. The answer is the words that
followed <word> in the list. The queried word sits anywhere in a prompt of 520-760 tokens, so the answer depends on
tokens in any of vLLM's attention blocks (256 tokens on CPU for the tiny model) and on the GDN state that carries
the whole prompt. Training (scripts/train_tiny_model.py) and the dataset loader use this one definition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NUM_WORDS = 1000
SPECIAL_TOKENS = ("<|endoftext|>", "[UNK]", "?", "=", ".")
EOS_ID, UNK_ID, QUERY_ID, EQUALS_ID, STOP_ID = range(len(SPECIAL_TOKENS))
WORD_OFFSET = len(SPECIAL_TOKENS)
NUM_ANSWER_WORDS = 4  # the graded answer
NUM_CONTINUATION_WORDS = 8  # what the model was taught to recite after `=` (then `.`)
MIN_PROMPT_WORDS = 520
MAX_PROMPT_WORDS = 760


def word(index: int) -> str:
    return f"w{index:03d}"


def vocabulary() -> dict[str, int]:
    """Token -> id; the tokenizer in profiles/tiny-qwen3.5-recall is built from exactly this."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({word(i): WORD_OFFSET + i for i in range(NUM_WORDS)})
    return vocab


@dataclass(frozen=True, kw_only=True)
class RecallExample:
    prompt_word_ids: tuple[int, ...]  # word indices 0..NUM_WORDS-1, distinct
    query_position: int  # index into prompt_word_ids of the queried word

    @property
    def continuation(self) -> tuple[int, ...]:
        start = self.query_position + 1
        return self.prompt_word_ids[start : start + NUM_CONTINUATION_WORDS]

    @property
    def prompt_text(self) -> str:
        words = " ".join(word(i) for i in self.prompt_word_ids)
        return f"{words} ? {word(self.prompt_word_ids[self.query_position])} ="

    @property
    def answer_text(self) -> str:
        return " ".join(word(i) for i in self.continuation[:NUM_ANSWER_WORDS])

    def prompt_token_ids(self) -> list[int]:
        ids = [WORD_OFFSET + i for i in self.prompt_word_ids]
        return [*ids, QUERY_ID, WORD_OFFSET + self.prompt_word_ids[self.query_position], EQUALS_ID]

    def target_token_ids(self) -> list[int]:
        return [*(WORD_OFFSET + i for i in self.continuation), STOP_ID]


def make_example(rng: random.Random, num_prompt_words: int) -> RecallExample:
    """One example; the query never points so close to the end that the continuation would be short."""
    ids = tuple(rng.sample(range(NUM_WORDS), num_prompt_words))
    position = rng.randrange(0, num_prompt_words - NUM_CONTINUATION_WORDS)
    return RecallExample(prompt_word_ids=ids, query_position=position)


def make_examples(seed: int, num_examples: int, *, min_words: int = MIN_PROMPT_WORDS,
                  max_words: int = MAX_PROMPT_WORDS) -> list[RecallExample]:
    """Held-out prompts for a seed. Training uses seeds >= 1_000_000 (see the training script), so they never meet."""
    rng = random.Random(seed)
    return [make_example(rng, rng.randint(min_words, max_words)) for _ in range(num_examples)]
