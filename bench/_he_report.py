"""The report of ``bench/he.py`` (not a benchmark itself): its table, interpretation, notes and headline.

Everything here is a function of :class:`~_he_schemes.Measured`, what ``bench/he.py``
measured; nothing is timed.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _he_schemes import (
    DEFAULT_TILE,
    LABELS,
    MAX_SITES,
    NV_COEFF,
    NV_POLY,
    NV_SCALE_BITS,
    PIECE,
    POOL_VALUES,
    SAMPLES,
    SCHEMES,
    TILE,
    VALUE_RANGE,
    VALUE_STD,
    Measured,
)

from fedshard.crypto.he import DEFAULT_SCHEME
from fedshard.crypto.he_schemes import COEFF_BITS, POLY_DEGREE, Ckks
from fedshard.crypto.he_schemes import SCHEMES as HE_SCHEMES

FIELD_BITS = HE_SCHEMES[DEFAULT_SCHEME].field_bits
CKKS_FIELD_BITS = Ckks.field_bits

__all__ = ["GOAL_BYTES", "GOAL_ENCRYPT", "GOAL_ROUND", "Report", "headers", "report"]

GOAL_BYTES = 5.0  # × float32
GOAL_ENCRYPT = 4e6  # values/s on 2 cores
GOAL_ROUND = 1.3  # × plaintext round
N_SITES = len(SAMPLES)
HEADROOM = max(1, math.ceil(math.log2(max(2, MAX_SITES))))


@dataclass
class Report:
    """The table, interpretation, notes and headline figures of a run."""

    rows: list[list[str]]
    interpretation: str
    notes: list[str]
    headline: dict[str, Any]


def headers() -> list[str]:
    """The table's columns."""
    return [
        "update / site",
        "scheme",
        "upload bytes / float32 byte",
        "aggregate bytes / float32 byte",
        "encrypt M values/s per site (cores used)",
        "zone fold M values/s",
        "zone serialise s",
        "decrypt M values/s",
        "max abs error of the mean",
        f"round s, {N_SITES} sites one after another (min-max)",
        "round / plaintext",
        "critical path s (one site's encryption)",
        "critical path / plaintext",
    ]


def _mvs(values: float, seconds: float) -> str:
    return f"{values / seconds / 1e6:,.2f}"


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _range(xs: list[float], digits: int = 2) -> str:
    return f"{_med(xs):,.{digits}f} ({min(xs):,.{digits}f}-{max(xs):,.{digits}f})"


def _s(x: float) -> str:
    return f"{x:,.2f}" if x >= 0.1 else f"{x:,.3f}"


Summary = dict[tuple[str, str], dict[str, float]]  # (label, scheme) -> figure -> value
Extras = dict[tuple[str, str], tuple[float, float]]  # (label, task) -> (values/s, cores)


def summarise(m: Measured) -> Summary:
    """Medians of every scheme at every size (rates in values/s, bytes per float32 byte, seconds)."""
    summary: Summary = {}
    for label, res in m.results.items():
        n = m.works[label][0]
        plain_round = _med([r.wall for r in res["plaintext"]])
        plain_crit = _med([r.critical for r in res["plaintext"]])
        for name in SCHEMES:
            rs = res[name]
            enc_site = _med([_med(r.enc) for r in rs])
            fold = _med([sum(r.fold) for r in rs])
            dec = _med([r.dec for r in rs])
            wall = _med([r.wall for r in rs])
            crit = _med([r.critical for r in rs])
            summary[(label, name)] = {
                "enc_rate": n / enc_site,
                "enc_site": enc_site,
                "fold_rate": n * N_SITES / fold,
                "dec_rate": n / dec,
                "up": rs[0].up_bytes / (4 * n * N_SITES),
                "down": rs[0].down_bytes / (4 * n),
                "err": max(r.error for r in rs),
                "round": wall,
                "crit": crit,
                "round_ratio": wall / plain_round,
                "crit_ratio": crit / plain_crit,
                "plain_round": plain_round,
                "plain_crit": plain_crit,
                "cores": _med([sum(r.enc_cpu) / sum(r.enc) for r in rs]),
                "dec": dec,
                "fold": fold,
                "ser": _med([r.ser for r in rs]),
            }
    return summary


