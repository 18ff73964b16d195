#!/usr/bin/python3
"""Compare our per-position logits (D16 JSONL from `worker-orcd generate --log-logits`,
with every value logged) against llama.cpp's log-probabilities
(fixtures/oracle/logprobs.mjs) for the same model and token ids.

Pass/fail, not just a printout: exits 1 when max |log_softmax(ours) - logprob(llama.cpp)|
over every compared position and vocabulary entry exceeds --max-abs, when a position is
missing, or (with --ids) when the greedy continuations differ. Exit 2: bad input.

    tools/compare_logits.py OURS.jsonl ORACLE.jsonl [--max-abs 1e-4] [--floor -80]
                            [--ids OURS_CLI.json] [--json]

Entries whose llama.cpp log-probability is below --floor are skipped: llama.cpp hands
out float probabilities, which lose precision once they are denormal (below ~e^-87).
"""
import argparse
import json
import sys

try:
    import numpy as np
except ImportError:  # the default python3 here has no numpy
    sys.exit("compare_logits.py needs numpy: run it with /usr/bin/python3 "
             "(apt-get install python3-numpy)")


def load_ours(path):
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("checkpoint", "logits") != "logits":
                continue
            vals = np.asarray(r["values"], dtype=np.float64)
            shape = r.get("shape", [len(vals)])
            if len(vals) != shape[0]:
                raise ValueError(f"{path}:{n}: record has {len(vals)} of {shape[0]} values; "
                                 "log with every value (--log-values unset)")
            out[int(r["token_idx"])] = vals
    return out


def load_oracle(path):
    logprobs, greedy = {}, None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r["kind"] == "logprobs":
                lp = np.array([np.nan if v is None else v for v in r["logprobs"]], dtype=np.float64)
                logprobs[int(r["token_idx"])] = lp
            elif r["kind"] == "greedy":
                greedy = r["tokens"]
    return logprobs, greedy


def log_softmax(v):
    m = v.max()
    return v - (m + np.log(np.exp(v - m).sum()))


def compare(ours, oracle, floor):
    report = {"positions": 0, "entries": 0, "skipped_entries": 0, "max_abs": 0.0,
              "worst": None, "argmax_mismatch": [], "missing_positions": []}
    total = 0.0
    for idx in sorted(oracle):
        if idx not in ours:
            report["missing_positions"].append(idx)
            continue
        a = log_softmax(ours[idx])
        b = oracle[idx]
        if len(a) != len(b):
            raise ValueError(f"position {idx}: vocab {len(a)} vs oracle {len(b)}")
        mask = ~np.isnan(b) & (b >= floor)
        d = np.abs(a[mask] - b[mask])
        report["positions"] += 1
        report["entries"] += int(mask.sum())
        report["skipped_entries"] += int((~mask).sum())
        total += float(d.sum())
        if d.size and float(d.max()) > report["max_abs"]:
            j = int(np.flatnonzero(mask)[int(d.argmax())])
            report["max_abs"] = float(d.max())
            report["worst"] = {"token_idx": idx, "id": j, "ours": float(a[j]), "oracle": float(b[j])}
        bb = np.where(np.isnan(b), -np.inf, b)
        if int(np.argmax(a)) != int(np.argmax(bb)):
            report["argmax_mismatch"].append(idx)
    report["mean_abs"] = total / max(1, report["entries"])
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours")
    ap.add_argument("oracle")
    ap.add_argument("--max-abs", type=float, default=1e-4)
    ap.add_argument("--floor", type=float, default=-80.0)
    ap.add_argument("--ids", help="our CLI output JSON; its 'tokens' must equal the oracle's greedy ids")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()
    try:
        ours = load_ours(args.ours)
        oracle, greedy = load_oracle(args.oracle)
        if not oracle:
            raise ValueError(f"{args.oracle}: no logprobs records")
        rep = compare(ours, oracle, args.floor)
        ok = rep["max_abs"] <= args.max_abs and not rep["missing_positions"]
        if args.ids:
            with open(args.ids) as f:
                our_ids = json.load(f)["tokens"]
            if greedy is None:
                raise ValueError(f"{args.oracle}: no greedy record to compare --ids with")
            n = min(len(our_ids), len(greedy))
            first = next((i for i in range(n) if our_ids[i] != greedy[i]), None)
            if first is None and len(our_ids) != len(greedy):
                first = n
            rep["greedy_first_mismatch"] = first
            rep["greedy_compared"] = n
            ok = ok and first is None
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_logits: {e}", file=sys.stderr)
        return 2
    rep["max_abs_bound"] = args.max_abs
    rep["pass"] = ok
    if args.json:
        print(json.dumps(rep))
    else:
        print(f"{'PASS' if ok else 'FAIL'}: {rep['positions']} positions, {rep['entries']} entries, "
              f"max |d log p| = {rep['max_abs']:.3g} (bound {args.max_abs:g}), "
              f"mean {rep['mean_abs']:.3g}, argmax mismatches {len(rep['argmax_mismatch'])}"
              + (f", worst {rep['worst']}" if rep["worst"] else "")
              + (f", missing positions {rep['missing_positions']}" if rep["missing_positions"] else "")
              + (f", greedy first mismatch {rep.get('greedy_first_mismatch')}" if args.ids else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
