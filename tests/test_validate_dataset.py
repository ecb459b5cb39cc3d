"""Datasets: the synthetic majority-marker task, user JSONL with gsm8k extraction, thresholds from YAML and flags."""

import json
from collections import Counter

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.validate import synthetic
from hybridserve.core.validate.dataset import (
    AnswerKind, DEFAULT_SYNTHETIC_WORDS, gsm8k_number, is_correct, load_dataset,
)
from hybridserve.core.validate.thresholds import Thresholds, resolve


def test_synthetic_prompts_are_seeded_and_answerable():
    a = load_dataset("synthetic", num_prompts=20, seed=3)
    b = load_dataset("synthetic", num_prompts=20, seed=3)
    c = load_dataset("synthetic", num_prompts=20, seed=4)
    assert a == b and a.examples != c.examples
    for ex in a.examples:
        tokens = ex.prompt.split()
        assert tokens[-1] == "?"
        words = [t for t in tokens[:-1] if t.startswith("w")]
        low, high = DEFAULT_SYNTHETIC_WORDS
        assert low <= len(words) <= high and len(set(words)) == len(words)
        counts = Counter(t for t in tokens[:-1] if t.startswith("S"))
        (top, n_top), (_, n_next) = counts.most_common(2)
        assert 2 <= n_top - n_next <= 4  # a clear majority, never a tie
        last = next(t for t in reversed(tokens[:-1]) if t.startswith("S"))
        assert ex.answer == f"{top} {last}"


def test_synthetic_length_spec_and_spread():
    ds = load_dataset("synthetic:520-760", num_prompts=64, seed=0)
    assert ds.name.startswith("synthetic:520-760")
    for ex in ds.examples:
        tokens = ex.prompt.split()
        assert len(tokens) > 2 * 256 + 8  # more than two of vLLM's 256-token CPU attention blocks
        majority = ex.answer.split()[0]
        # the majority's evidence is spread: it lies in more than one attention block
        hits = {i // 256 for i, t in enumerate(tokens) if t == majority}
        assert len(hits) >= 2
    for bad in ("synthetic:5-10", "synthetic:abc", "synthetic:300-200"):
        with pytest.raises(InputError, match="synthetic"):
            load_dataset(bad, num_prompts=2, seed=0)


def test_synthetic_token_ids_match_the_vocabulary():
    ex = synthetic.make_examples(0, 1)[0]
    vocab = synthetic.vocabulary()
    assert [vocab[w] for w in ex.prompt_text.split()] == ex.prompt_token_ids()
    assert [vocab[w] for w in ex.answer_text.split()] == ex.target_token_ids()[: synthetic.NUM_ANSWER_WORDS]
    assert len(vocab) <= 1024 and ex.target_token_ids()[-2:] == [synthetic.STOP_ID, synthetic.EOS_ID]


@pytest.mark.parametrize("text,want", [
    ("so 3 + 4 = 7\n#### 7", "7"), ("#### 1,234", "1234"), ("#### -5.5", "-5.5"), ("the answer is 7", None),
])
def test_gsm8k_number(text, want):
    assert gsm8k_number(text) == want


def test_jsonl_dataset_grades_gsm8k_and_words(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [{"prompt": "q1", "answer": "work\n#### 42"}, {"prompt": "q2", "answer": "Paris"}, {"prompt": "q3"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    ds = load_dataset(str(path), num_prompts=None, seed=0)
    kinds = [e.answer_kind for e in ds.examples]
    assert kinds == [AnswerKind.GSM8K, AnswerKind.WORDS, AnswerKind.NONE] and ds.num_graded == 2
    assert is_correct(ds.examples[0], " 40 + 2 = 42\n#### 42") is True
    assert is_correct(ds.examples[0], "#### 41") is False
    assert is_correct(ds.examples[1], " Paris, France") is False and is_correct(ds.examples[1], " Paris is") is True
    assert is_correct(ds.examples[2], "anything") is None
    assert len(load_dataset(str(path), num_prompts=2, seed=0).examples) == 2


@pytest.mark.parametrize("content,needle", [
    ("not json\n", ":1: not JSON"), ('{"answer": "x"}\n', "string 'prompt'"), ("", "no prompts"),
    ('{"prompt": "p", "answer": "#### none"}\n', "no number"),
], ids=["not-json", "no-prompt", "empty", "bad-gsm8k"])
def test_bad_jsonl_is_refused_with_the_line(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=needle):
        load_dataset(str(path), num_prompts=None, seed=0)


def test_unknown_dataset_and_bad_count_are_refused():
    with pytest.raises(InputError, match="not 'synthetic'"):
        load_dataset("gsm8k", num_prompts=None, seed=0)
    with pytest.raises(InputError, match="at least 1"):
        load_dataset("synthetic", num_prompts=0, seed=0)


def test_thresholds_yaml_then_flags(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("max_accuracy_drop: 0.1\nmin_token_agreement: 0.5\n")
    t = resolve(path, {"min_token_agreement": 0.8, "max_logprob_drift": None})
    assert t == Thresholds(max_accuracy_drop=0.1, min_token_agreement=0.8)
    path.write_text("max_accuracy: 0.1\n")
    with pytest.raises(InputError, match="unknown keys"):
        resolve(path, {})
    with pytest.raises(InputError, match="between 0 and 1"):
        resolve(None, {"min_token_agreement": 1.5})


def test_the_committed_trained_model_is_the_default_and_matches_the_task():
    from hybridserve.core.launch.topology import TINY_MODEL_DIR
    from hybridserve.core.deployments.target import RECALL_MODEL_DIR, default_model, is_random_model

    assert default_model() == RECALL_MODEL_DIR and not is_random_model(None) and is_random_model(TINY_MODEL_DIR)
    assert sum(f.stat().st_size for f in RECALL_MODEL_DIR.iterdir()) <= 10 * 2**20  # the 10 MB
    # its tokenizer is exactly the task's word-level vocabulary: one token per word, no merges
    tokenizer = json.loads((RECALL_MODEL_DIR / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "WordLevel" and tokenizer["model"]["vocab"] == synthetic.vocabulary()
    config = json.loads((RECALL_MODEL_DIR / "config.json").read_text())
    assert config["eos_token_id"] == synthetic.EOS_ID and config["vocab_size"] >= len(synthetic.vocabulary())
