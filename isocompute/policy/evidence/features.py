"""Evidence features at a check point: what the samples finished so far say, and how long the others run.

At the t-th finish of an evidence plan (:mod:`isocompute.policy.evidence.walks`) the runner knows the
finished samples' answer classes and lengths and, in lock-step decoding, that every running sample is at
least as long as the last finisher. Lengths are in units of the model's typical length (the training
table's median sample), on a log scale. :data:`NAMES` lists the columns:

    finished, running, wave            samples finished, still decoding in this wave, the wave's index
    top1, top2, margin, classes, nulls the vote: leader's and runner-up's votes, their gap, classes, nulls
    share                              the leader's share of the votes (0 before any vote)
    log_now                            log length reached (the last finisher's; running samples are longer)
    log_first, since_first             log length of the first finisher; length decoded since it finished
    log_mean, log_leader, log_other    mean log length of the finished, of the leader's voters, of the rest
    first_leads, last_leads            whether the first / the latest finisher voted for the leader
    tokens, latency                    spent so far (same units)
    conf_leader, conf_min              mean confidence of the leader's voters, lowest of any finished
                                       (DeepConf's lowest window mean; NaN when the upstream gave none)

The leader is the class with the most votes; among tied classes the one with the shortest mean length, then
the one voted for first. A sample without a confidence counts in neither confidence column.
:func:`walk_features` computes the columns for every check point of a batch of walks at once;
:func:`state_features` for one prompt's state as the gateway sees it — the same numbers (tested).

Worked example: finished (a, 1.2), (a, 2.0) of unit lengths, 2 running: finished 2, running 2, top1 2,
margin 2, share 1, log_now = log 2 = 0.69, log_first = 0.18, since_first 0.8, first_leads 1.

Ignores: the prompt's text (it carries no signal on the real tables; the policy's prompt features serve
that) and the running samples' partial text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.evidence.walks import Walks

__all__ = ["NAMES", "state_features", "walk_features"]

NAMES = ("finished", "running", "wave", "top1", "top2", "margin", "classes", "nulls", "share", "log_now",
         "log_first", "since_first", "log_mean", "log_leader", "log_other", "first_leads", "last_leads",
         "tokens", "latency", "conf_leader", "conf_min")


def _leader(counts: np.ndarray, log_sums: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Index of the leading class along the last axis: most votes, then shortest mean log length, then the
    class that finished first (``first`` (D, G): the check point of each class's first vote)."""
    top = counts.max(axis=-1, keepdims=True)
    mean_log = np.where(counts > 0, log_sums / np.maximum(counts, 1), np.inf)
    key = np.where((counts == top) & (top > 0), mean_log, np.inf)
    best = key.min(axis=-1, keepdims=True)
    tied = np.isfinite(key) & (key <= best + 1e-12)
    return np.argmin(np.where(tied, first[:, None, :], np.iinfo(np.int64).max), axis=-1)


