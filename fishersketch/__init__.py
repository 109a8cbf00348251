"""FisherSketch: streaming random-feature estimates of head-gradient Fisher alignment.

Reference implementation of the estimator of "Fisher Alignment at Vocabulary Scale" (Section
"FisherSketch: Scalable Estimation" and its appendices). Floor 1 of FisherAtlas: depends on torch and
numpy only; no I/O.

Quick start::

    from fishersketch import SketchSpec, Sketcher, SketchState, align, align_matrix

    spec = SketchSpec(d=4096, K=128256, m=4096, seed=0)   # error_projection="auto" -> "srht"
    sk = Sketcher(spec, device="cuda")
    state = SketchState.empty(spec)
    sk.update(state, a, e, sample_ids)                    # a (n, d), e (n, K), sample_ids (n,)
    result = align(state_i, state_j)                      # result.fisher, .activation, .error, .rho, .se

Modules: :mod:`~fishersketch.spec` (spec, fingerprint), :mod:`~fishersketch.rng` (SplitMix64 streams,
A/B split), :mod:`~fishersketch.projections` (int8 signs, SRHT), :mod:`~fishersketch.fwht`
(butterfly and Kronecker-GEMM Walsh–Hadamard), :mod:`~fishersketch.projector` (token projections, fixed-shape
chunks), :mod:`~fishersketch.inputs` (input checks), :mod:`~fishersketch.sketcher` (features, update),
:mod:`~fishersketch.state` (mergeable sums, serialisation), :mod:`~fishersketch.estimators`
(align, align_matrix, EB shrinkage), :mod:`~fishersketch.exact` (exact kernel reference),
:mod:`~fishersketch.synthetic` (tasks with controlled coupling), :mod:`~fishersketch.errors`.
"""

from fishersketch.errors import CorruptState, SketchError, SpecMismatch
from fishersketch.estimators import EB_C, EPS, AlignmentResult, MatrixResult, align, align_matrix
from fishersketch.exact import (
    ExactMatrix,
    ExactResult,
    exact_alignment,
    exact_alignment_naive,
    exact_matrix,
    exact_matrix_naive,
)
from fishersketch.projections import Projections, generate_projections
from fishersketch.rng import split_of, split_of_array
from fishersketch.sketcher import SampleStream, Sketcher
from fishersketch.spec import ALGORITHM_VERSION, AUTO_SRHT_MIN_K, SketchSpec
from fishersketch.state import FEATURES, FORMAT_VERSION, SPLITS, SketchState

__all__ = [
    "ALGORITHM_VERSION",
    "AUTO_SRHT_MIN_K",
    "EB_C",
    "EPS",
    "FEATURES",
    "FORMAT_VERSION",
    "SPLITS",
    "AlignmentResult",
    "CorruptState",
    "ExactMatrix",
    "ExactResult",
    "MatrixResult",
    "Projections",
    "SampleStream",
    "SketchError",
    "SketchSpec",
    "SketchState",
    "Sketcher",
    "SpecMismatch",
    "align",
    "align_matrix",
    "exact_alignment",
    "exact_alignment_naive",
    "exact_matrix",
    "exact_matrix_naive",
    "generate_projections",
    "split_of",
    "split_of_array",
]
