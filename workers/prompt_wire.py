"""The prompt service's reply format over Redis (:mod:`workers.prompt_remote`): a JSON header line (with the
positions of the prompts cut to the token limit), then each prompt's state as float32 sums of its non-empty splits,
then the prompts' novelty vectors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from atlas import errors as domain_errors
from atlas.errors import AtlasError, ModelUnavailable
from atlas.novelty import NOVELTY_DIM
from atlas.ports import PromptStates
from fishersketch import SketchSpec, SketchState


def _error_classes() -> dict[str, type[AtlasError]]:
    """Domain error classes by code (to raise a worker's error in the API process)."""
    out: dict[str, type[AtlasError]] = {}
    for obj in vars(domain_errors).values():
        if isinstance(obj, type) and issubclass(obj, AtlasError):
            out.setdefault(obj.code, obj)
    return out


def encode_reply(request_id: str, states: Sequence[SketchState] | None = None,
                 error: AtlasError | None = None) -> bytes:
    """A reply: JSON header line (id, spec fingerprint, per state its non-empty splits and byte length, or the
    error), then the states back to back.

    A state travels as the ``sums`` of its non-empty splits in little-endian float32 (a prompt fills one
    split: ``3 m`` floats, 48 KiB at m = 4096, a quarter of ``SketchState.to_bytes``), then ``sq_norms``
    (float64) and the token and sample counts (int64). float32 keeps the route scores to ~1e-7; the
    receiver accumulates nothing into these states. When ``states`` is a :class:`atlas.ports.PromptStates` with
    novelty vectors, the header's ``novelty`` gives their shape ``[n, r]`` and they follow the states (float32);
    with truncation flags, the header's ``truncated`` lists the positions of the prompts cut to the token limit.
    """
    header: dict[str, Any]
    if error is not None:
        header = {"id": request_id, "error": {"code": error.code, "message": error.message, "detail": error.detail,
                                              "retry_after_s": error.retry_after_s}}
        return json.dumps(header).encode() + b"\n"
    blobs, splits = [], []
    for st in states or ():
        used = [k for k in (0, 1) if st.token_counts[k] or st.sample_counts[k] or st.sq_norms[k].any()
                or st.sums[k].any()]
        splits.append(used)
        blobs.append(b"".join([st.sums[used].astype("<f4").tobytes(), st.sq_norms.astype("<f8").tobytes(),
                               st.token_counts.astype("<i8").tobytes(), st.sample_counts.astype("<i8").tobytes()]))
    header = {"id": request_id, "fingerprint": states[0].spec.fingerprint() if states else None,
              "splits": splits, "lengths": [len(b) for b in blobs]}
    truncated = getattr(states, "truncated", None)
    if truncated is not None:
        header["truncated"] = [i for i, cut in enumerate(truncated) if cut]
    novelty = getattr(states, "novelty", None)
    if novelty is not None:
        header["novelty"] = list(novelty.shape)
        blobs.append(np.ascontiguousarray(novelty, dtype="<f4").tobytes())
    return json.dumps(header).encode() + b"\n" + b"".join(blobs)


_TAIL = 6 * 8 + 2 * 8 + 2 * 8
"""Bytes after a state's sums on the wire: ``sq_norms`` (2, 3) float64, token and sample counts (2,) int64."""


def decode_reply(data: bytes, spec: SketchSpec) -> tuple[str, list[SketchState] | AtlasError]:
    """Inverse of :func:`encode_reply`: ``(request id, states or the error to raise)``; a reply for another
    sketch spec or of the wrong length is an error (503: a worker of another version or a corrupt message), not
    states. A reply without the fields of its kind raises (the caller fails its request)."""
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    if "error" in header:
        err = header["error"]
        cls = _error_classes().get(err.get("code"), AtlasError)
        return header["id"], cls(err.get("message", "worker error"), err.get("detail"),
                                 retry_after_s=err.get("retry_after_s"))
    lengths, splits = header["lengths"], header["splits"]
    if lengths and header.get("fingerprint") != spec.fingerprint():
        return header["id"], ModelUnavailable("the worker replied with states of another sketch spec; retry",
                                              {"expected": spec.fingerprint(), "got": header.get("fingerprint")},
                                              retry_after_s=1.0)
    states, at, m = [], 0, spec.m
    for n, used in zip(lengths, splits, strict=True):
        if n != len(used) * 3 * m * 4 + _TAIL or at + n > len(body) or not set(used) <= {0, 1}:
            return header["id"], ModelUnavailable("the worker's reply is malformed; retry",
                                                  {"length": n, "splits": used}, retry_after_s=1.0)
        sums = np.zeros((2, 3, m))
        cut = len(used) * 3 * m * 4
        sums[used] = np.frombuffer(body, "<f4", len(used) * 3 * m, at).reshape(len(used), 3, m)
        tail = at + cut
        states.append(SketchState(spec, sums, np.frombuffer(body, "<f8", 6, tail).reshape(2, 3).copy(),
                                  np.frombuffer(body, "<i8", 2, tail + 48).copy(),
                                  np.frombuffer(body, "<i8", 2, tail + 64).copy()))
        at += n
    shape = header.get("novelty")
    novelty = None
    if shape is not None:
        if (not isinstance(shape, list) or len(shape) != 2 or shape[0] != len(states)
                or not isinstance(shape[1], int) or not 0 < shape[1] <= NOVELTY_DIM
                or len(body) - at != 4 * shape[0] * shape[1]):
            return header["id"], ModelUnavailable("the worker's reply is malformed; retry", {"novelty": shape},
                                                  retry_after_s=1.0)
        novelty = np.frombuffer(body, "<f4", shape[0] * shape[1], at).reshape(shape[0], shape[1]).copy()
    cut = header.get("truncated")
    truncated = None
    if cut is not None:
        if not isinstance(cut, list) or not all(type(i) is int and 0 <= i < len(states) for i in cut):
            return header["id"], ModelUnavailable("the worker's reply is malformed; retry", {"truncated": cut},
                                                  retry_after_s=1.0)
        cut_at = set(cut)
        truncated = [i in cut_at for i in range(len(states))]
    return header["id"], PromptStates.of(states, novelty, truncated)
