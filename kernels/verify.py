"""verify: every available backend and knob setting over the case matrix, against the float64 judge."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import CheckFailedError, CouldNotRunError
from hybridserve.kernels import naive
from hybridserve.kernels.backend import Backend, KnobSetting, knob_label
from hybridserve.kernels.cases import VerifyCase
from hybridserve.kernels.inputs import GdnInputs, make_inputs
from hybridserve.kernels.error_metrics import error_of
from hybridserve.kernels.timing import first_call_ms

# Relative L2 tolerance on o and on the final state, per input dtype. bf16 kernels were seen at a few 1e-3 (fla,
# FlashInfer); a wrong gate, a lost state or a swapped layout lands at O(1).
TOLERANCES = {DType.BFLOAT16: 2e-2, DType.FLOAT16: 1e-2, DType.FLOAT32: 2e-3}
TORCH_DTYPES = {DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16, DType.FLOAT32: torch.float32}

Progress = Callable[[str], None]


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "FAIL"
    ERROR = "ERROR"  # the kernel raised
    UNSUPPORTED = "unsupported"  # supports() said no: reported, not a failure

    @property
    def is_failure(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    backend: str
    knobs: str
    case_id: str
    status: Status
    o_error: float | None = None
    state_error: float | None = None
    tolerance: float
    reason: str | None = None
    call_ms: float | None = None  # wall time of the kernel call (synchronized on CUDA): compile time on a first call


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    device: str
    dtype: DType
    results: tuple[CaseResult, ...]
    unavailable: tuple[tuple[str, str], ...]  # (backend, reason)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if r.status.is_failure)

    @property
    def is_ok(self) -> bool:
        return not self.failures


def check_one(backend: Backend, knobs: KnobSetting, case: VerifyCase, x: GdnInputs,
              expected: tuple[torch.Tensor, torch.Tensor], tolerance: float) -> CaseResult:
    """Run one backend setting on one case and judge it; an exception is an ERROR result, never a crash."""
    base = dict(backend=backend.name, knobs=knob_label(knobs), case_id=case.case_id, tolerance=tolerance)
    ok, reason = backend.supports(case.shape, x.q.dtype, x.q.device)
    if not ok:
        return CaseResult(**base, status=Status.UNSUPPORTED, reason=reason)
    out: list = []

    def call() -> None:
        out.append(backend.prefill(**x.as_kwargs(), output_final_state=True,
                                   max_seqlen=max(case.shape.seqlens, default=0), **dict(knobs)))

    try:
        call_ms = first_call_ms(call, x.q.device)
    except Exception as exc:  # a kernel that raises fails its case with the reason, verify goes on
        return CaseResult(**base, status=Status.ERROR, reason=f"{type(exc).__name__}: {exc}"[:200])
    (o, state), = out
    o_err, state_err = error_of(o, expected[0]), error_of(state, expected[1])
    passed = o_err.is_within(tolerance) and state_err.is_within(tolerance)
    return CaseResult(**base, status=Status.PASS if passed else Status.FAIL, o_error=o_err.relative_l2,
                      state_error=state_err.relative_l2, call_ms=round(call_ms, 3))


def run_verify(
    backends: list[Backend], cases: list[VerifyCase], *, dtype: DType = DType.BFLOAT16,
    device: str | None = None, tolerance: float | None = None, progress: Progress | None = None,
) -> VerifyReport:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CouldNotRunError("--device cuda: no CUDA GPU visible here; accepted: cpu")
    tol = TOLERANCES[dtype] if tolerance is None else tolerance
    usable, unavailable = [], []
    for b in backends:
        ok, reason = b.availability()
        (usable.append(b) if ok else unavailable.append((b.name, reason)))
    if not usable:
        raise CouldNotRunError("verify: no backend available here: " +
                               "; ".join(f"{n}: {r}" for n, r in unavailable))
    results = []
    for i, case in enumerate(cases):
        x = make_inputs(case.shape, dtype=TORCH_DTYPES[dtype], device=dev, seed=1000 + i,
                        has_initial_state=case.has_initial_state)
        expected = naive.gdn_prefill(**x.as_kwargs())
        for b in usable:
            for knobs in b.knob_space(case.shape):
                if progress:
                    progress(f"{b.name} {knob_label(knobs)} {case.case_id}")
                results.append(check_one(b, knobs, case, x, expected, tol))
    return VerifyReport(device=str(dev), dtype=dtype, results=tuple(results), unavailable=tuple(unavailable))


def count_steps(backends: list[Backend], cases: list[VerifyCase]) -> int:
    return sum(len(b.knob_space(c.shape)) for c in cases for b in backends if b.availability().is_ok)


def require_pass(report: VerifyReport) -> None:
    if report.failures:
        names = sorted({f"{r.backend}[{r.knobs}]:{r.case_id}" for r in report.failures})
        raise CheckFailedError(f"verify: {len(report.failures)} case(s) failed: {', '.join(names[:8])}"
                               + (" ..." if len(names) > 8 else ""))