def extras(m: Measured) -> Extras:
    """fedshard's encryption alone (one process; default tiles): values/s and cores, per size."""
    ex: Extras = {}
    for label, tasks in m.extra.items():
        for task, xs in tasks.items():
            if xs:
                t = _med([wall for wall, _ in xs])
                ex[(label, task)] = (m.works[label][0] / t, _med([cpu / wall for wall, cpu in xs]))
    return ex


def table(m: Measured, summary: Summary, ex: Extras) -> list[list[str]]:
    """One row per size and scheme, then fedshard's encryption alone."""
    rows: list[list[str]] = []
    for label, res in m.results.items():
        n = m.works[label][0]
        for name in SCHEMES:
            s, wall = summary[(label, name)], [r.wall for r in res[name]]
            rows.append(
                [
                    label,
                    LABELS[name],
                    f"{s['up']:.2f}x",
                    f"{s['down']:.2f}x",
                    f"{_mvs(n, s['enc_site'])} " + ("(tobytes)" if name == "plaintext" else f"({s['cores']:.2f})"),
                    _mvs(n * N_SITES, s["fold"]),
                    _s(s["ser"]),
                    _mvs(n, s["dec"]),
                    f"{s['err']:.2e}",
                    _range(wall),
                    f"{s['round_ratio']:,.1f}x",
                    _s(s["crit"]),
                    f"{s['crit_ratio']:,.1f}x",
                ]
            )
        for task in m.extra[label]:
            if (label, task) not in ex:
                continue
            rate, cores = ex[(label, task)]
            what = (
                "fedshard, encryption alone: `HeCodec.encrypt` shard by shard, one process"
                if task == "one process"
                else f"fedshard, encryption alone: `encrypt_many` on {DEFAULT_TILE[0]}x{DEFAULT_TILE[1]} tiles "
                f"({m.default_shards[label]} shards)"
            )
            rows.append([label, what, "–", "–", f"{rate / 1e6:,.2f} ({cores:.2f})", *["–"] * 8])
    return rows


class _Words:
    """Helpers that put the figures of every size into one phrase."""

    def __init__(self, m: Measured, summary: Summary, ex: Extras) -> None:
        self.m, self.summary, self.ex, self.labels = m, summary, ex, m.labels

    def per_size(self, key: str, fmt: Callable[[float], str], scheme: str = "fedshard") -> str:
        return " / ".join(f"{fmt(self.summary[(lb, scheme)][key])} ({lb})" for lb in self.labels)

    def ex_size(self, task: str) -> str:
        return " / ".join(
            f"{self.ex[(lb, task)][0] / 1e6:.2f} M/s ({self.ex[(lb, task)][1]:.2f} cores; {lb})"
            for lb in self.labels
            if (lb, task) in self.ex
        )

    def met(self, key: str, ok: Callable[[float], bool]) -> bool:
        return all(ok(self.summary[(lb, "fedshard")][key]) for lb in self.labels)


def _bytes_sentence(w: _Words) -> str:
    big = w.labels[-1]
    f_big, nv_big = w.summary[(big, "fedshard")], w.summary[(big, "nvflare")]
    return (
        f"Bytes (goal ≤ {GOAL_BYTES:g}× float32): {'met' if w.met('up', lambda x: x <= GOAL_BYTES) else 'not met'}. "
        f"fedshard's {DEFAULT_SCHEME.upper()} ciphertexts are {w.per_size('up', lambda x: f'{x:.2f}×')} the bytes of "
        f"the float32 update on the way up ({w.per_size('up', lambda x: f'{x:.2f}×', 'fedshard-ckks')} under its "
        f"CKKS, whose ring uses only half its slots for reals), against "
        f"{w.per_size('up', lambda x: f'{x:.1f}×', 'nvflare')} for the NVFlare-style default: "
        f"two quantised values per slot in an N = {POLY_DEGREE} ring whose ciphertexts keep one {COEFF_BITS[0]}-bit "
        f"prime (the {COEFF_BITS[1]}-bit one is the special prime, dropped after encryption), against one value per "
        f"slot and two primes ({NV_COEFF[0]} + {NV_COEFF[1]} bits) of N = {NV_POLY}. The encrypted aggregate a site "
        f"downloads has the same size per value ({f_big['down']:.2f}× / {nv_big['down']:.1f}×; a float32 "
        "aggregate is 1×)."
    )


