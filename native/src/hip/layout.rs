//! The MFMA lane layout the HIP kernels are written against, and a CPU mirror of the kernels'
//! tile loop that moves every operand through it.
//!
//! `v_mfma_f32_32x32x{K}_*` (one wave of 64 lanes; `g = lane / 32`, `c = lane % 32`,
//! `KPL = K / 2` elements per lane and operand), from the CDNA3/CDNA4 ISA guides' operand
//! tables:
//! * A (32 × K): lane holds `A[c][g·KPL + i]`, `i < KPL`;
//! * B (K × 32): lane holds `B[g·KPL + i][c]`;
//! * C/D (32 × 32, 16 f32 per lane): register `r` holds `C[8·(r/4) + 4·g + r%4][c]`.
//!
//! [`MfmaShape`] is that table; [`super::HipKernelId`] passes its `K` to the kernels as
//! `MFMA_K`, and `native/hip/common.h` implements the same three maps. [`emulate_forward`] runs
//! the kernels' algorithm lane by lane: Qᵀ, K, Vᵀ and Pᵀ fragments are gathered into per-lane
//! registers with the kernels' own index expressions, each MFMA rebuilds its A and B matrices
//! from the lanes through the operand maps, forms the products exactly, adds them in f64 and
//! rounds the 32×32 result once to f32 (the matrix core sums at least at f32 precision), and
//! scatters D back through the C map. A wrong pairing of keys between Pᵀ and Vᵀ, or of head
//! dims between Qᵀ and K, makes the result wrong by O(1), which the tests against the f64
//! reference see.

/// One 32×32×K MFMA shape: which lane holds which element of A, B and C/D.
///
/// For the `32x32x64` f8f6f4 form the k order within a lane's 32 codes is taken as
/// `g·32 + i` like the smaller forms. The kernels do not depend on it: A and B of every MFMA
/// share one k map, and each kernel loads the A and B slot `i` of a lane with the same k (the
/// same head dim for Q·Kᵀ, the same key for P·V), so any map pairs the right products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct MfmaShape {
    /// The reduction depth: 8 (`32x32x8` f16/bf16) or 16 (`32x32x16` f16/bf16 on gfx950,
    /// `32x32x16_fp8_fp8` on both targets).
    pub k: usize,
}

/// Lanes of a wave.
pub const WAVE: usize = 64;
/// Accumulator registers per lane of a 32×32 tile.
pub const C_REGS: usize = 16;

impl MfmaShape {
    /// Operand elements per lane.
    pub const fn kpl(self) -> usize {
        self.k / 2
    }

    /// `(row, k)` of A held by element `i` of `lane`.
    pub const fn a_elem(self, lane: usize, i: usize) -> (usize, usize) {
        (lane % 32, (lane / 32) * self.kpl() + i)
    }

    /// `(k, col)` of B held by element `i` of `lane`.
    pub const fn b_elem(self, lane: usize, i: usize) -> (usize, usize) {
        ((lane / 32) * self.kpl() + i, lane % 32)
    }

    /// `(row, col)` of C/D held by register `r` of `lane`.
    pub const fn c_elem(lane: usize, r: usize) -> (usize, usize) {
        (c_row(lane / 32, r), lane % 32)
    }
}

/// Row of the C/D tile in register `r` of a lane of group `g` (`mfma_c_row` in common.h).
pub const fn c_row(g: usize, r: usize) -> usize {
    8 * (r / 4) + 4 * g + r % 4
}

/// Operand elements per lane of the widest form (`32x32x64`).
pub const MAX_KPL: usize = 32;
/// Per-lane operand registers of one MFMA (`KPL` used entries of [`MAX_KPL`]).
pub type Operand = [[f32; MAX_KPL]; WAVE];
/// Per-lane accumulator registers of one 32×32 tile.
pub type Accum = [[f32; C_REGS]; WAVE];

