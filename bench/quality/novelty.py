"""Offline study of the open-set novelty test (:mod:`atlas.novelty`) on experiment 4d's data families.

The product's novelty test asks whether a prompt's mean head input is typical of the answered task's samples.
This script measures candidate tests on the vectors alone, without routing, so that a change of the test can be
judged in minutes before the end-to-end benchmarks (4d, 4e) are re-run:

* **maha** — the shipped test: distance to the task's mean in the pooled within-task covariance;
* **relative** — relative Mahalanobis (Ren et al. 2021, "A simple fix to Mahalanobis distance for improving
  near-OOD detection"): the same distance less the distance to one background Gaussian of all the space's
  vectors (its mean and total covariance), so that directions in which the whole space is spread out do not
  count as novelty;
* **knn** — the distance to the task's ``k``-th nearest sample in the pooled within-task whitening (Sun et al.
  2022, "Out-of-distribution detection with deep nearest neighbors");
* **task_cov** — the distance in the task's own covariance shrunk half-way to the pooled one.

Every test is calibrated as the product calibrates (:meth:`atlas.novelty.SpaceNovelty.threshold`: the
split-conformal quantile of the task's cross-fitted own scores, at the false-reject rate). Per draw of 4d's
protocol (20 % of the families unseen, ``--signature`` samples per indexed family, ``--heldout`` prompts per
family) it reports, for the test alone at the rate: "none" on indexed prompts (tested against their own task),
"none" on unseen prompts when each is tested against the task of nearest mean (``nearest``) and when it must be
rejected by every indexed task (``all``), and the AUROC of ``min_t score_t / threshold_t`` (indexed vs unseen).

Run: ``python -m bench.quality.novelty --threads 2`` (about 80 s on 2 cores; prints its table, writes only ``--out``).

``--layers`` asks which representation to test instead: the shipped and relative distances on the mean hidden
state of every layer of the model, as ``transformers`` returns them with ``output_hidden_states`` (``h0`` the
embeddings, ``h1`` … ``hL`` each block's output, the last after the final norm: the head input, unprojected), and
on all blocks' means concatenated (about 2 min).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from atlas.novelty import FOLDS, MIN_NOVELTY_SAMPLES, RIDGE, SpaceNovelty, _inverse_root
from atlas.route_calibration import FALSE_REJECT_RATE
from bench.quality.common import load_model, log, make_extractor
from bench.quality.novelty_vectors import text_vectors
from bench.quality.openset_families import family_args, family_parser, family_tasks, split_texts

KNN_K = 5


def _whitener(scatter: np.ndarray, dof: int, ridge: float = RIDGE) -> np.ndarray:
    return _inverse_root(scatter, dof, ridge)  # the product's shrinkage and inverse square root


Scorer = Callable[[Mapping[int, np.ndarray]], Callable[[np.ndarray, int], np.ndarray]]
"""Fits a test on each task's vectors and returns ``score(x (n, r), task) -> (n,)`` (larger: more novel)."""