def _pool_words(w: _Words) -> str:
    """How ``encrypt_many`` spread the work at each size, and what its pool's start-up costs."""
    m, workers = w.m, os.cpu_count() or 1
    startup_s = _med([cold - warm for cold, warm in m.startup])
    per_size = " ".join(
        f"At {lb} (below {POOL_VALUES:,} values `encrypt_many` uses no pool) it encrypts in this process, on one core."
        if m.works[lb][0] < POOL_VALUES
        else f"At {lb} it packs the {m.works[lb][1]} shard{'s' if m.works[lb][1] > 1 else ''} here and hands their "
        f"{m.pieces[lb]:,} ciphertext-sized pieces ({PIECE:,} values each) to the pool's {workers} workers, so even "
        f"a single shard (the largest has {m.largest[lb]:,} values) is spread over all of them."
        for lb in w.labels
    )
    used = any(m.works[lb][0] >= POOL_VALUES for lb in w.labels)
    spread = (
        f" (median of {len(m.startup)} start-ups, {min(cold - warm for cold, warm in m.startup):.2f}-"
        f"{max(cold - warm for cold, warm in m.startup):.2f} s)"
        if len(m.startup) > 1
        else ""
    )
    warm = _med([warm for _, warm in m.startup])
    return (
        per_size
        + f" The pool is started once per site process, on its first call with ≥ {POOL_VALUES:,} values, and kept "
        "for the life of the process"
        + (": every timed round here that used it ran with it warm." if used else " (no size here used it).")
        + f" Its start-up ({workers} spawned workers import numpy, TenSEAL and the main module, here this "
        f"script, and load the secret context) is a one-off of {startup_s:.2f} s{spread}: a fresh context's first "
        f"`encrypt_many` of {POOL_VALUES:,} values takes {_med([cold for cold, _ in m.startup]):.2f} s against "
        f"{warm:.2f} s warm ({POOL_VALUES / warm / 1e6:.2f} M/s). A site that ran one process per round would pay it "
        "every round."
    )


def _encrypt_sentence(w: _Words) -> str:
    big, workers = w.labels[-1], os.cpu_count() or 1
    f_big, nv_big = w.summary[(big, "fedshard")], w.summary[(big, "nvflare")]
    enc_met = w.met("enc_rate", lambda x: x >= GOAL_ENCRYPT)
    one_big = w.ex[(big, "one process")][0] if (big, "one process") in w.ex else 0.0
    comparison = (
        " For comparison, symmetric encryption with the same codec shard by shard in this one process: "
        f"{w.ex_size('one process')}; `encrypt_many` on fedshard's default {DEFAULT_TILE[0]}x{DEFAULT_TILE[1]} "
        f"tiles: {w.ex_size('default tiles')}. The pool turns {one_big / 1e6:.2f} M/s on one core into "
        f"{f_big['enc_rate'] / 1e6:.2f} M/s on {f_big['cores']:.2f} busy cores at {big} "
        f"({f_big['enc_rate'] / one_big if one_big else math.nan:.2f}× with {workers} workers; packing runs in the "
        "calling process and the ciphertexts come back pickled)."
        + (
            ""
            if enc_met
            else f" {GOAL_ENCRYPT / 1e6:g} M/s on {workers} cores needs "
            f"{GOAL_ENCRYPT / workers / 1e6:.1f} M/s per core with all of them busy."
        )
        if w.ex
        else ""
    )
    threads = (
        "TenSEAL's own thread pool encrypts the ciphertexts of a long vector in parallel"
        if nv_big["cores"] > 1.3
        else "TenSEAL encrypts the ciphertexts of a vector one after another, in one thread"
    )
    speedup = " / ".join(
        f"{w.summary[(lb, 'fedshard')]['enc_rate'] / w.summary[(lb, 'nvflare')]['enc_rate']:.1f}× ({lb})"
        for lb in w.labels
    )
    return (
        f"Encryption (goal ≥ {GOAL_ENCRYPT / 1e6:g} M values/s on this 2-core machine; pool warm): "
        f"{'met' if enc_met else 'not met'}. With `encrypt_many` on the {TILE[0]}x{TILE[1]} shards fedshard "
        f"encrypts {w.per_size('enc_rate', lambda x: f'{x / 1e6:.2f} M/s')} per site "
        f"({w.per_size('cores', lambda x: f'{x:.2f} cores busy')}). "
        + _pool_words(w)
        + comparison
        + " The NVFlare-style path (public-key encryption, N = "
        f"{NV_POLY}) does {w.per_size('enc_rate', lambda x: f'{x / 1e6:.2f} M/s', 'nvflare')} "
        f"({nv_big['cores']:.2f} cores busy: {threads}), so fedshard's `encrypt_many` is {speedup} faster."
    )