/// One MFMA on lane registers: D = A·B + C through the operand maps, exact products summed in
/// f64 and rounded once to f32 per element.
pub fn wave_mfma(shape: MfmaShape, a: &Operand, b: &Operand, c: &mut Accum) {
    let mut am = [[0f64; 64]; 32];
    let mut bm = [[0f64; 32]; 64];
    for lane in 0..WAVE {
        for i in 0..shape.kpl() {
            let (row, k) = shape.a_elem(lane, i);
            am[row][k] = a[lane][i] as f64;
            let (k, col) = shape.b_elem(lane, i);
            bm[k][col] = b[lane][i] as f64;
        }
    }
    for (lane, regs) in c.iter_mut().enumerate() {
        for (r, acc) in regs.iter_mut().enumerate() {
            let (row, col) = MfmaShape::c_elem(lane, r);
            let dot: f64 = (0..shape.k).map(|k| am[row][k] * bm[k][col]).sum();
            *acc = (*acc as f64 + dot) as f32;
        }
    }
}

/// What one emulated launch computes: one (batch, head) slice of the kernel's work.
#[derive(Clone, Copy, Debug)]
pub struct EmulatedHead<'a> {
    /// `[q_len, d]` row-major, values as the kernel reads them (16-bit values, or decoded FP8
    /// codes without their descales).
    pub q: &'a [f32],
    /// `[kv_len, d]`.
    pub k: &'a [f32],
    /// `[kv_len, d]`.
    pub v: &'a [f32],
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    /// `scale · log2 e · q_descale · k_descale`: raw scores to log2 units.
    pub c_log2: f32,
    /// Factor on O after the division by l (`v_descale` of the FP8 family, else 1).
    pub o_factor: f32,
    pub causal: bool,
}

/// How the emulated kernel rounds, as its variant does.
#[derive(Clone, Copy, Debug)]
pub struct EmulatedKernel {
    /// The Q·Kᵀ MFMA.
    pub qk: MfmaShape,
    /// The P·V MFMA.
    pub pv: MfmaShape,
    /// Waves per workgroup (32 query rows each).
    pub waves: usize,
    /// Keys per KV tile.
    pub block_n: usize,
    /// log2 of the factor P is scaled by before rounding (log2 448 or 240 for FP8 P, else 0).
    pub p_log2: f32,
    /// P's rounding into the P·V operand (to f16, bf16, or an FP8 code's value).
    pub round_p: fn(f32) -> f32,
}