def _pooled(groups: Mapping[int, np.ndarray]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    mus = {t: x.mean(0) for t, x in groups.items()}
    scatter = sum((x - mus[t]).T @ (x - mus[t]) for t, x in groups.items())
    dof = sum(len(x) - 1 for x in groups.values())
    return _whitener(np.asarray(scatter), dof), mus


def maha(groups: Mapping[int, np.ndarray]) -> Callable[[np.ndarray, int], np.ndarray]:
    w, mus = _pooled(groups)
    return lambda x, t: (((x - mus[t]) @ w) ** 2).sum(1) / w.shape[0]


def relative(groups: Mapping[int, np.ndarray]) -> Callable[[np.ndarray, int], np.ndarray]:
    w, mus = _pooled(groups)
    allx = np.concatenate(list(groups.values()))
    mu0 = allx.mean(0)
    w0 = _whitener((allx - mu0).T @ (allx - mu0), len(allx) - 1)
    r = w.shape[0]
    return lambda x, t: ((((x - mus[t]) @ w) ** 2).sum(1) - (((x - mu0) @ w0) ** 2).sum(1)) / r


def knn(groups: Mapping[int, np.ndarray]) -> Callable[[np.ndarray, int], np.ndarray]:
    w, _ = _pooled(groups)
    white = {t: x @ w for t, x in groups.items()}

    def score(x: np.ndarray, t: int) -> np.ndarray:
        d = ((x @ w)[:, None, :] - white[t][None, :, :]) ** 2
        dist = np.sort(d.sum(2), axis=1)
        return dist[:, min(KNN_K, dist.shape[1]) - 1] / w.shape[0]
    return score


def task_cov(groups: Mapping[int, np.ndarray], mix: float = 0.5) -> Callable[[np.ndarray, int], np.ndarray]:
    mus = {t: x.mean(0) for t, x in groups.items()}
    pooled_scatter = sum((x - mus[t]).T @ (x - mus[t]) for t, x in groups.items())
    pooled = np.asarray(pooled_scatter) / sum(len(x) - 1 for x in groups.values())
    ws = {t: _whitener((1 - mix) * (x - mus[t]).T @ (x - mus[t]) / (len(x) - 1) + mix * pooled, 1)
          for t, x in groups.items()}
    return lambda x, t: (((x - mus[t]) @ ws[t]) ** 2).sum(1) / ws[t].shape[0]


SCORERS: dict[str, Scorer] = {"maha": maha, "relative": relative, "knn": knn, "task_cov": task_cov}


def calibrated(scorer: Scorer, groups: Mapping[int, np.ndarray], folds: int = FOLDS,
               rate: float = FALSE_REJECT_RATE) -> tuple[Callable[[np.ndarray, int], np.ndarray], dict[int, float]]:
    """The test fitted on every vector and each task's threshold from cross-fitted own scores (as
    :meth:`atlas.novelty.SpaceNovelty.fit` does)."""
    fold_of = {t: np.arange(len(x)) % folds for t, x in groups.items()}
    own: dict[int, list[float]] = {t: [] for t in groups}
    for f in range(folds):
        score_f = scorer({t: x[fold_of[t] != f] for t, x in groups.items()})
        for t, x in groups.items():
            held = x[fold_of[t] == f]
            if len(held):
                own[t].extend(score_f(held, t).tolist())
    thresholds = {}
    for t, values in own.items():
        s = np.sort(values)
        k = math.ceil((len(s) + 1) * (1 - rate) - 1e-9)
        thresholds[t] = float(s[k - 1]) if k <= len(s) else math.inf
    return scorer(groups), thresholds


def evaluate(groups: dict[int, np.ndarray], held: dict[int, np.ndarray], unseen: np.ndarray,
             rate: float, scorers: Mapping[str, Scorer] | None = None) -> dict[str, dict[str, float]]:
    """Each test's (``scorers``, default :data:`SCORERS`) rates on one draw (see the module docstring)."""
    ids = sorted(groups)
    nearest_w, nearest_mus = _pooled(groups)
    mus = np.stack([nearest_mus[t] @ nearest_w for t in ids])
    d_near = (((unseen @ nearest_w)[:, None, :] - mus[None]) ** 2).sum(2)
    nearest = [ids[j] for j in d_near.argmin(1)]
    out: dict[str, dict[str, float]] = {}
    for name, scorer in (SCORERS if scorers is None else scorers).items():
        score, thr = calibrated(scorer, groups, rate=rate)
        ratio_unseen = np.stack([score(unseen, t) / thr[t] for t in ids], axis=1)  # (U, T)
        own_ratio = np.concatenate([score(held[t], t) / thr[t] for t in ids])
        min_indexed = np.concatenate([np.min(np.stack([score(held[t], s) / thr[s] for s in ids], 1), 1)
                                      for t in ids])
        near = ratio_unseen[np.arange(len(unseen)), [ids.index(t) for t in nearest]]
        y = np.r_[np.zeros(len(min_indexed)), np.ones(len(unseen))]
        out[name] = {"none_indexed": float(np.mean(own_ratio > 1)), "none_unseen_nearest": float(np.mean(near > 1)),
                     "none_unseen_all": float(np.mean(ratio_unseen.min(1) > 1)),
                     "auroc": float(roc_auc_score(y, np.r_[min_indexed, ratio_unseen.min(1)]))}
    return out


def layer_means(lm: Any, texts: list[str], max_tokens: int, batch: int = 16) -> np.ndarray:
    """Each text's mean hidden state at every layer (``output_hidden_states``: the embeddings, then each block's
    output, the last after the final norm), over its tokens up to ``max_tokens``, shape (n, L + 1, H)."""
    import torch

    out: list[np.ndarray] = []
    for lo in range(0, len(texts), batch):
        enc = lm.tokenizer(texts[lo: lo + batch], return_tensors="pt", padding=True, truncation=True,
                           max_length=max_tokens).to(lm.device)
        with torch.no_grad():
            hidden = lm.model(**enc, output_hidden_states=True).hidden_states
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden[0].dtype)
        means = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in hidden], dim=1)  # (b, L + 1, H)
        out.append(means.double().cpu().numpy())
    return np.concatenate(out)


