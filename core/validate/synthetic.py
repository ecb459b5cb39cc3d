"""The built-in synthetic task: which section marker occurs most often in a long prompt, and which came last.

A prompt is 520-760 distinct words (w000..w999) with 3-6 kinds of section marker (S00..S15) scattered through it,
then `?`. One marker kind occurs 2-4 more times than any other. The answer is two markers: the most frequent one,
then the prompt's last marker. The majority is a count over the whole prompt: the markers are spread across vLLM's
attention blocks (256 tokens on CPU for the tiny model), so a lost or corrupted block changes the evidence; the
last marker is what a Gated DeltaNet state carries to the end of the prompt. A count is used rather than a point
lookup because a tiny model learns it in minutes on two CPU cores, where lookups ("which section held word w")
stayed at chance or far below 95 % for 360-1,500 steps (benchmarks/DETAILS.md, "Training the recall model, CPU").
Training (scripts/train_tiny_model.py) and the dataset loader use this one definition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

NUM_WORDS = 1000
NUM_MARKERS = 16
SPECIAL_TOKENS = ("<|endoftext|>", "[UNK]", "?", ".")
EOS_ID, UNK_ID, QUERY_ID, STOP_ID = range(len(SPECIAL_TOKENS))
MARKER_OFFSET = len(SPECIAL_TOKENS)
WORD_OFFSET = MARKER_OFFSET + NUM_MARKERS
NUM_ANSWER_WORDS = 2  # the graded answer: two markers
MIN_PROMPT_WORDS = 520
MAX_PROMPT_WORDS = 760
MIN_KINDS, MAX_KINDS = 3, 6  # marker kinds in one prompt
MAX_MINORITY_COUNT = 8  # each other kind occurs 1..8 times
MIN_LEAD, MAX_LEAD = 2, 4  # the majority kind occurs this many times more than the next one


def word(index: int) -> str:
    return f"w{index:03d}"


def marker(index: int) -> str:
    return f"S{index:02d}"


@lru_cache(maxsize=1)
def vocabulary() -> dict[str, int]:
    """Token -> id; the tokenizer in profiles/tiny-qwen3.5-recall is built from exactly this."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({marker(i): MARKER_OFFSET + i for i in range(NUM_MARKERS)})
    vocab.update({word(i): WORD_OFFSET + i for i in range(NUM_WORDS)})
    return vocab


@lru_cache(maxsize=1)
def _tokens() -> tuple[str, ...]:
    return tuple(vocabulary())


def is_marker(token_id: int) -> bool:
    return MARKER_OFFSET <= token_id < WORD_OFFSET


@dataclass(frozen=True, kw_only=True)
class CountExample:
    prompt_ids: tuple[int, ...]  # words and markers, as token ids, without the query
    majority_id: int  # the marker kind that occurs most often

    def answer_ids(self) -> tuple[int, int]:
        last = next(t for t in reversed(self.prompt_ids) if is_marker(t))
        return self.majority_id, last

    @property
    def prompt_text(self) -> str:
        return " ".join(_tokens()[t] for t in self.prompt_token_ids())

    @property
    def answer_text(self) -> str:
        return " ".join(_tokens()[t] for t in self.answer_ids())

    def prompt_token_ids(self) -> list[int]:
        return [*self.prompt_ids, QUERY_ID]

    def target_token_ids(self) -> list[int]:
        """What the model was taught to say after the query: the two markers, `.`, then end of text."""
        return [*self.answer_ids(), STOP_ID, EOS_ID]


def make_example(rng: random.Random, num_words: int) -> CountExample:
    """`num_words` distinct words with marker kinds scattered among them; the first kind drawn is the majority."""
    kinds = rng.sample(range(NUM_MARKERS), rng.randint(MIN_KINDS, MAX_KINDS))
    minority = [rng.randint(1, MAX_MINORITY_COUNT) for _ in kinds[1:]]
    counts = [max(minority) + rng.randint(MIN_LEAD, MAX_LEAD), *minority]
    ids = [WORD_OFFSET + i for i in rng.sample(range(NUM_WORDS), num_words)]
    ids += [MARKER_OFFSET + kind for kind, count in zip(kinds, counts) for _ in range(count)]
    rng.shuffle(ids)
    return CountExample(prompt_ids=tuple(ids), majority_id=MARKER_OFFSET + kinds[0])


def make_examples(seed: int, num_examples: int, *, min_words: int = MIN_PROMPT_WORDS,
                  max_words: int = MAX_PROMPT_WORDS) -> list[CountExample]:
    """Held-out prompts for a seed. Training uses seeds >= 1_000_000 (see the training script), so they never meet."""
    rng = random.Random(seed)
    return [make_example(rng, rng.randint(min_words, max_words)) for _ in range(num_examples)]