def _fold_sentence(w: _Words) -> str:
    return (
        f"The zone folds (deserialise + add) {w.per_size('fold_rate', lambda x: f'{x / 1e6:.1f} M values/s')} with "
        f"fedshard against {w.per_size('fold_rate', lambda x: f'{x / 1e6:.1f} M/s', 'nvflare')} NVFlare-style and "
        f"{w.per_size('fold_rate', lambda x: f'{x / 1e6:.0f} M/s', 'plaintext')} in plaintext (float64 "
        f"`ShardAccumulator`); a site decrypts {w.per_size('dec_rate', lambda x: f'{x / 1e6:.2f} M values/s')} "
        f"(NVFlare-style {w.per_size('dec_rate', lambda x: f'{x / 1e6:.2f} M/s', 'nvflare')})."
    )


def mean_bound(m: Measured) -> float:
    """The documented bound on the error of the decrypted mean of the largest size: S·step/(2·Σw)."""
    return N_SITES * m.step / 2 / m.works[m.labels[-1]][2]


def ckks_bound(m: Measured) -> float:
    """:func:`mean_bound` for fedshard's CKKS scheme."""
    return N_SITES * m.ckks_step / 2 / m.works[m.labels[-1]][2]


def _error_sentence(w: _Words) -> str:
    m = w.m
    total_w, bound = m.works[w.labels[-1]][2], mean_bound(m)
    err_ok = w.met("err", lambda x: x <= bound * (1 + 1e-9))
    f_big = w.summary[(w.labels[-1], "fedshard")]
    return (
        f"Error: fedshard's largest error of the decrypted weighted mean against the float64 mean is "
        f"{w.per_size('err', lambda x: f'{x:.2e}')}; the bound is step/2 per value and site on w·x, with "
        f"step = value_range / (2^({FIELD_BITS - 1} - headroom) - 1) = "
        f"{VALUE_RANGE:g}/(2^{FIELD_BITS - 1 - HEADROOM} - 1) = {VALUE_RANGE:g}/{m.levels:,} = "
        f"{m.step:.3e} (value_range {VALUE_RANGE:g}, max_sites {MAX_SITES}, headroom ceil(log2 {MAX_SITES}) = "
        f"{HEADROOM} bits), i.e. ≤ S·step/(2·Σw) = {N_SITES}·{m.step:.3e}/(2·{total_w:g}) = {bound:.2e} on the mean "
        f"of these {N_SITES} sites — {'respected' if err_ok else 'EXCEEDED'} (fedshard's CKKS, {CKKS_FIELD_BITS}-bit "
        f"fields: {w.per_size('err', lambda x: f'{x:.2e}', 'fedshard-ckks')} against its bound "
        f"{ckks_bound(m):.2e}); the rounding errors are independent, so "
        f"over millions of values the maximum comes close to the bound. That is "
        f"{f_big['err'] / VALUE_STD:.1%} of the updates' standard deviation ({VALUE_STD:g}), well below the noise "
        f"a DP mechanism adds; NVFlare-style CKKS at scale 2^{NV_SCALE_BITS} errs by "
        f"{w.per_size('err', lambda x: f'{x:.1e}', 'nvflare')}, float32 plaintext by "
        f"{w.per_size('err', lambda x: f'{x:.1e}', 'plaintext')}. No value was clipped "
        f"({m.clipped} clipped in all runs)."
    )


def _break_even(s: dict[str, float]) -> float:
    """Seconds of other work per round (training, transfer) at which HE costs ≤ GOAL_ROUND×."""
    return max(0.0, (s["crit"] - GOAL_ROUND * s["plain_crit"]) / (GOAL_ROUND - 1))