def layer_representations(n_layers: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Views of :func:`layer_means` (n, L + 1, H) to test: each layer's mean, and every block's concatenated."""
    views: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        f"h{k}": (lambda x, k=k: x[:, k]) for k in range(n_layers + 1)}
    views["blocks concatenated"] = lambda x: x[:, 1:].reshape(len(x), -1)
    return views


def run(args: argparse.Namespace) -> dict[str, Any]:
    lm = load_model(args)
    extractor = make_extractor(lm, None, args)
    views = layer_representations(int(lm.model.config.num_hidden_layers)) if args.layers else {"product": None}
    scorers = {"maha": maha, "relative": relative} if args.layers else SCORERS
    tasks = {k: v for k, v in family_tasks().items() if len(v) >= args.signature + args.heldout}
    names = sorted(tasks)
    n_unseen = max(1, round(0.2 * len(names)))
    cache: dict[str, np.ndarray] = {}

    def raw(texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in cache]
        if todo:
            computed = layer_means(lm, todo, args.max_tokens) if args.layers else text_vectors(extractor, todo)
            for t, v in zip(todo, computed, strict=True):
                cache[t] = v
        return np.stack([cache[t] for t in texts]).astype(np.float64)

    draws: list[dict[str, Any]] = []
    for d in range(args.draws):
        rng = np.random.default_rng(1000 * (1 + args.seeds[0]) + d)  # 4d's draws
        sig, held = {}, {}
        for t in names:
            sig[t], held[t] = split_texts(tasks[t], args.signature, args.heldout, rng)
        unseen = sorted(rng.choice(names, size=n_unseen, replace=False).tolist())
        indexed = [t for t in names if t not in unseen]
        res: dict[str, dict[str, float]] = {}
        for view_name, view in views.items():
            def vectors(texts: list[str], view: Callable[[np.ndarray], np.ndarray] | None = view) -> np.ndarray:
                return raw(texts) if view is None else view(raw(texts))
            groups = {i: vectors(sig[t]) for i, t in enumerate(indexed) if len(sig[t]) >= MIN_NOVELTY_SAMPLES}
            held_v = {i: vectors(held[t]) for i, t in enumerate(indexed) if i in groups}
            unseen_v = np.concatenate([vectors(held[t]) for t in unseen])
            for k, v in evaluate(groups, held_v, unseen_v, args.rate, scorers).items():
                res[k if view is None else f"{view_name} / {k}"] = v
        log(f"draw {d}: " + "; ".join(f"{k} {v['none_unseen_nearest']:.3f}/{v['none_unseen_all']:.3f}/"
                                        f"{v['none_indexed']:.3f} auroc {v['auroc']:.3f}" for k, v in res.items()))
        draws.append({"unseen": unseen, "rates": res})
    med = {k: {m: float(np.median([d["rates"][k][m] for d in draws])) for m in draws[0]["rates"][k]}
           for k in draws[0]["rates"]}
    if not args.layers:
        # the shipped class must agree with the "maha" scorer (same fit, same calibration): checked on the last draw
        shipped = SpaceNovelty.fit(groups)
        _, thr = calibrated(maha, groups, rate=args.rate)
        assert shipped is not None
        gap = max(abs((shipped.threshold(t, args.rate) or 0.0) - thr[t]) for t in groups)
        assert gap < 1e-5, f"atlas.novelty disagrees with the maha scorer by {gap}"
    return {"draws": draws, "median": med}


def main() -> None:
    """Command-line entry point."""
    p = family_parser(__doc__.split("\n")[0], draws=5)
    p.add_argument("--rate", type=float, default=FALSE_REJECT_RATE, help="false-reject rate of every test")
    p.add_argument("--layers", action="store_true", help="test every layer's mean hidden state (module notes)")
    args = family_args(p)
    import torch

    torch.set_num_threads(args.threads)
    res = run(args)
    print("median over draws (none unseen nearest / all / none indexed, auroc):")
    for k, v in res["median"].items():
        print(f"  {k:24s} {v['none_unseen_nearest']:.3f} / {v['none_unseen_all']:.3f} / {v['none_indexed']:.3f}  "
              f"auroc {v['auroc']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
