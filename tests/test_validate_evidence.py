"""validate --save-completions keeps each side's completions, so a verdict can be judged again from them."""

import types

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.dataset import AnswerKind, Example
from hybridserve.core.validate.evidence import load_completions, write_completions
from hybridserve.core.validate.metrics import compare


def completion(tokens, lp):
    return Completion(text="".join(tokens), tokens=tuple(tokens), logprobs=tuple(lp), top2_gaps=(0.01, 3.0),
                      top=({tokens[0]: lp[0], "z": lp[0] - 0.01}, {tokens[1]: lp[1]}))


def test_completions_come_back_as_they_were_judged(tmp_path):
    base, cand = completion(["a", "b"], [-0.1, -0.2]), completion(["z", "b"], [-0.1, -0.3])
    report = types.SimpleNamespace(dataset="random", verdict=types.SimpleNamespace(thresholds=types.SimpleNamespace(
        near_tie_tolerance=0.05, max_logprob_drift=0.1)), baseline_answers=(base,), reference_answers=(),
        candidate_answers=(cand,))
    path = tmp_path / "evidence.json"
    write_completions(path, report)
    again_base, again_cand = load_completions(path, "baseline")[0], load_completions(path, "candidate")[0]
    assert again_base == base and again_cand == cand and load_completions(path, "reference") == ()
    ex = Example(prompt=(1, 2), answer=None, answer_kind=AnswerKind.NONE)
    assert compare(0, ex, again_base, again_cand, 0.05, 0.1) == compare(0, ex, base, cand, 0.05, 0.1)
    assert [p.name for p in tmp_path.iterdir()] == ["evidence.json"]  # no temporary file left


def test_a_file_that_is_not_evidence_is_refused_in_one_line(tmp_path):
    (tmp_path / "x.json").write_text('{"baseline": 3}')
    with pytest.raises(InputError, match=r"x.json: not a --save-completions file with a 'baseline' side"):
        load_completions(tmp_path / "x.json", "baseline")