def _round_sentence(w: _Words) -> str:
    big = w.labels[-1]
    f_big, nv_big = w.summary[(big, "fedshard")], w.summary[(big, "nvflare")]
    round_met = w.met("round_ratio", lambda x: x <= GOAL_ROUND)
    return (
        f"Round time (goal ≤ {GOAL_ROUND:g}× plaintext): {'met' if round_met else 'not met'} for a round that "
        f"is only crypto. With the {N_SITES} sites encrypting one after another on this machine a fedshard round "
        f"takes {w.per_size('round', lambda x: f'{x:.2f} s')}, {w.per_size('round_ratio', lambda x: f'{x:.0f}×')} "
        f"the plaintext round ({w.per_size('plain_round', lambda x: f'{x:.3f} s')}: serialising float32 and a "
        f"float64 accumulate cost almost nothing), against {w.per_size('round', lambda x: f'{x:.1f} s', 'nvflare')} "
        f"NVFlare-style ({w.per_size('round_ratio', lambda x: f'{x:.0f}×', 'nvflare')}); fedshard's round is "
        f"{nv_big['round'] / f_big['round']:.1f}× shorter at {big}. With sites encrypting in parallel on their "
        f"own machines the critical path is one site's encryption + the zone's folds + serialisation + one "
        f"decryption: {w.per_size('crit', lambda x: f'{x:.2f} s')} for fedshard "
        f"(NVFlare-style {w.per_size('crit', lambda x: f'{x:.1f} s', 'nvflare')}). Local training and the "
        f"transfer are out of scope here (not measured); the HE round stays within {GOAL_ROUND:g}× of the "
        f"plaintext one once they take at least (HE critical path − {GOAL_ROUND:g} × plaintext) / "
        f"{GOAL_ROUND - 1:.1f} per round: "
        + " / ".join(f"{_break_even(w.summary[(lb, 'fedshard')]):.1f} s ({lb})" for lb in w.labels)
        + " for fedshard, "
        + " / ".join(f"{_break_even(w.summary[(lb, 'nvflare')]):.0f} s ({lb})" for lb in w.labels)
        + " NVFlare-style. The transfer itself grows with the bytes: "
        f"{f_big['up']:.1f}× the float32 bytes up and down with fedshard, {nv_big['up']:.1f}× NVFlare-style."
    )


def interpretation(m: Measured, summary: Summary, ex: Extras) -> str:
    """What the figures say about each goal, in words."""
    w = _Words(m, summary, ex)
    sentences = [_bytes_sentence(w), _encrypt_sentence(w), _fold_sentence(w), _error_sentence(w), _round_sentence(w)]
    return " ".join(sentences)