def walk_features(w: Walks, confidence: np.ndarray | None = None) -> np.ndarray:
    """(D, M, len(NAMES)) features at every check point of the walks; ``confidence`` (D, M) per finisher."""
    counts = w.counts()
    logL = np.log(np.maximum(w.lengths, 1e-9))
    G = counts.shape[-1]
    onehot = w.codes[:, :, None] == np.arange(G)[None, None, :]
    log_sums = np.cumsum(onehot * logL[:, :, None], axis=1)
    first = np.where(onehot.any(axis=1), onehot.argmax(axis=1), w.n_checks)
    lead = _leader(counts, log_sums, first)
    srt = np.sort(counts, axis=-1)
    top1 = srt[..., -1].astype(float)
    top2 = (srt[..., -2] if G > 1 else np.zeros_like(srt[..., -1])).astype(float)
    votes = counts.sum(axis=-1).astype(float)
    t = np.arange(w.n_checks)[None, :] + 1.0
    cum_log = np.cumsum(logL, axis=1)
    lead_log = np.take_along_axis(log_sums, lead[..., None], axis=-1)[..., 0]
    top_votes = np.take_along_axis(counts, lead[..., None], axis=-1)[..., 0].astype(float)
    others = t - top_votes
    has = votes > 0
    first_code = w.codes[:, :1]
    cols = {
        "finished": np.broadcast_to(t, votes.shape), "running": np.broadcast_to(w.running[None, :], votes.shape),
        "wave": np.broadcast_to(w.wave[None, :], votes.shape), "top1": top1, "top2": top2,
        "margin": top1 - top2, "classes": (counts > 0).sum(axis=-1).astype(float),
        "nulls": np.cumsum(w.codes < 0, axis=1).astype(float), "share": np.where(has, top1 / np.maximum(votes, 1), 0),
        "log_now": logL, "log_first": np.broadcast_to(logL[:, :1], votes.shape),
        "since_first": w.lengths - w.lengths[:, :1], "log_mean": cum_log / t,
        "log_leader": np.where(has, lead_log / np.maximum(top_votes, 1), np.nan),
        "log_other": np.where(others > 0, (cum_log - np.where(has, lead_log, 0)) / np.maximum(others, 1), np.nan),
        "first_leads": (has & (first_code == lead)).astype(float),
        "last_leads": (has & (w.codes == lead)).astype(float), "tokens": w.tokens, "latency": w.latency,
    }
    cols.update(_confidence(confidence, onehot, counts, lead, has))
    return np.stack([np.asarray(cols[k], dtype=float) for k in NAMES], axis=-1)


def _confidence(conf: np.ndarray | None, onehot: np.ndarray, counts: np.ndarray, lead: np.ndarray,
                has: np.ndarray) -> dict[str, np.ndarray]:
    if conf is None or np.isnan(conf).all():
        nan = np.full(counts.shape[:2], np.nan)
        return {"conf_leader": nan, "conf_min": nan}
    known = ~np.isnan(conf)  # a sample without a confidence counts in neither mean nor minimum
    sums = np.cumsum(onehot * np.where(known, conf, 0.0)[:, :, None], axis=1)
    ns = np.cumsum(onehot * known[:, :, None], axis=1)
    lead_sum = np.take_along_axis(sums, lead[..., None], axis=-1)[..., 0]
    lead_n = np.take_along_axis(ns, lead[..., None], axis=-1)[..., 0]
    return {"conf_leader": np.where(has & (lead_n > 0), lead_sum / np.maximum(lead_n, 1), np.nan),
            "conf_min": np.fmin.accumulate(conf, axis=1)}


def state_features(classes: Sequence[int | None], lengths: Sequence[float], *, running: int, wave: int,
                   tokens: float, latency: float, unit: float,
                   confidence: Sequence[float | None] | None = None) -> np.ndarray:
    """The :data:`NAMES` row for one prompt's state: ``classes`` and ``lengths`` (tokens) of the samples
    finished so far in finish order (None = no answer), ``running`` samples still decoding in wave
    ``wave``, ``tokens`` and ``latency`` spent so far in tokens; ``unit`` the typical length."""
    n = len(classes)
    if len(lengths) != n:
        raise InputError(f"evidence needs one length per finished sample: {n} answers, {len(lengths)} lengths.")
    index: dict = {}
    for c in classes:  # codes in order of first vote (the tie-break's last key does not read them)
        if c is not None and c not in index:
            index[c] = len(index)
    codes = np.array([[index[c] if c is not None else -1 for c in classes]])
    G = max(len(index), 1)
    w = Walks(np.zeros(1, dtype=int), np.zeros((1, n), dtype=int), codes, np.zeros((1, n), dtype=bool),
              np.asarray(lengths, dtype=float)[None, :] / unit, np.zeros((1, n)),
              np.full((1, n), tokens / unit), np.full((1, n), latency / unit), np.full(n, wave),
              np.full(n, running), np.zeros((1, G), dtype=bool), unit)
    conf = None if confidence is None else np.array([[np.nan if c is None else c for c in confidence]], dtype=float)
    return walk_features(w, conf)[0, -1]
