#!/usr/bin/env python3
# Host replay of reports/pending/wq0.patch's wq0 tile (Q8_0, one CTA) thread by thread, with wgmma
# emulated per the fragment layouts and descriptor strides the tile assumes, against the
# reference lane chains (dot_q0_lanes). Needs numpy (Debian python3-numpy: /usr/bin/python3).
#   /usr/bin/python3 reports/pending/wq0-sim.py [SEED] [ROWS <= NR] [TOKENS <= 16 WG] [NR: 32 | 64]
# (NR 32: 4 warpgroups, the default tile; 64: 2 warpgroups, WORKER_WQ0_N=64)
import sys

import numpy as np
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
kNR = int(sys.argv[4]) if len(sys.argv) > 4 else 32
WG = 4 if kNR == 32 else 2
T = 128 * WG
kNT, kKB, kKS = 16 * WG, 4, 128
kRI = kNR // 8
kXS = kKS + 16
kSliceB = kNR * 16 * 2
kLbo, kSbo = 128, 256
kDwS = kNR // 4 + 4
kXBytes = kNT * kXS * 2
kXGap = kXBytes + 64
rows, cols, n_tok = int(sys.argv[2]) if len(sys.argv) > 2 else 30, 256, int(sys.argv[3]) if len(sys.argv) > 3 else 50
nb = cols // 32
steps = nb // kKB
f32 = np.float32
def fma(a, b, c):  # same function in sim and reference
    return f32(np.float64(a) * np.float64(b) + np.float64(c))
W = rng.integers(-128, 128, size=(rows, cols))
X = rng.integers(-127, 128, size=(n_tok, cols))
DW = rng.uniform(0.001, 0.05, size=(rows, nb)).astype(np.float16).astype(f32)
DA = rng.uniform(0.001, 0.05, size=(n_tok, nb)).astype(f32)
# reference
ref = np.zeros((n_tok, rows), dtype=f32)
for r in range(rows):
    for t in range(n_tok):
        acc = [f32(0)] * 8
        for b in range(nb):
            d = f32(DW[r, b] * DA[t, b])
            for L in range(8):
                lane = int(np.dot(W[r, 32*b+4*L:32*b+4*L+4], X[t, 32*b+4*L:32*b+4*L+4]))
                acc[L] = fma(d, lane, acc[L])
        v = acc
        t0, t1, t2, t3 = f32(v[0]+v[4]), f32(v[1]+v[5]), f32(v[2]+v[6]), f32(v[3]+v[7])
        ref[t, r] = f32(f32(t0 + t2) + f32(t1 + t3))
# --- simulated CTA (row0 = 0, tok0 = 0); smem as dicts of byte offset -> value
out = np.full((kNT, kNR + 1), np.nan, dtype=f32)
ch = np.zeros((T, kRI, 2, 4), dtype=f32)
def wval(n, k):  # weight value of row n, element k of the matrix (zero-filled past rows)
    return int(W[n, k]) if n < rows else 0