def notes(m: Measured) -> list[str]:
    """The section's notes: updates, schemes, TenSEAL's warnings, columns, machine load."""
    labels = m.labels
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return [
        f"- Updates: {N_SITES} sites, each with its own float32 update of "
        + " / ".join(f"{m.works[lb][0]:,} values in {m.works[lb][1]} shards" for lb in labels)
        + f" (synthetic layers of {m.sizes[0][1]}x{m.sizes[0][1]} weights + biases, values N(0, {VALUE_STD:g}) like "
        f"DP-noised updates; `ShardPlan` tile {TILE[0]}x{TILE[1]}: one shard per layer); weights "
        f"w_i = n_i / max n = {', '.join(f'{w:g}' for w in [n / max(SAMPLES) for n in SAMPLES])}.",
        f"- fedshard: `HeCodec(value_range={VALUE_RANGE:g}, max_sites={MAX_SITES})` (the defaults), N = "
        f"{POLY_DEGREE}, coefficients {list(COEFF_BITS)}; BFV (the default): plain modulus 2^42 − 25, "
        f"{FIELD_BITS}-bit fields; CKKS: scale 2^{Ckks.SCALE_BITS}, {CKKS_FIELD_BITS}-bit fields; symmetric "
        "encryption (`he_init`'s "
        "context; sites hold the secret key); sites `encrypt_packs` (the shards packed as `pack_layout` lays "
        "them out, then `encrypt_many`): packing in the calling process, from "
        f"{POOL_VALUES:,} values ciphertext-sized pieces ({PIECE:,} values) on a spawn pool of one worker per "
        f"core ({os.cpu_count()} here), started once per process and kept; the benchmark starts its pool with "
        "an untimed call, so every timed round runs it warm; the pool's start-up is measured on "
        f"{len(m.startup)} fresh context{'s' if len(m.startup) > 1 else ''} (first call − faster of two warm calls on "
        f"one {POOL_VALUES:,}-value shard), each pool shut down afterwards. Zone `EncryptedSum.add` / "
        "`.serialize`, site `decrypt_mean`. NVFlare-style: TenSEAL N = "
        f"{NV_POLY}, coefficients {NV_COEFF}, scale 2^{NV_SCALE_BITS}, "
        "TenSEAL's default context (public-key encryption, thread count = cores), "
        "one `ts.ckks_vector(ctx, w·x)` per shard, `.serialize()`; zone `ts.ckks_vector_from(public, bytes)` "
        "+ `+=`; decrypted sum / Σw in clear. Plaintext: `tobytes()` of float32, zone "
        "`ShardAccumulator.add` (float64), float32 mean back.",
        "- TenSEAL prints a C++ warning on stdout for every vector longer than one ciphertext "
        '("WARNING: The input does not fit in a single ciphertext ..."): the NVFlare-style path runs with '
        "file descriptor 1 redirected to /dev/null around those calls (`os.dup2`, C stdio flushed, restored "
        "afterwards; stderr and exceptions untouched). Only encryption prints it; deserialising, adding and "
        "decrypting run unredirected. fedshard encrypts one ciphertext per vector and prints nothing.",
        "- Columns: bytes are ciphertext bytes / (4 × values) (upload: one site's push; aggregate: the zone's "
        "sum); encrypt = values / one site's encryption wall time (cores used = CPU s / wall s, the pool "
        "workers' CPU read from /proc/PID/stat included); zone fold = values of all sites / the zone's "
        "deserialise + add time; decrypt = values / one site's decryption of the aggregate (decoding "
        "included); error = max |decrypted weighted mean − float64 weighted mean| over all values and runs; "
        "round = all sites' encryption + the zone's folds and serialisation + one decryption, in one process; "
        "critical path = the same with one site's encryption (sites in parallel). No network: the bytes are "
        "what would travel.",
        f"- Other processes on the machine kept {m.others:.2f} of its {os.cpu_count()} cores busy on average "
        f"during the whole benchmark (at most {max(m.run_loads):.2f} in one run; /proc/stat busy time minus this "
        f"benchmark's own CPU time, pool workers included); load average before / after: {m.load0[0]:.2f} / "
        f"{m.load1[0]:.2f}; peak RSS of the benchmark process {peak_mb:,.0f} MB.",
    ]


def headline(m: Measured, summary: Summary) -> dict[str, Any]:
    """The ``--json`` figures, at the largest update size (medians; rates in M values/s)."""
    big = m.labels[-1]
    f_big, nv_big = summary[(big, "fedshard")], summary[(big, "nvflare")]
    return {
        "values_per_site": m.works[big][0],
        "scheme": DEFAULT_SCHEME,
        "bytes_per_f32": f_big["up"],
        "ckks_bytes_per_f32": summary[(big, "fedshard-ckks")]["up"],
        "ckks_max_abs_error": max(summary[(lb, "fedshard-ckks")]["err"] for lb in m.labels),
        "ckks_error_bound": ckks_bound(m),
        "nvflare_bytes_per_f32": nv_big["up"],
        "encrypt_m_values_s": f_big["enc_rate"] / 1e6,
        "nvflare_encrypt_m_values_s": nv_big["enc_rate"] / 1e6,
        "fold_m_values_s": f_big["fold_rate"] / 1e6,
        "decrypt_m_values_s": f_big["dec_rate"] / 1e6,
        "max_abs_error": max(summary[(lb, "fedshard")]["err"] for lb in m.labels),
        "error_bound": mean_bound(m),
        "round_vs_plaintext": f_big["round_ratio"],
        "critical_path_vs_plaintext": f_big["crit_ratio"],
        "pool_startup_s": _med([cold - warm for cold, warm in m.startup]),
    }


def report(m: Measured) -> Report:
    """Everything the section and ``--json`` show, from what was measured."""
    summary, ex = summarise(m), extras(m)
    return Report(table(m, summary, ex), interpretation(m, summary, ex), notes(m), headline(m, summary))