/// O (`[q_len, d]`, f32 before the output conversion) and LSE (`[q_len]`) of one head.
#[derive(Clone, Debug)]
pub struct EmulatedOutput {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

/// The kernels' forward pass over one (batch, head), workgroup by workgroup, wave by wave,
/// lane by lane, as `fwd_mfma.hip` / `fwd_mfma_fp8.hip` order it (transposed scores, one query
/// per lane, l summed per lane group and combined at the end, exp2 of an fma).
pub fn emulate_forward(h: &EmulatedHead<'_>, kern: &EmulatedKernel) -> EmulatedOutput {
    let d = h.head_dim;
    let (qk, pv) = (kern.qk, kern.pv);
    let (nt, dt_tiles) = (kern.block_n / 32, d / 32);
    let bm = 32 * kern.waves;
    let mut out = EmulatedOutput { o: vec![0.0; h.q_len * d], lse: vec![0.0; h.q_len] };
    let offset = h.kv_len as i64 - h.q_len as i64;
    for m0 in (0..h.q_len).step_by(bm) {
        let mut n_end = h.kv_len as i64;
        if h.causal {
            n_end = n_end.min(m0 as i64 + bm as i64 + offset);
        }
        for wave in 0..kern.waves {
            let row_of = |lane: usize| m0 + 32 * wave + lane % 32;
            // Qᵀ fragments: Q[row][s·K + g·KPL + i].
            let qf: Vec<Operand> = (0..d / qk.k)
                .map(|s| {
                    let mut f = [[0f32; MAX_KPL]; WAVE];
                    for (lane, regs) in f.iter_mut().enumerate() {
                        let row = row_of(lane);
                        for (i, x) in regs.iter_mut().take(qk.kpl()).enumerate() {
                            if row < h.q_len {
                                *x = h.q[row * d + s * qk.k + (lane / 32) * qk.kpl() + i];
                            }
                        }
                    }
                    f
                })
                .collect();
            let mut o: Vec<Accum> = vec![[[0f32; C_REGS]; WAVE]; dt_tiles];
            let mut m = [f32::NEG_INFINITY; WAVE];
            let mut l = [0f32; WAVE];
            let mut n0 = 0i64;
            while n0 < n_end {
                let n = n0 as usize;
                let key_ok = |key: usize| key < h.kv_len;
                // Sᵀ = K·Qᵀ per 32-key tile; A = K[n + 32t + c][s·K + g·KPL + i].
                let mut s: Vec<Accum> = vec![[[0f32; C_REGS]; WAVE]; nt];
                for (t, st) in s.iter_mut().enumerate() {
                    for (step, qfs) in qf.iter().enumerate() {
                        let mut a = [[0f32; MAX_KPL]; WAVE];
                        for (lane, regs) in a.iter_mut().enumerate() {
                            let key = n + 32 * t + lane % 32;
                            for (i, x) in regs.iter_mut().take(qk.kpl()).enumerate() {
                                if key_ok(key) {
                                    *x = h.k[key * d + step * qk.k + (lane / 32) * qk.kpl() + i];
                                }
                            }
                        }
                        wave_mfma(qk, &a, qfs, st);
                    }
                }
                // Mask, then the online softmax per lane (common.h's thread_online_softmax).
                let mut alpha = [0f32; WAVE];
                let mut local_max = [f32::NEG_INFINITY; WAVE];
                for lane in 0..WAVE {
                    let (g, row) = (lane / 32, row_of(lane) as i64);
                    let diag = if h.causal { row + offset + 1 } else { i64::MAX };
                    let limit = diag.min(h.kv_len as i64);
                    let mut mx = m[lane];
                    for (t, st) in s.iter_mut().enumerate() {
                        for r in 0..C_REGS {
                            if (n + 32 * t + c_row(g, r)) as i64 >= limit {
                                st[lane][r] = f32::NEG_INFINITY;
                            }
                            mx = mx.max(st[lane][r]);
                        }
                    }
                    local_max[lane] = mx;
                }
                for lane in 0..WAVE {
                    let mx = local_max[lane].max(local_max[lane ^ 32]);
                    let m_use = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
                    alpha[lane] = if m[lane] == f32::NEG_INFINITY {
                        if mx == f32::NEG_INFINITY { 1.0 } else { 0.0 }
                    } else {
                        ((m[lane] - m_use) * h.c_log2).exp2()
                    };
                    let bias = kern.p_log2 - m_use * h.c_log2;
                    let mut sum = 0f32;
                    for st in s.iter_mut() {
                        for r in 0..C_REGS {
                            let p = st[lane][r].mul_add(h.c_log2, bias).exp2();
                            st[lane][r] = p;
                            sum += p;
                        }
                    }
                    l[lane] = l[lane] * alpha[lane] + sum;
                    m[lane] = mx;
                }
                for ot in o.iter_mut() {
                    for (lane, regs) in ot.iter_mut().enumerate() {
                        for x in regs.iter_mut() {
                            *x *= alpha[lane];
                        }
                    }
                }
                // Oᵀ += Vᵀ·Pᵀ: step ps takes slots j = ps·KPL + i of the lane's Sᵀ registers
                // flattened over the 32-key tiles (tile j / 16, register j % 16) as B, and
                // A = V[key of that register][32·dt + c].
                for ps in 0..kern.block_n / pv.k {
                    let mut b: Operand = [[0f32; MAX_KPL]; WAVE];
                    for (lane, regs) in b.iter_mut().enumerate() {
                        for (i, x) in regs.iter_mut().take(pv.kpl()).enumerate() {
                            let j = ps * pv.kpl() + i;
                            *x = (kern.round_p)(s[j / 16][lane][j % 16]);
                        }
                    }
                    for (dt, ot) in o.iter_mut().enumerate() {
                        let mut a: Operand = [[0f32; MAX_KPL]; WAVE];
                        for (lane, regs) in a.iter_mut().enumerate() {
                            let dim = 32 * dt + lane % 32;
                            for (i, x) in regs.iter_mut().take(pv.kpl()).enumerate() {
                                let j = ps * pv.kpl() + i;
                                let key = n + 32 * (j / 16) + c_row(lane / 32, j % 16);
                                if key_ok(key) {
                                    *x = h.v[key * d + dim];
                                }
                            }
                        }
                        wave_mfma(pv, &a, &b, ot);
                    }
                }
                n0 += kern.block_n as i64;
            }
            // Epilogue: l of both lane groups, O = acc · o_factor / l, LSE in natural log.
            for lane in 0..WAVE {
                let row = row_of(lane);
                if row >= h.q_len {
                    continue;
                }
                let l_all = l[lane] + l[lane ^ 32];
                let empty = !(l_all > 0.0);
                let f = if empty { 0.0 } else { h.o_factor / l_all };
                for (dt, ot) in o.iter().enumerate() {
                    for r in 0..C_REGS {
                        out.o[row * d + 32 * dt + c_row(lane / 32, r)] = ot[lane][r] * f;
                    }
                }
                if lane < 32 {
                    out.lse[row] = if empty {
                        f32::NEG_INFINITY
                    } else {
                        (m[lane] * h.c_log2 + l_all.log2() - kern.p_log2) * std::f32::consts::LN_2
                    };
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_maps_are_bijections() {
        for k in [8, 16, 64] {
            let s = MfmaShape { k };
            let mut a = vec![0u32; 32 * k];
            let mut b = vec![0u32; 32 * k];
            for lane in 0..WAVE {
                for i in 0..s.kpl() {
                    let (row, kk) = s.a_elem(lane, i);
                    a[row * k + kk] += 1;
                    let (kk, col) = s.b_elem(lane, i);
                    b[kk * 32 + col] += 1;
                }
            }
            assert!(a.iter().all(|&n| n == 1) && b.iter().all(|&n| n == 1), "K = {k}");
        }
        let mut c = [0u32; 1024];
        for lane in 0..WAVE {
            for r in 0..C_REGS {
                let (row, col) = MfmaShape::c_elem(lane, r);
                c[row * 32 + col] += 1;
            }
        }
        assert!(c.iter().all(|&n| n == 1));
    }

    /// The ISA tables' anchor points: lane 0 holds A[0][0..KPL], lane 32 starts at k = KPL,
    /// and register 4 of lane 0 is row 8 of C (rows 4..7 belong to lane group 1).
    #[test]
    fn layout_matches_the_isa_tables() {
        let s = MfmaShape { k: 16 };
        assert_eq!(s.a_elem(0, 7), (0, 7));
        assert_eq!(s.a_elem(32, 0), (0, 8));
        assert_eq!(s.b_elem(33, 1), (9, 1));
        assert_eq!(MfmaShape::c_elem(0, 3), (3, 0));
        assert_eq!(MfmaShape::c_elem(0, 4), (8, 0));
        assert_eq!(MfmaShape::c_elem(32, 0), (4, 0));
        assert_eq!(MfmaShape::c_elem(63, 15), (31, 31));
    }

    #[test]
    fn one_mfma_is_a_matrix_product() {
        for k in [8, 16, 64] {
            let s = MfmaShape { k };
            let am = |r: usize, kk: usize| ((r * 7 + kk * 3) % 11) as f32 - 5.0;
            let bm = |kk: usize, c: usize| ((kk * 5 + c * 2) % 13) as f32 - 6.0;
            let mut a = [[0f32; MAX_KPL]; WAVE];
            let mut b = [[0f32; MAX_KPL]; WAVE];
            for lane in 0..WAVE {
                for i in 0..s.kpl() {
                    let (r, kk) = s.a_elem(lane, i);
                    a[lane][i] = am(r, kk);
                    let (kk, c) = s.b_elem(lane, i);
                    b[lane][i] = bm(kk, c);
                }
            }
            let mut c = [[1f32; C_REGS]; WAVE];
            wave_mfma(s, &a, &b, &mut c);
            for lane in 0..WAVE {
                for r in 0..C_REGS {
                    let (row, col) = MfmaShape::c_elem(lane, r);
                    let want: f32 = 1.0 + (0..k).map(|kk| am(row, kk) * bm(kk, col)).sum::<f32>();
                    assert_eq!(c[lane][r], want, "K {k} lane {lane} r {r}");
                }
            }
        }
    }
}