for step in range(steps):
    # convert: weights -> Bsm (byte offset -> f16 value list of 8)
    Bsm = {}
    G = kNR // 8
    for u in range(kNR * 16):
        n = (u & 7) | (((u >> 4) % G) << 3); kh = (u >> 3) & 1; q = (u >> 4) // G
        blk = q >> 1; hf = q & 1
        e0 = 32 * (step * kKB + blk) + 16 * hf + 8 * kh
        off = q * kSliceB + (n >> 3) * kSbo + kh * kLbo + (n & 7) * 16
        assert off not in Bsm
        Bsm[off] = [wval(n, e0 + i) for i in range(8)]
    dw = {}
    for tid in range(kNR * kKB):
        row = tid >> 2; blk = tid & 3
        dw[blk * 4 * kDwS + ((row >> 1) & 3) * kDwS + (row >> 3) * 2 + (row & 1)] = DW[row, step*kKB+blk] if row < rows else f32(0)
    # activations: halves array of 3*kXGap/2
    xs = np.zeros(3 * kXGap // 2, dtype=np.int64)
    xfill = np.zeros(3 * kXGap // 2, dtype=bool); xfill[kXGap//2:2*kXGap//2] = True  # zeros valid
    base = 0  # stage (step & 1): x at 2*kXGap*cur bytes; simulate at stage 'cur'
    cur = step & 1
    xb = 2 * kXGap * cur // 2
    for tid in range(T):
        tok = tid >> 3; blk = (tid >> 1) & 3; hf = tid & 1
        v = []  # word 8hf + w: elements 16hf + 2w, +1 : pairs
        for w_ in range(8):
            e = 32 * (step * kKB + blk) + 16 * hf + 2 * w_
            v.append((int(X[tok, e]) if tok < n_tok else 0, int(X[tok, e+1]) if tok < n_tok else 0))
        dst = xb + tok * kXS + 32 * blk + 4 * hf  # halves, uint2 = 4 halves
        for t in range(4):
            p = dst + 8 * t
            for j, val in enumerate([*v[t], *v[t+4]]):
                xs[p + j] = val; xfill[p + j] = True
    da = {}
    for tid in range(kNT * kKB):
        tok = tid >> 2; blk = tid & 3
        da[tid] = DA[tok, step*kKB+blk] if tok < n_tok else f32(0)
    # compute: per thread registers
    regs = {}
    for tid in range(T):
        lane = tid & 31; g = lane >> 2; t = lane & 3
        tok = 16 * (tid >> 7) + 4 * ((tid >> 5) & 3) + (g >> 1)
        xoff = 0 if (t >> 1) == (g & 1) else kXGap
        xbb = 2 * kXGap * cur + (xoff if cur == 0 else -xoff)  # bytes
        xw = []
        for b in range(kKB):
            o = (xbb + 2 * (tok * kXS + 32 * b + 8 * t)) // 2
            assert xfill[o:o+8].all(), (tid, b)
            words = [(int(xs[o+2*i]), int(xs[o+2*i+1])) for i in range(4)]
            xw.append(words)  # .x .y .z .w as (lo, hi) half pairs
        regs[tid] = (tok, xw)
    for q in range(8):
        b = q >> 1; sl = q & 1
        for wg in range(WG):
            A = np.zeros((64, 16), dtype=np.int64)
            for tl in range(128):
                tid = 128 * wg + tl
                w_ = tl >> 5; lane = tl & 31; g = lane >> 2; t = lane & 3
                tok, xw = regs[tid]
                r0 = xw[b][2] if sl else xw[b][0]
                r3 = xw[b][3] if sl else xw[b][1]
                A[16*w_+g, 2*t:2*t+2] = r0
                A[16*w_+g+8, 2*t:2*t+2] = (0, 0)
                A[16*w_+g, 2*t+8:2*t+10] = (0, 0)
                A[16*w_+g+8, 2*t+8:2*t+10] = r3
            Bm = np.zeros((16, kNR), dtype=np.int64)
            for k in range(16):
                for n in range(kNR):
                    off = q * kSliceB + (n >> 3) * kSbo + (k >> 3) * kLbo + (n & 7) * 16  # H1
                    Bm[k, n] = Bsm[off][k & 7]
            D = A @ Bm
            for tl in range(128):
                tid = 128 * wg + tl
                w_ = tl >> 5; lane = tl & 31; g = lane >> 2; t = lane & 3
                tok = regs[tid][0]
                d = [f32(D[16*w_+g+8*((j>>1)&1), 8*(j>>2)+2*t+(j&1)]) for j in range(4 * kRI)]
                dwp = b * 4 * kDwS + t * kDwS
                dwv = [dw[dwp + j] for j in range(2 * kRI)]
                dab = da[tok * kKB + b]
                for i in range(kRI):
                    for e in range(2):
                        sc = f32(dwv[2*i+e] * dab)
                        ch[tid, i, e, 2*sl] = fma(sc, d[4*i+e], ch[tid, i, e, 2*sl])
                        ch[tid, i, e, 2*sl+1] = fma(sc, d[4*i+2+e], ch[tid, i, e, 2*sl+1])
# combine
P = np.zeros((T, kRI, 2), dtype=f32)
for tid in range(T):
    for i in range(kRI):
        for e in range(2):
            v = ch[tid, i, e]
            P[tid, i, e] = f32(f32(v[0] + v[2]) + f32(v[1] + v[3]))
for tid in range(T):
    lane = tid & 31; g = lane >> 2; t = lane & 3
    tok = 16 * (tid >> 7) + 4 * ((tid >> 5) & 3) + (g >> 1)
    partner = (tid & ~31) | (lane ^ 4)
    for i in range(kRI):
        for e in range(2):
            s = f32(P[tid, i, e] + P[partner, i, e])
            if (g & 1) == 0:
                out[tok, 8*i + 2*t + e] = s
y = np.full((n_tok, rows), np.nan, dtype=f32)
for u in range(kNT * kNR // 4):
    tt = u // (kNR // 4); r = 4 * (u % (kNR // 4))
    if tt < n_tok:
        for j in range(4):
            if r + j < rows: y[tt, r + j] = out[tt, r + j]
bad = np.sum(y.view(np.uint32) != ref.view(np.uint32))
print("rows", rows, "n_tok", n_tok, "mismatches", bad, "of", y.size)
