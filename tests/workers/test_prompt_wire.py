"""The prompt service's reply format (workers.prompt_remote): float32 sums of the non-empty splits."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.errors import AtlasError, NotFound
from atlas.ports import PromptStates
from fishersketch import SketchSpec, SketchState
from workers.prompt_remote import decode_reply, encode_reply

SPEC = SketchSpec(d=6, K=10, m=32, seed=3)


def _state(rng: np.random.Generator, splits: list[int], spec: SketchSpec = SPEC) -> SketchState:
    st = SketchState.empty(spec)
    for k in splits:
        st.sums[k] = rng.standard_normal((3, spec.m)) * 10 ** rng.uniform(-3, 3)
        st.sq_norms[k] = rng.uniform(0, 5, 3)
        st.token_counts[k] = rng.integers(1, 500)
        st.sample_counts[k] = rng.integers(1, 3)
    return st


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), layout=st.lists(st.sampled_from([[], [0], [1], [0, 1]]), max_size=5))
def test_reply_round_trip_keeps_each_state_to_float32(seed: int, layout: list[list[int]]) -> None:
    rng = np.random.default_rng(seed)
    states = [_state(rng, splits) for splits in layout]
    data = encode_reply("r1", states)
    rid, got = decode_reply(data, SPEC)
    assert rid == "r1" and isinstance(got, list) and len(got) == len(states)
    for a, b in zip(states, got, strict=True):
        np.testing.assert_allclose(b.sums, a.sums, rtol=1e-6, atol=0)  # empty splits stay exactly zero
        np.testing.assert_array_equal(b.sq_norms, a.sq_norms)
        np.testing.assert_array_equal(b.token_counts, a.token_counts)
        np.testing.assert_array_equal(b.sample_counts, a.sample_counts)
        b.sums += 1.0  # the decoded state is the caller's own, writable copy
    # a one-split prompt costs 3 m float32 (+ a fixed tail), a quarter of the stored blob's float64 sums
    one = encode_reply("r2", [_state(rng, [0])])
    assert len(one.partition(b"\n")[2]) == 3 * SPEC.m * 4 + 80


def test_reply_of_another_spec_or_length_or_an_error_is_refused() -> None:
    rng = np.random.default_rng(0)
    other = SketchSpec(d=6, K=10, m=32, seed=4)
    _, got = decode_reply(encode_reply("x", [_state(rng, [0], other)]), SPEC)
    assert isinstance(got, AtlasError) and "another sketch spec" in got.message
    data = encode_reply("y", [_state(rng, [1])])
    _, got = decode_reply(data[:-8], SPEC)
    assert isinstance(got, AtlasError) and "malformed" in got.message
    _, got = decode_reply(encode_reply("z", error=NotFound("gone", {"task": 1})), SPEC)
    assert isinstance(got, NotFound) and got.detail == {"task": 1}


def test_a_space_of_another_spec_or_model_is_refused_naming_what_differs(gpt2_lm: Any) -> None:
    """A space sketched with the same model but another sketch spec was refused as "no model … serves it;
    this process serves 'the same model'" (a store reopened with another --sketch-dim). It is a 409: this process
    serves one model and spec, so the 503 it answered (with a Retry-After) invited retries that could never succeed;
    a model of the same name but other weights (an imported space) is named by its fingerprints."""
    import pytest

    from atlas.errors import IncompatibleSpace
    from atlas.ports import SpaceKey
    from workers.extraction import Extractor
    from workers.prompt_batcher import InProcessPromptSketcher

    served = gpt2_lm.make_spec(m=256, seed=0)
    sketcher = InProcessPromptSketcher(Extractor(gpt2_lm, gpt2_lm.make_sketcher(served)), model_name="tiny")
    try:
        fp = gpt2_lm.fingerprint.key()
        sketcher.check_served(SpaceKey(1, "tiny", fp, served.fingerprint(), served.to_dict()))  # its own: served
        other = gpt2_lm.make_spec(m=1024, seed=0)
        with pytest.raises(IncompatibleSpace) as info:
            sketcher.check_served(SpaceKey(2, "tiny", fp, other.fingerprint(), other.to_dict()))
        assert info.value.status_code == 409
        assert "space 2 was sketched with m=1024, this process sketches with m=256" in str(info.value)
        with pytest.raises(IncompatibleSpace) as info:
            sketcher.check_served(SpaceKey(3, "other/model", "0" * 20, served.fingerprint(), served.to_dict()))
        assert "space 3 was sketched with the model 'other/model'; this process serves 'tiny'" in str(info.value)
        with pytest.raises(IncompatibleSpace) as info:
            sketcher.check_served(SpaceKey(4, "tiny", "1" * 20, served.fingerprint(), served.to_dict()))
        assert f"the model 'tiny' (fingerprint {'1' * 20}); this process serves 'tiny' (fingerprint {fp})" \
            in str(info.value)
    finally:
        sketcher.close()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 5), r=st.integers(1, 16))
def test_novelty_vectors_travel_beside_the_states(seed: int, n: int, r: int) -> None:
    """A reply of :class:`PromptStates` carries each prompt's novelty vector (float32) after the states; a reply
    without them (an older worker) decodes with ``novelty`` None; a wrong shape or length is refused."""
    rng = np.random.default_rng(seed)
    states = PromptStates.of([_state(rng, [0]) for _ in range(n)], rng.standard_normal((n, r)).astype(np.float32))
    _, got = decode_reply(encode_reply("v", states), SPEC)
    assert isinstance(got, PromptStates) and len(got) == n and got.novelty is not None
    np.testing.assert_array_equal(got.novelty, states.novelty)
    np.testing.assert_array_equal(got.part(1, 3).novelty, states.novelty[1:3])
    _, plain = decode_reply(encode_reply("w", list(states)), SPEC)
    assert isinstance(plain, PromptStates) and plain.novelty is None
    data = encode_reply("x", states)
    if n:  # a vector's last float missing
        _, cut = decode_reply(data[:-4], SPEC)
        assert isinstance(cut, AtlasError) and "malformed" in cut.message
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    header["novelty"] = [n + 1, r]
    _, lying = decode_reply(json.dumps(header).encode() + b"\n" + body, SPEC)
    assert isinstance(lying, AtlasError) and "malformed" in lying.message


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cut=st.lists(st.booleans(), max_size=6))
def test_truncation_flags_travel_beside_the_states(seed: int, cut: list[bool]) -> None:
    """A reply says which prompts were cut to the worker's token limit (a route answer's ``truncated``); a reply
    without the flags (an older worker) decodes with ``truncated`` None; a position out of range is refused."""
    rng = np.random.default_rng(seed)
    n = len(cut)
    states = PromptStates.of([_state(rng, [0]) for _ in range(n)], rng.standard_normal((n, 4)).astype(np.float32),
                             cut)
    _, got = decode_reply(encode_reply("t", states), SPEC)
    assert isinstance(got, PromptStates) and got.truncated == tuple(cut)
    assert got.part(1, 4).truncated == tuple(cut[1:4])
    _, plain = decode_reply(encode_reply("u", PromptStates.of(list(states), states.novelty)), SPEC)
    assert isinstance(plain, PromptStates) and plain.truncated is None
    head, _, body = encode_reply("v", states).partition(b"\n")
    for bad in ([n], [-1], ["0"], [True], 3):
        header = json.loads(head)
        header["truncated"] = bad
        _, lying = decode_reply(json.dumps(header).encode() + b"\n" + body, SPEC)
        assert isinstance(lying, AtlasError) and "malformed" in lying.message, bad
