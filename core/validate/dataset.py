"""Validation datasets: the built-in synthetic majority-marker task, or a user JSONL file of {"prompt", "answer"}
lines.

Answers are graded by exact match. A gsm8k-style answer ("... #### 72") is graded on the number after '####',
and the model's number is read the same way (lm-eval's strict match); any other answer is graded on the first
words of the completion (as many words as the answer has).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.validate import synthetic

SYNTHETIC = "synthetic"
MAX_SYNTHETIC_PROMPTS = 10_000  # each is generated up front; validate sends 64 by default (minutes on a CPU)
GSM8K_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


class AnswerKind(enum.Enum):
    WORDS = "words"  # the completion's first words equal the answer's words
    GSM8K = "gsm8k"  # the number after '####' equals the answer's number
    NONE = "none"  # no answer: only agreement and drift are measured


@dataclass(frozen=True, kw_only=True)
class Example:
    prompt: str | tuple[int, ...]  # text, or token ids (the random dataset), sent to /v1/completions as they are
    answer: str | None  # the graded form: words, or the gsm8k number
    answer_kind: AnswerKind


@dataclass(frozen=True, kw_only=True)
class Dataset:
    name: str
    examples: tuple[Example, ...]

    @property
    def num_graded(self) -> int:
        return sum(e.answer_kind is not AnswerKind.NONE for e in self.examples)

    @property
    def is_token_ids(self) -> bool:
        return any(not isinstance(e.prompt, str) for e in self.examples)


def gsm8k_number(text: str) -> str | None:
    """'... #### 1,234' -> '1234'; None when there is no '#### N'."""
    match = GSM8K_ANSWER.search(text)
    if match is None:
        return None
    return match.group(1).replace(",", "").rstrip(".")


def is_correct(example: Example, completion: str) -> bool | None:
    """Exact match of the completion against the example's answer; None when the example has no answer."""
    if example.answer_kind is AnswerKind.NONE or example.answer is None:
        return None
    if example.answer_kind is AnswerKind.GSM8K:
        return gsm8k_number(completion) == example.answer
    want = example.answer.split()
    return completion.split()[: len(want)] == want


# Prompt length in words for plain 'synthetic': the range the recall model was trained on (520-760 words are as
# many tokens with its word-level tokenizer: more than two 256-token attention blocks). Launch's random-weight model
# has a byte-level BPE tokenizer (about 5 tokens per word): 'synthetic:100-160' gives it 500-800 tokens.
DEFAULT_SYNTHETIC_WORDS = (synthetic.MIN_PROMPT_WORDS, synthetic.MAX_PROMPT_WORDS)


def _synthetic_words(spec: str) -> tuple[int, int]:
    if spec == SYNTHETIC:
        return DEFAULT_SYNTHETIC_WORDS
    text = spec.split(":", 1)[1]
    low, _, high = text.partition("-")
    try:
        words = (int(low), int(high or low))
    except ValueError:
        raise InputError(f"--dataset {spec}: expected synthetic:MIN-MAX words, e.g. synthetic:100-160") from None
    if not 24 <= words[0] <= words[1] <= synthetic.NUM_WORDS:
        raise InputError(f"--dataset {spec}: words must satisfy 24 <= MIN <= MAX <= {synthetic.NUM_WORDS}")
    return words


def synthetic_dataset(num_prompts: int, seed: int, words: tuple[int, int] = DEFAULT_SYNTHETIC_WORDS) -> Dataset:
    examples = tuple(
        Example(prompt=ex.prompt_text, answer=ex.answer_text, answer_kind=AnswerKind.WORDS)
        for ex in synthetic.make_examples(seed, num_prompts, min_words=words[0], max_words=words[1])
    )
    return Dataset(name=f"{SYNTHETIC}:{words[0]}-{words[1]}(seed={seed})", examples=examples)


def _example_from_line(record: object, where: str) -> Example:
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise InputError(f"{where}: expected an object with a string 'prompt' (and optional 'answer')")
    answer = record.get("answer")
    if answer is None:
        return Example(prompt=record["prompt"], answer=None, answer_kind=AnswerKind.NONE)
    answer = str(answer)
    if "####" in answer:
        number = gsm8k_number(answer)
        if number is None:
            raise InputError(f"{where}: answer has '####' but no number after it")
        return Example(prompt=record["prompt"], answer=number, answer_kind=AnswerKind.GSM8K)
    if not answer.strip():
        raise InputError(f"{where}: 'answer' is empty (leave it out to skip grading)")
    return Example(prompt=record["prompt"], answer=answer.strip(), answer_kind=AnswerKind.WORDS)


def jsonl_dataset(path: Path, num_prompts: int | None) -> Dataset:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"--dataset {path}: not a UTF-8 text file; give '{SYNTHETIC}' or a JSONL file") from None
    except OSError as exc:
        raise InputError(f"--dataset {path}: cannot read it ({exc.strerror}); give '{SYNTHETIC}' or a JSONL file")
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"--dataset {path}:{number}: not JSON ({exc.msg})") from None
        examples.append(_example_from_line(record, f"--dataset {path}:{number}"))
        if num_prompts is not None and len(examples) == num_prompts:
            break
    if not examples:
        raise InputError(f"--dataset {path}: no prompts in it; expected JSONL lines {{\"prompt\": ..., \"answer\": ...}}")
    return Dataset(name=path.name, examples=tuple(examples))


def load_dataset(spec: str, *, num_prompts: int | None, seed: int) -> Dataset:
    """'synthetic[:MIN-MAX]' (num_prompts defaults to 64) or a JSONL file (all lines unless num_prompts)."""
    if num_prompts is not None and num_prompts < 1:
        raise InputError(f"--num-prompts {num_prompts}: must be at least 1")
    if (spec == SYNTHETIC or spec.startswith(SYNTHETIC + ":")) and num_prompts is not None and num_prompts > MAX_SYNTHETIC_PROMPTS:
        raise InputError(f"--num-prompts {num_prompts}: accepted for the synthetic task: 1-{MAX_SYNTHETIC_PROMPTS}")
    if spec == SYNTHETIC or spec.startswith(SYNTHETIC + ":"):
        return synthetic_dataset(num_prompts or 64, seed, _synthetic_words(spec))
    path = Path(spec)
    if path.suffix not in (".jsonl", ".json") and not path.exists():
        raise InputError(f"--dataset {spec!r}: not '{SYNTHETIC}' and not an existing .jsonl file")
    return jsonl_dataset(path, num_prompts)
