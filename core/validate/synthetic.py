"""The built-in synthetic task: which section of a long prompt held a word, and which section came last.

A prompt is 520-760 distinct words (w000..w999) cut into 6-12 sections, each opened by a distinct section marker
(S00..S15), then `? <word>`. The answer is two markers: the section that held <word>, then the prompt's last
section. The queried word can sit in any of vLLM's attention blocks (256 tokens on CPU for the tiny model), so
the first marker needs attention over the whole prompt; the second is carried by the GDN state to the end.
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
MIN_SECTIONS, MAX_SECTIONS = 6, 12


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
class RecallExample:
    prompt_ids: tuple[int, ...]  # markers and words, as token ids, without the query
    query_position: int  # index into prompt_ids of the queried word

    def answer_ids(self) -> tuple[int, int]:
        section = next(t for t in reversed(self.prompt_ids[: self.query_position]) if is_marker(t))
        last = next(t for t in reversed(self.prompt_ids) if is_marker(t))
        return section, last

    @property
    def prompt_text(self) -> str:
        return " ".join(_tokens()[t] for t in self.prompt_token_ids())

    @property
    def answer_text(self) -> str:
        return " ".join(_tokens()[t] for t in self.answer_ids())

    def prompt_token_ids(self) -> list[int]:
        return [*self.prompt_ids, QUERY_ID, self.prompt_ids[self.query_position]]

    def target_token_ids(self) -> list[int]:
        """What the model was taught to say after the query: the two markers, then `.`."""
        return [*self.answer_ids(), STOP_ID]


def make_prompt(rng: random.Random, num_words: int) -> tuple[int, ...]:
    """`num_words` distinct words cut into sections at random places, each section opened by a distinct marker."""
    words = [WORD_OFFSET + i for i in rng.sample(range(NUM_WORDS), num_words)]
    num_sections = min(rng.randint(MIN_SECTIONS, MAX_SECTIONS), max(1, num_words // 4))
    cuts = sorted(rng.sample(range(1, num_words), num_sections - 1)) if num_sections > 1 else []
    markers = [MARKER_OFFSET + i for i in rng.sample(range(NUM_MARKERS), num_sections)]
    ids: list[int] = []
    for i, (start, stop) in enumerate(zip([0, *cuts], [*cuts, num_words])):
        ids += [markers[i], *words[start:stop]]
    return tuple(ids)


def make_query(rng: random.Random, prompt_ids: tuple[int, ...]) -> RecallExample:
    positions = [i for i, t in enumerate(prompt_ids) if not is_marker(t)]
    return RecallExample(prompt_ids=prompt_ids, query_position=rng.choice(positions))


def make_examples(seed: int, num_examples: int, *, min_words: int = MIN_PROMPT_WORDS,
                  max_words: int = MAX_PROMPT_WORDS) -> list[RecallExample]:
    """Held-out prompts for a seed. Training uses seeds >= 1_000_000 (see the training script), so they never meet."""
    rng = random.Random(seed)
    return [make_query(rng, make_prompt(rng, rng.randint(min_words, max_words))) for _ in range(num_examples)]
