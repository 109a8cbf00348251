"""Feature maps and streaming updates: the compute side of FisherSketch.

For one token ``(a, e)`` and coordinate ``j`` (all scaled by ``1/sqrt(m)``)::

    u_j = r_a,j · a      u'_j = r'_a,j · a      v_j = r_e,j · e      v'_j = r'_e,j · e
    ψ_a = u u' / √m      ψ_e = v v' / √m        ψ_ae = u u' v v' / √m

so that ``E<Ψ_ae(x), Ψ_ae(x')> = ((a·a')(e·e'))²``, ``E<Ψ_a, Ψ_a'> = (a·a')²`` and
``E<Ψ_e, Ψ_e'> = (e·e')²`` over the projections. For ``granularity="sequence"`` the draws are samples
``s`` with tokens ``t``: ``ψ_ae = (Σ_t u_t v_t)(Σ_t u'_t v'_t)/√m`` (the shared-parameter kernel
``(Σ_{t,t'} (a_t·a'_t')(e_t·e'_t'))²``), ``ψ_a = Σ_t u_t u'_t/√m`` and ``ψ_e = Σ_t v_t v'_t/√m``
(features of ``Σ_t a_t a_tᵀ`` and ``Σ_t e_t e_tᵀ``). The four per-sample sums are additive over
tokens, so :class:`SampleStream` (:meth:`Sketcher.stream`) carries a sample's partial sums across calls
when its tokens arrive in pieces; it also counts each sample once (``update(..., sample_starts=...)``).

The projections themselves (compute paths, fixed-shape chunks, reproducibility) are
:mod:`fishersketch.projector`'s; the input checks :mod:`fishersketch.inputs`'.

Validation. Shapes and dtypes are checked before any work. NaN/Inf are detected without scanning the
(n, K) errors: any NaN/Inf in ``a`` or ``e`` makes the float64 Σ‖ψ‖² of the call non-finite, which is
checked before the state is touched (then the inputs are scanned once to name the culprit).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fishersketch.errors import SketchError, SpecMismatch
from fishersketch.inputs import all_finite, check_flags, check_starts, nonfinite_message
from fishersketch.projector import Projector
from fishersketch.rng import split_of_array
from fishersketch.state import SketchState

__all__ = ["SampleStream", "Sketcher"]


class Sketcher(Projector):
    """Holds the projections of a spec on a device and computes features and state updates.

    Parameters
    ----------
    spec : SketchSpec
    device : torch.device or str, default "cpu"
    dtype : torch.dtype, default torch.float32
        Compute dtype of the activation GEMM: float32, float64, bfloat16 or float16 (bfloat16 is
        ~2.5x faster on CPUs with AVX512-BF16 and on GPUs; it rounds the activations to 8 mantissa
        bits). Error-side arithmetic and the products of projections are always float32 (float64 if
        ``dtype`` is float64); sums are float64.
    chunk_rows : int, optional
        Rows per fixed-shape chunk (default 256 on CPU, 1024 on CUDA); on the SRHT error path rounded up to a
        multiple of its power-of-two token block (300 becomes 384, 5 becomes 8: read the used value from
        ``.chunk_rows``). States are bit-reproducible across batchings only for the same used ``chunk_rows`` and
        device.
    fwht_method : {"auto", "kron", "butterfly"}, default "auto"
        FWHT algorithm of the SRHT path (:func:`fishersketch.fwht.choose_plan`).
    cache_weights : bool, optional
        Keep compute-dtype copies of the int8 sign matrices (faster; ``4x`` the int8 memory for
        float32). Default: cache each matrix whose copy is at most 512 MiB.

    Notes
    -----
    A Sketcher holds no mutable state besides caches filled at construction, so one instance can be
    used from several threads.
    """

    # -- features ----------------------------------------------------------------------------------

    def _token_features(self, u: torch.Tensor, u2: torch.Tensor, v: torch.Tensor, v2: torch.Tensor,
                        out: torch.Tensor) -> torch.Tensor:
        """Write (ψ_ae, ψ_a, ψ_e) of c tokens into ``out`` (c, 3, m); computed in the error dtype."""
        s = self._inv_sqrt_m
        pa = u * u2
        pe = v * v2
        torch.mul(pa, s, out=out[:, 1])
        torch.mul(pe, s, out=out[:, 2])
        pa.mul_(pe)
        torch.mul(pa, s, out=out[:, 0])
        return out

    def _sequence_sums(self, a: torch.Tensor, e: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
        """Per-group float64 sums of (u v, u' v', u u', v v'): (n_groups, 4, m).

        ``inverse`` (n,) int64 gives each token's group in [0, n_groups); groups without tokens are zero.
        """
        m = self.spec.m
        acc = torch.zeros(n_groups, 4 * m, dtype=torch.float64, device=self.device)
        for lo, hi, u, u2, v, v2 in self._iter_projections(a, e):
            prods = torch.cat([u * v, u2 * v2, u * u2, v * v2], dim=1).to(torch.float64)  # (c, 4m)
            grp = inverse[lo:hi]
            local, local_inv = torch.unique(grp, return_inverse=True)
            onehot = torch.zeros(local.numel(), hi - lo, dtype=torch.float64, device=self.device)
            onehot[local_inv, torch.arange(hi - lo, device=self.device)] = 1.0
            acc.index_add_(0, local, onehot @ prods)
        return acc.view(n_groups, 4, m)

    def _sequence_features(self, acc: torch.Tensor) -> torch.Tensor:
        """(S, 3, m) float64 features (ae, a, e) from per-sample sums."""
        s = self._inv_sqrt_m
        return torch.stack([acc[:, 0] * acc[:, 1] * s, acc[:, 2] * s, acc[:, 3] * s], dim=1)


    def features(self, a: Any, e: Any,
                 sample_ids: Any | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Feature vectors ``(ψ_ae, ψ_a, ψ_e)``, already scaled by ``1/sqrt(m)``.

        Parameters
        ----------
        a : tensor or array, (n, d)
            Activations (head inputs).
        e : tensor or array, (n, K)
            Errors: per token, the gradient of that token's loss with respect to the head outputs (softmax −
            one-hot for cross-entropy, DESIGN.md). Any scale gives the same estimates (a mean-reduced loss's
            gradient, divided by the token count, included): the estimators are scale-free.
        sample_ids : tensor or array of int, (n,), optional
            Only used for ``granularity="sequence"``: tokens with the same id form one sample
            (default: all tokens form one sample).

        Returns
        -------
        psi_ae, psi_a, psi_e : torch.Tensor
            Each (n, m) float32 for token granularity (float64 when ``dtype`` is float64); for
            sequence granularity each (S, m), one row per distinct sample id in increasing id order.

        Raises
        ------
        SketchError
            Wrong shapes, non-floating or non-finite inputs.
        """
        a, e, ids = self._check(a, e, sample_ids)
        m, n = self.spec.m, a.shape[0]
        if self.spec.granularity == "token":
            out = torch.empty(n, 3, m, dtype=self.err_dtype, device=self.device)
            for lo, hi, u, u2, v, v2 in self._iter_projections(a, e):
                self._token_features(u, u2, v, v2, out[lo:hi])
            if not all_finite(out):
                raise SketchError(nonfinite_message(a, e))
            return out[:, 0].contiguous(), out[:, 1].contiguous(), out[:, 2].contiguous()
        if ids is None:
            ids = np.zeros(n, dtype=np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        if n == 0:
            z = torch.zeros(0, m, dtype=self.err_dtype, device=self.device)
            return z, z.clone(), z.clone()
        inv_t = torch.from_numpy(inverse.reshape(-1).astype(np.int64)).to(self.device)
        feats = self._sequence_features(self._sequence_sums(a, e, inv_t, len(uniq)))
        if not all_finite(feats.square()):
            raise SketchError(nonfinite_message(a, e))
        feats = feats.to(self.err_dtype)
        return feats[:, 0].contiguous(), feats[:, 1].contiguous(), feats[:, 2].contiguous()

    # -- streaming update --------------------------------------------------------------------------

    def _check_state(self, state: Any) -> None:
        if not isinstance(state, SketchState):
            raise SketchError(f"state must be a SketchState, got {type(state).__name__}")
        if state.spec.fingerprint() != self.spec.fingerprint():
            raise SpecMismatch(f"state spec {state.spec.describe()} does not match sketcher spec "
                               f"{self.spec.describe()}")

    def _draw_sums(self, x: torch.Tensor, split: torch.Tensor,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Add Σψ and Σ‖ψ‖² per split of draws ``x`` (c, 3, m) float64 (overwritten) to ``out``.

        Returns ``(sums (2, 3·m), sq (2, 3))`` float64 (``out`` itself when given).
        """
        m = self.spec.m
        if out is None:
            out = (torch.zeros(2, 3 * m, dtype=torch.float64, device=self.device),
                   torch.zeros(2, 3, dtype=torch.float64, device=self.device))
        sums, sq = out
        c = x.shape[0]
        w = torch.zeros(2, c, dtype=torch.float64, device=self.device)
        w[split, torch.arange(c, device=self.device)] = 1.0
        sums.add_(w @ x.reshape(c, 3 * m))
        sq.add_(w @ x.square_().sum(dim=2))
        return out

    def _commit(self, state: SketchState, sums: torch.Tensor, sq: torch.Tensor, token_counts: np.ndarray,
                sample_counts: np.ndarray, a: torch.Tensor, e: torch.Tensor) -> None:
        """Check the call's sums for NaN/Inf, then add them to ``state`` (nothing is written on error).

        Σ‖ψ‖² (float64) is finite iff every feature is: NaN/Inf anywhere in a or e shows up here.
        """
        sq_np = sq.cpu().numpy()
        sums_np = sums.view(2, 3, self.spec.m).cpu().numpy()
        if not (np.all(np.isfinite(sq_np)) and np.all(np.isfinite(sums_np))):
            raise SketchError(nonfinite_message(a, e))
        state._accumulate(sums_np, sq_np, token_counts.astype(np.int64), sample_counts.astype(np.int64))


    def update(self, state: SketchState, a: Any, e: Any, sample_ids: Any, *,
               sample_starts: Any | None = None) -> SketchState:
        """Stream a batch of tokens into ``state`` (in place).

        Parameters
        ----------
        state : SketchState
            A state of the same spec.
        a : tensor or array, (n, d)
        e : tensor or array, (n, K)
        sample_ids : tensor or array of int, (n,)
            Sample of each token. The A/B split of a token is ``split_of(sample_id, spec.seed)``.
        sample_starts : tensor or array of bool, (n,), optional
            True at the first token of each sample. The tokens of a sample are then contiguous: a
            sample runs from its start to the next start, and a change of id must coincide with a
            start. The call counts one sample per True (so a sample whose tokens come in several calls
            is counted once, by the call holding its first token, and two samples with equal ids count
            twice). Default: every distinct id of the call counts as one sample (tokens of an id need
            not be contiguous).

        Notes
        -----
        Token granularity: tokens are the draws; samples only count. Sequence granularity: a draw is
        a whole sample, so every sample must be complete in this call (with ``sample_starts``,
        ``sample_starts[0]`` must be True); by default tokens with the same id form one sample, with
        ``sample_starts`` each start begins a new one. To feed a sample in pieces (e.g. logits chunks)
        use :meth:`stream`, which gives the same state as one call per whole sample.

        Returns
        -------
        SketchState
            ``state`` itself.

        Raises
        ------
        SpecMismatch
            ``state`` has another spec.
        SketchError
            Bad shapes, dtypes, NaN/Inf, inconsistent ``sample_starts``. The state is left untouched on
            any error.
        """
        self._check_state(state)
        if sample_ids is None:
            raise SketchError("sample_ids are required (one integer per token)")
        a, e, ids = self._check(a, e, sample_ids)
        assert ids is not None
        starts = None if sample_starts is None else check_starts(sample_starts, ids)
        n = a.shape[0]
        if n == 0:
            return state
        token_split = split_of_array(ids, self.spec.seed)
        token_counts = np.bincount(token_split, minlength=2)
        if self.spec.granularity == "token":
            if starts is None:
                _, first = np.unique(ids, return_index=True)
                sample_counts = np.bincount(token_split[first], minlength=2)
            else:
                sample_counts = np.bincount(token_split[starts], minlength=2)
            split_t = torch.from_numpy(token_split).to(self.device)
            out = None
            buf = torch.empty(self.chunk_rows, 3, self.spec.m, dtype=torch.float64, device=self.device)
            for lo, hi, u, u2, v, v2 in self._iter_projections(a, e):
                x = self._token_features(u, u2, v, v2, buf[: hi - lo])
                out = self._draw_sums(x, split_t[lo:hi], out)
            assert out is not None
            self._commit(state, *out, token_counts, sample_counts, a, e)
            return state

        if starts is None:
            _, first, group = np.unique(ids, return_index=True, return_inverse=True)
            group = group.reshape(-1)
        else:
            if not starts[0]:
                raise SketchError("sequence granularity: the first token of the call continues a sample from "
                                  "an earlier call; feed samples in pieces through Sketcher.stream()")
            first = np.flatnonzero(starts)
            group = np.cumsum(starts) - 1
        sample_split = token_split[first]
        group_t = torch.from_numpy(group.astype(np.int64)).to(self.device)
        feats = self._sequence_features(self._sequence_sums(a, e, group_t, first.size))
        out = self._draw_sums(feats, torch.from_numpy(sample_split).to(self.device))
        self._commit(state, *out, token_counts, np.bincount(sample_split, minlength=2), a, e)
        return state

    def stream(self, state: SketchState) -> SampleStream:
        """A :class:`SampleStream` writing into ``state``: feed samples in pieces, in order."""
        return SampleStream(self, state)

    def sketch(self, a: Any, e: Any, sample_ids: Any, *, sample_starts: Any | None = None) -> SketchState:
        """A new state holding one batch (``update`` of an empty state).

        Parameters
        ----------
        a : tensor or array, (n, d)
            Head inputs (last hidden states) of the batch's n tokens.
        e : tensor or array, (n, K)
            Their output errors (softmax minus one-hot, or the spec's error kind).
        sample_ids : tensor or array of int, (n,)
            Sample of each token.
        sample_starts : tensor or array of bool, (n,), optional
            True at the first token of each sample (see :meth:`update`).

        Returns
        -------
        SketchState
        """
        return self.update(SketchState.empty(self.spec), a, e, sample_ids, sample_starts=sample_starts)

    def __repr__(self) -> str:
        plan = self.plan.describe() if self.plan is not None else "dense"
        return (f"Sketcher({self.spec.describe()}, device={self.device}, dtype={self.dtype}, "
                f"chunk_rows={self.chunk_rows}, errors={plan})")


class SampleStream:
    """Feeds samples into a state in pieces (e.g. logits chunks), counting and sketching each once.

    Create with :meth:`Sketcher.stream`. Tokens arrive in sample order: each :meth:`add` call holds the
    rest of the sample left open by the previous call (if any), then whole samples, then possibly the
    beginning of a sample that stays open (its last token not yet seen). The state then equals one
    :meth:`Sketcher.update` call per whole sample, up to float64 rounding of the sums, whatever the
    pieces:

    * token granularity: tokens go into the state at once; a sample is counted once, by the call
      holding its first token (``update(..., sample_starts=...)``).
    * sequence granularity: the per-sample sums ``(Σ_t u_t v_t, Σ_t u'_t v'_t, Σ_t u_t u'_t,
      Σ_t v_t v'_t)`` are additive over tokens, so the open sample's partial sums (float64, 4·m
      numbers) are carried to the next call; a sample enters the state (its draw ψ, its tokens, its
      count) only when its last token has been seen, so the state never holds part of a sample.

    Two consecutive samples with the same id are distinct samples (they are delimited by
    ``sample_ends``, not by ids). Not thread-safe (one stream per producer); the sketcher is.

    Parameters
    ----------
    sketcher : Sketcher
    state : SketchState
        Same spec; written in place.

    Examples
    --------
    >>> stream = sketcher.stream(state)                      # doctest: +SKIP
    >>> for a, e, ids, last in chunks:                        # doctest: +SKIP
    ...     stream.add(a, e, ids, sample_ends=last)
    >>> stream.close()                                       # doctest: +SKIP
    """

    def __init__(self, sketcher: Sketcher, state: SketchState) -> None:
        if not isinstance(sketcher, Sketcher):
            raise SketchError(f"sketcher must be a Sketcher, got {type(sketcher).__name__}")
        sketcher._check_state(state)
        self.sketcher = sketcher
        self.state = state
        self._open_id: int | None = None
        self._open_sums: torch.Tensor | None = None  # (4, m) float64, sequence granularity only
        self._open_tokens = 0

    @property
    def open_sample(self) -> int | None:
        """Id of the sample whose last token has not been seen yet (None between samples)."""
        return self._open_id

    def add(self, a: Any, e: Any, sample_ids: Any, sample_ends: Any | None = None) -> SketchState:
        """Add the next tokens.

        Parameters
        ----------
        a : tensor or array, (n, d)
        e : tensor or array, (n, K)
        sample_ids : tensor or array of int, (n,)
        sample_ends : tensor or array of bool, (n,), optional
            True at the last token of each sample. A sample whose last token is not in this call stays
            open and continues at the first token of the next call (which must carry the same id).
            Default: every sample of the call ends in it (True where the id changes and at the last
            token).

        Returns
        -------
        SketchState
            The stream's state.

        Raises
        ------
        SketchError
            Bad shapes, dtypes, NaN/Inf; an id change that is not at a sample end; a call whose first
            id differs from the open sample's. The state and the stream are left untouched on any error.
        """
        sk = self.sketcher
        a, e, ids = sk._check(a, e, sample_ids)
        if ids is None:
            raise SketchError("sample_ids are required (one integer per token)")
        n = a.shape[0]
        if sample_ends is None:
            ends = np.ones(n, dtype=bool)
            if n > 1:
                ends[:-1] = ids[1:] != ids[:-1]
        else:
            ends = check_flags(sample_ends, ids, "sample_ends")
        if n == 0:
            return self.state
        if self._open_id is not None and int(ids[0]) != self._open_id:
            raise SketchError(f"sample {self._open_id} is open (its last token was not marked in sample_ends) "
                              f"but the next token belongs to sample {int(ids[0])}")
        starts = np.empty(n, dtype=bool)
        starts[0] = self._open_id is None
        starts[1:] = ends[:-1]
        starts = check_starts(starts, ids)  # an id change must be at a sample end
        if sk.spec.granularity == "token":
            sk.update(self.state, a, e, ids, sample_starts=starts)
        else:
            self._add_sequence(a, e, ids, starts, bool(ends[-1]))
        self._open_id = None if ends[-1] else int(ids[-1])
        return self.state

    def _add_sequence(self, a: torch.Tensor, e: torch.Tensor, ids: np.ndarray, starts: np.ndarray,
                      last_ends: bool) -> None:
        """Sequence granularity: fold the call's samples into the state, carry the open one."""
        sk = self.sketcher
        # Group 0 continues the open sample (empty when none is open); group g ≥ 1 is the g-th start.
        group = np.cumsum(starts, dtype=np.int64)
        n_groups = int(group[-1]) + 1
        sums = sk._sequence_sums(a, e, torch.from_numpy(group).to(sk.device), n_groups)  # (G, 4, m)
        tokens = np.bincount(group, minlength=n_groups)
        is_open = self._open_id is not None
        if is_open:
            assert self._open_sums is not None
            sums[0] += self._open_sums
            tokens[0] += self._open_tokens
        if not all_finite(sums):
            raise SketchError(nonfinite_message(a, e))
        gid = np.empty(n_groups, dtype=np.int64)
        gid[group] = ids
        lo, hi = (0 if is_open else 1), (n_groups if last_ends else n_groups - 1)
        if hi > lo:
            split = split_of_array(gid[lo:hi], sk.spec.seed)
            out = sk._draw_sums(sk._sequence_features(sums[lo:hi]), torch.from_numpy(split).to(sk.device))
            token_counts = np.bincount(split, weights=tokens[lo:hi], minlength=2).astype(np.int64)
            sk._commit(self.state, *out, token_counts, np.bincount(split, minlength=2), a, e)
        if last_ends:
            self._open_sums, self._open_tokens = None, 0
        else:
            self._open_sums, self._open_tokens = sums[-1].clone(), int(tokens[-1])

    def close(self) -> SketchState:
        """Check that no sample is left open and return the state.

        Raises
        ------
        SketchError
            A sample's last token was never seen (its partial sums are dropped, the state is unchanged).
        """
        if self._open_id is not None:
            sid = self._open_id
            self._open_id, self._open_sums, self._open_tokens = None, None, 0
            raise SketchError(f"sample {sid} was not finished (no token of it was marked in sample_ends)")
        return self.state

    def __enter__(self) -> SampleStream:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()

    def __repr__(self) -> str:
        return f"SampleStream({self.state!r}, open_sample={self._open_id})"
