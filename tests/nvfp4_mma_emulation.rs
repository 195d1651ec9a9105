//! The sm_120a NVFP4 kernel (`native/cuda/fwd_nvfp4.cu`) mirrored on the CPU at the level of
//! its warps' registers: Q and K codes and scale bytes are loaded into per-lane registers with
//! the kernel's offsets, the block-scaled `m16n8k64` MMA is evaluated from those registers
//! through the PTX fragment layout of `quattn_native::nvfp4::lanes` (which lane holds which A, B,
//! C element and which scale byte), and the CTA / warp / KV-tile loop, masking, online softmax,
//! P packing (and, for FP4 P·V, the quad byte transpose of P's codes) follow the kernel. The
//! result is held to the f64 reference with the NVFP4 tolerance, its LSE to the f64 LSE of the
//! dequantized Q and K within 1e-4, and O to quattn's NVFP4 emulation
//! (`Blocking { block_q: 64, block_k: 64 }`) within one ulp of the output type.
//!
//! The kernel has been compiled and disassembled, never run (no sm_120 device): this shows that
//! its index math and rounding points, as written down here, compute NVFP4 attention; a wrong
//! lane mapping scrambles Q·Kᵀ and fails both comparisons. What is not modelled: the order in
//! which the tensor core adds products inside one MMA (at least f32 precision; here block by
//! block in k order, the emulation's order), and `ex2.approx` / `lg2.approx` (CPU exp2 / ln).
//! The 16-bit P·V (HMMA m16n8k16) is modelled as matrices: exact products summed in f32 per
//! 16-key step, added to the f32 accumulator.

use quattn::codec::float16::{round_bf16, round_bf16_vec, round_f16, round_f16_vec};
use quattn::codec::fp4::e2m1;
use quattn::codec::fp8::ue4m3;
use quattn::codec::nvfp4::{self, Nvfp4Tensor};
use quattn::emulation::{emulate, Blocking};
use quattn::metrics::{ErrorMetrics, Tolerance};
use quattn::reference::attention_f64;
use quattn::{AttentionProblem, Layout, Nvfp4V, Precision};
use quattn_native::nvfp4::{lanes, Nvfp4Config, PvMode, BLOCK_K, BLOCK_Q};

const WARPS: usize = 4;

/// Prepass layout of one NVFP4 tensor: codes `[rows, d/2]`, scales `[rows, d/16]`, rows in
/// (batch, head, seq) order (the codec quantized the tensor in memory order; blocks are per row
/// and the tensor scale global, so reordering rows changes no byte).
struct Rows {
    codes: Vec<u8>,
    scales: Vec<u8>,
    ts: f32,
}

fn prepass_rows(t: &Nvfp4Tensor, batch: usize, heads: usize, seq: usize, d: usize, offset: impl Fn(usize, usize, usize) -> usize) -> Rows {
    let mut codes = Vec::new();
    let mut scales = Vec::new();
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                let r = offset(b, h, s) / d;
                codes.extend_from_slice(&t.packed[r * d / 2..][..d / 2]);
                scales.extend_from_slice(&t.block_scales[r * d / 16..][..d / 16]);
            }
        }
    }
    Rows { codes, scales, ts: t.tensor_scale }
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// One `mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64` of a warp, from its
/// registers: A 4 and B 2 registers of eight E2M1 codes per lane, one scale register per lane
/// (read only where [`lanes`] says the hardware reads it), C/D 4 f32 per lane. Per output
/// element: blocks of 16 in k order, `(sa · sb) · Σ e2m1·e2m1` added to the accumulator.
fn warp_mma(a: &[[u32; 4]; 32], b: &[[u32; 2]; 32], sa: &[u32; 32], sb: &[u32; 32], c: &mut [[f32; 4]; 32]) {
    let mut am = [[0f32; 64]; 16];
    let mut bm = [[0f32; 64]; 8];
    let mut sam = [[None::<f32>; 4]; 16];
    let mut sbm = [[None::<f32>; 4]; 8];
    for lane in 0..32 {
        for i in 0..4 {
            let (r, k) = lanes::a_reg(lane, i);
            for j in 0..8 {
                am[r][k + j] = e2m1::decode(((a[lane][i] >> (4 * j)) & 0xF) as u8);
            }
        }
        for i in 0..2 {
            let (n, k) = lanes::b_reg(lane, i);
            for j in 0..8 {
                bm[n][k + j] = e2m1::decode(((b[lane][i] >> (4 * j)) & 0xF) as u8);
            }
        }
        if let Some(r) = lanes::a_scale_row(lane) {
            for (blk, s) in sam[r].iter_mut().enumerate() {
                assert!(s.is_none(), "row {r} scale supplied twice");
                *s = Some(ue4m3::decode((sa[lane] >> (8 * blk)) as u8));
            }
        }
        if let Some(n) = lanes::b_scale_col(lane) {
            for (blk, s) in sbm[n].iter_mut().enumerate() {
                *s = Some(ue4m3::decode((sb[lane] >> (8 * blk)) as u8));
            }
        }
    }
    for lane in 0..32 {
        for i in 0..4 {
            let (r, n) = lanes::c_elem(lane, i);
            let mut acc = c[lane][i];
            for blk in 0..4 {
                let ks = lanes::scale_byte_of_k(16 * blk) * 16..(lanes::scale_byte_of_k(16 * blk) + 1) * 16;
                let inner = ks.clone().fold(0.0f32, |s, k| s + am[r][k] * bm[n][k]);
                acc += (sam[r][blk].expect("row scale") * sbm[n][blk].expect("col scale")) * inner;
            }
            c[lane][i] = acc;
        }
    }
}

struct KernelOut {
    o: Vec<f32>,
    lse: Vec<f32>,
}

/// The kernel's arithmetic, CTA by CTA and warp by warp, for `cfg` on `p`. `q`, `k`, `v` are
/// the f32 inputs already rounded to the precision's input type.
fn kernel(cfg: &Nvfp4Config, p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32]) -> KernelOut {
    let d = p.head_dim;
    let (qs_, ks_, vs_, os_) = (p.q_strides(), p.k_strides(), p.v_strides(), p.o_strides());
    let qt = Nvfp4Tensor::quantize(q, q.len() / d, d).unwrap();
    let kt = Nvfp4Tensor::quantize(k, k.len() / d, d).unwrap();
    let qr = prepass_rows(&qt, p.batch, p.q_heads, p.q_len, d, |b, h, s| qs_.offset(b, h, s));
    let kr = prepass_rows(&kt, p.batch, p.kv_heads, p.kv_len, d, |b, h, s| ks_.offset(b, h, s));
    // FP4 P·V: Vᵀ `[batch, kv_heads, d, kv_pad]`, 16-key blocks per channel, one tensor scale.
    let kv_pad = p.kv_len.div_ceil(BLOCK_K as usize) * BLOCK_K as usize;
    let vt = (cfg.pv == PvMode::Fp4).then(|| {
        let rows = p.batch * p.kv_heads * d;
        let mut x = vec![0.0f32; rows * kv_pad];
        for b in 0..p.batch {
            for h in 0..p.kv_heads {
                for j in 0..p.kv_len {
                    for c in 0..d {
                        x[((b * p.kv_heads + h) * d + c) * kv_pad + j] = v[vs_.offset(b, h, j) + c];
                    }
                }
            }
        }
        Nvfp4Tensor::quantize(&x, rows, kv_pad).unwrap()
    });
    let round_p = |x: f32| match cfg.pv {
        PvMode::Half { bf16: true } => round_bf16(x),
        _ => round_f16(x),
    };
    let round_out = round_p;
    let c_log2 = p.softmax_scale() * std::f32::consts::LOG2_E;
    let ts_qk = qr.ts * kr.ts;
    let group = p.q_heads / p.kv_heads;
    let shift = p.kv_len as isize - p.q_len as isize;
    let visible = |row: usize| -> usize {
        if p.causal {
            (row as isize + shift + 1).clamp(0, p.kv_len as isize) as usize
        } else {
            p.kv_len
        }
    };
    let ksteps = d / 64;
    let mut o = vec![f32::NAN; p.o_len_elems()];
    let mut lse = vec![f32::NAN; p.batch * p.q_heads * p.q_len];

    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let kvh = h / group;
            let q_row_base = (b * p.q_heads + h) * p.q_len;
            let kv_row0 = (b * p.kv_heads + kvh) * p.kv_len;
            for q_block in 0..p.q_len.div_ceil(BLOCK_Q as usize) {
                let last_row = (p.q_len.min((q_block + 1) * BLOCK_Q as usize)) - 1;
                let kv_end = visible(last_row);
                let n_tiles = kv_end.div_ceil(BLOCK_K as usize);
                for warp in 0..WARPS {
                    let row0 = q_block * BLOCK_Q as usize + warp * 16;
                    let row_of = |lane: usize, r: usize| row0 + lane / 4 + 8 * r;
                    // Q registers.
                    let mut qa = vec![[[0u32; 4]; 32]; ksteps];
                    let mut qsc = vec![[0u32; 32]; ksteps];
                    for c in 0..ksteps {
                        for lane in 0..32 {
                            for i in 0..4 {
                                let (r, _) = lanes::a_reg(lane, i);
                                if row0 + r < p.q_len {
                                    qa[c][lane][i] = le32(&qr.codes, lanes::a_code_offset(lane, i, c, d, q_row_base + row0));
                                }
                            }
                            let srow = row_of(lane, lane % 4 & 1);
                            if srow < p.q_len {
                                qsc[c][lane] = le32(&qr.scales, lanes::scale_offset(q_row_base + srow, c, d));
                            }
                        }
                    }
                    let mut m = [[f32::NEG_INFINITY; 2]; 32];
                    let mut l = [[0f32; 2]; 32];
                    let mut acc = vec![[[0f32; 4]; 32]; d / 8];
                    for t in 0..n_tiles {
                        let key0 = t * BLOCK_K as usize;
                        let nk = (BLOCK_K as usize).min(p.kv_len - key0);
                        // Shared memory of the stage: K rows past the end keep stale bytes (0xFF
                        // here), their scales are zeroed by the producer.
                        let mut ksm = vec![0xFFu8; BLOCK_K as usize * d / 2];
                        let mut kss = vec![0u8; BLOCK_K as usize * d / 16];
                        ksm[..nk * d / 2].copy_from_slice(&kr.codes[(kv_row0 + key0) * d / 2..][..nk * d / 2]);
                        kss[..nk * d / 16].copy_from_slice(&kr.scales[(kv_row0 + key0) * d / 16..][..nk * d / 16]);
                        // S = Q·Kᵀ, n-tile by n-tile.
                        let mut sc = vec![[[0f32; 4]; 32]; 8];
                        for (j, s_j) in sc.iter_mut().enumerate() {
                            for c in 0..ksteps {
                                let mut bb = [[0u32; 2]; 32];
                                let mut sb = [0u32; 32];
                                for lane in 0..32 {
                                    for (i, reg) in bb[lane].iter_mut().enumerate() {
                                        let (n, kk) = lanes::b_reg(lane, i);
                                        *reg = le32(&ksm, (8 * j + n) * d / 2 + (64 * c + kk) / 2);
                                    }
                                    sb[lane] = le32(&kss, lanes::scale_offset(8 * j + lane / 4, c, d));
                                }
                                warp_mma(&qa[c], &bb, &qsc[c], &sb, s_j);
                            }
                        }
                        // Softmax, per lane and row, as the kernel.
                        let mut alpha = [[1f32; 2]; 32];
                        for r in 0..2 {
                            let mut rowmax = [f32::NEG_INFINITY; 32];
                            for lane in 0..32 {
                                let vis = visible(row_of(lane, r));
                                for (j, s_j) in sc.iter_mut().enumerate() {
                                    for e in 0..2 {
                                        let key = key0 + 8 * j + 2 * (lane % 4) + e;
                                        let x = s_j[lane][2 * r + e] * ts_qk;
                                        let x = if key < vis { x } else { f32::NEG_INFINITY };
                                        s_j[lane][2 * r + e] = x;
                                        rowmax[lane] = rowmax[lane].max(x);
                                    }
                                }
                            }
                            for lane in 0..32 {
                                let quad = lane & !3;
                                let mx = (0..4).fold(f32::NEG_INFINITY, |a, i| a.max(rowmax[quad + i]));
                                let m_new = m[lane][r].max(mx);
                                let m_use = m_new; // RESCALE_LOG2 0: the emulation's order
                                alpha[lane][r] = if m_use == m[lane][r] {
                                    1.0
                                } else if m[lane][r] == f32::NEG_INFINITY {
                                    0.0
                                } else {
                                    ((m[lane][r] - m_use) * c_log2).exp2()
                                };
                                let mc = if m_use == f32::NEG_INFINITY { 0.0 } else { m_use * c_log2 };
                                m[lane][r] = m_use;
                                let mut sum = 0.0f32;
                                for s_j in sc.iter_mut() {
                                    for e in 0..2 {
                                        let pv = s_j[lane][2 * r + e].mul_add(c_log2, -mc).exp2();
                                        s_j[lane][2 * r + e] = pv;
                                        sum += pv;
                                    }
                                }
                                l[lane][r] = l[lane][r] * alpha[lane][r] + sum;
                            }
                        }
                        for a_n in acc.iter_mut() {
                            for lane in 0..32 {
                                for e in 0..4 {
                                    a_n[lane][e] *= alpha[lane][e / 2];
                                }
                            }
                        }
                        match cfg.pv {
                            PvMode::Half { .. } => {
                                // P as the 16x64 matrix the m16n8k16 A fragments pack (lane
                                // (g, t) holds keys 8j + 2t, +1 of n-tile j: the C layout).
                                let mut pm = [[0f32; 64]; 16];
                                for (j, s_j) in sc.iter().enumerate() {
                                    for lane in 0..32 {
                                        for i in 0..4 {
                                            let (r, n) = lanes::c_elem(lane, i);
                                            pm[r][8 * j + n] = round_p(s_j[lane][i]);
                                        }
                                    }
                                }
                                let vrow = |key: usize| -> Option<usize> { (key < p.kv_len).then(|| vs_.offset(b, kvh, key)) };
                                for kk in 0..(BLOCK_K as usize / 16) {
                                    for (n, a_n) in acc.iter_mut().enumerate() {
                                        for lane in 0..32 {
                                            for i in 0..4 {
                                                let (r, col) = lanes::c_elem(lane, i);
                                                let ch = 8 * n + col;
                                                let step = (0..16).fold(0.0f32, |s, kx| {
                                                    let key = key0 + 16 * kk + kx;
                                                    s + pm[r][16 * kk + kx] * vrow(key).map_or(0.0, |o| v[o + ch])
                                                });
                                                a_n[lane][i] += step;
                                            }
                                        }
                                    }
                                }
                            }
                            PvMode::Fp4 => {
                                let vt = vt.as_ref().unwrap();
                                let pts = nvfp4::tensor_scale_for(1.0);
                                // Per lane: P scale register per row and one code byte per
                                // (row, n-tile), as the kernel quantizes them.
                                let mut pscale = [[0u32; 2]; 32];
                                let mut pbytes = [[[0u32; 8]; 2]; 32];
                                for lane in 0..32 {
                                    let quad = lane & !3;
                                    for r in 0..2 {
                                        for qb in 0..4 {
                                            let am = (0..4)
                                                .flat_map(|ql| [2 * qb, 2 * qb + 1].map(|j| (quad + ql, j)))
                                                .fold(0.0f32, |a, (ln, j)| a.max(sc[j][ln][2 * r]).max(sc[j][ln][2 * r + 1]));
                                            let code = nvfp4::block_scale_code(am, pts);
                                            pscale[lane][r] |= (code as u32) << (8 * qb);
                                            for j in [2 * qb, 2 * qb + 1] {
                                                let c0 = nvfp4::encode_element(sc[j][lane][2 * r], code, pts) as u32;
                                                let c1 = nvfp4::encode_element(sc[j][lane][2 * r + 1], code, pts) as u32;
                                                pbytes[lane][r][j] = c0 | (c1 << 4);
                                            }
                                        }
                                    }
                                }
                                // The quad byte transpose, round by round as the shuffles run.
                                let mut pa = [[0u32; 4]; 32];
                                for (lane, pa_l) in pa.iter_mut().enumerate() {
                                    let tq = lane % 4;
                                    for (i, word) in pa_l.iter_mut().enumerate() {
                                        let (r, half) = (i & 1, i >> 1);
                                        for kr_ in 0..4 {
                                            let src = (tq + kr_) % 4;
                                            let sender = (lane & !3) | src;
                                            let want = (src + 4 - kr_) % 4; // the sender's (t - k) & 3
                                            *word |= pbytes[sender][r][4 * half + want] << (8 * src);
                                        }
                                    }
                                }
                                let sa: [u32; 32] = std::array::from_fn(|lane| pscale[lane][lane % 4 & 1]);
                                let vt_row0 = (b * p.kv_heads + kvh) * d;
                                let f = pts * vt.tensor_scale;
                                for (n, a_n) in acc.iter_mut().enumerate() {
                                    let mut bb = [[0u32; 2]; 32];
                                    let mut sb = [0u32; 32];
                                    for lane in 0..32 {
                                        for (i, reg) in bb[lane].iter_mut().enumerate() {
                                            let (col, kk) = lanes::b_reg(lane, i);
                                            let ch = vt_row0 + 8 * n + col;
                                            *reg = le32(&vt.packed, ch * kv_pad / 2 + (key0 + kk) / 2);
                                        }
                                        let ch = vt_row0 + 8 * n + lane / 4;
                                        sb[lane] = le32(&vt.block_scales, ch * kv_pad / 16 + key0 / 16);
                                    }
                                    let mut tile = [[0f32; 4]; 32];
                                    warp_mma(&pa, &bb, &sa, &sb, &mut tile);
                                    for lane in 0..32 {
                                        for e in 0..4 {
                                            a_n[lane][e] += tile[lane][e] * f;
                                        }
                                    }
                                }
                            }
                        }
                    }
                    // Epilogue.
                    for lane in 0..32 {
                        for r in 0..2 {
                            let row = row_of(lane, r);
                            if row >= p.q_len {
                                continue;
                            }
                            let quad = lane & !3;
                            let lr = (l[quad][r] + l[quad + 1][r]) + (l[quad + 2][r] + l[quad + 3][r]);
                            let empty = lr == 0.0 || lr.is_nan();
                            let inv = if empty { 0.0 } else { 1.0 / lr };
                            for (n, a_n) in acc.iter().enumerate() {
                                for e in 0..2 {
                                    let ch = 8 * n + 2 * (lane % 4) + e;
                                    o[os_.offset(b, h, row) + ch] = round_out(a_n[lane][2 * r + e] * inv);
                                }
                            }
                            if lane % 4 == 0 {
                                lse[q_row_base + row] =
                                    if empty { f32::NEG_INFINITY } else { m[lane][r] * p.softmax_scale() + lr.ln() };
                            }
                        }
                    }
                }
            }
        }
    }
    KernelOut { o, lse }
}

/// One ulp of the 16-bit output type at magnitude `x`.
fn ulp(x: f32, bf16: bool) -> f32 {
    let man = if bf16 { 7 } else { 10 };
    let e = if x == 0.0 { -24 } else { x.abs().log2().floor() as i32 };
    2f32.powi(e.max(-14) - man)
}

fn problems(hd: usize) -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(1, 4, 100, hd).kv_heads(2).kv_len(150),
        AttentionProblem::new(1, 2, 90, hd).kv_len(70).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 130, hd).kv_heads(1).kv_len(129).causal(true),
    ]
}

fn check(cfg: Nvfp4Config, precision: Option<Precision>, p: &AttentionProblem, seed: u64) {
    let what = format!("{} {p:?}", cfg.name());
    let (q, k, v) = quattn::inputs::qkv(p, seed);
    let bf16 = matches!(cfg.pv, PvMode::Half { bf16: true });
    let round = |x: &[f32]| if bf16 { round_bf16_vec(x) } else { round_f16_vec(x) };
    let (qr, kr, vr) = (round(&q), round(&k), round(&v));
    let out = kernel(&cfg, p, &qr, &kr, &vr);
    assert!(out.o.iter().all(|x| x.is_finite()), "{what}: non-finite O");
    let reference = attention_f64(p, &q, &k, &v).unwrap();
    let tol = Tolerance::for_precision(precision.unwrap_or(Precision::NVFP4_DEFAULT));
    let ref_max = reference.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let m = ErrorMetrics::compare(&out.o, &reference.o);
    assert!(tol.accepts(&m, ref_max), "{what}: {m:?} outside {tol:?}");
    assert!(m.rel_l2 > 1e-3, "{what}: suspiciously exact {m:?} (no 4-bit error?)");
    // LSE against the f64 reference of the dequantized NVFP4 Q and K (the quantization error
    // removed, so only the kernel's index math and f32 rounding remain): within 1e-4.
    let d = p.head_dim;
    let deq = |x: &[f32]| Nvfp4Tensor::quantize(x, x.len() / d, d).unwrap().dequantize();
    let qref = attention_f64(p, &deq(&qr), &deq(&kr), &vr).unwrap();
    for (x, r) in out.lse.iter().zip(&qref.lse) {
        assert_eq!(x.is_finite(), r.is_finite(), "{what}: -inf rows differ");
        if r.is_finite() {
            assert!((*x as f64 - r).abs() / (1.0 + r.abs()) < 1e-4, "{what}: LSE {x} vs dequantized-input reference {r}");
        }
    }
    // And against the true f64 reference, for the modes the emulation has, the bound
    // src/emulation/tests.rs holds every NVFP4 mode to (|ΔLSE| / (1 + |LSE|) < 0.3).
    if precision.is_some() {
        for (x, r) in out.lse.iter().zip(&reference.lse) {
            if r.is_finite() {
                assert!((*x as f64 - r).abs() / (1.0 + r.abs()) < 0.3, "{what}: LSE {x} vs {r}");
            }
        }
    }
    if let Some(precision) = precision {
        let blocking = Blocking { block_q: BLOCK_Q as usize, block_k: BLOCK_K as usize, warps: WARPS, ..Blocking::default() };
        let e = emulate(p, precision, &blocking, &q, &k, &v).unwrap();
        // Same logits and softmax; the kernel multiplies by 1/l (the emulation divides, ≤ 1 f32
        // ulp), sums l per lane then over the quad (f32 ulps), and rounds O to 16 bits: within
        // one output ulp, plus one more where the two f32 values straddle a rounding midpoint.
        let mut worst = 0.0f32;
        for (i, (&a, &x)) in out.o.iter().zip(&e.o).enumerate() {
            let xr = if bf16 { round_bf16(x) } else { round_f16(x) };
            let tolerance = ulp(a.abs().max(xr.abs()), bf16);
            worst = worst.max((a - xr).abs() / tolerance);
            assert!((a - xr).abs() <= tolerance, "{what}: O[{i}] lane model {a} vs emulation {x}");
        }
        for (x, y) in out.lse.iter().zip(&e.lse) {
            assert!(x == y || (x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}: LSE {x} vs emulation {y}");
        }
        println!("{what}: {m:?}, worst O difference to the emulation {worst:.2} ulp");
    }
}

#[test]
fn bf16_pv_kernel_matches_the_nvfp4_emulation_and_the_reference() {
    for hd in [64, 128] {
        let cfg = Nvfp4Config::new(hd, PvMode::Half { bf16: true }, false, 0).unwrap();
        for (i, p) in problems(hd).iter().enumerate() {
            check(cfg, Some(Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: false }), p, 40 + i as u64);
        }
    }
}

#[test]
fn fp4_pv_kernel_matches_the_nvfp4_v_emulation_and_the_reference() {
    for hd in [64, 128] {
        let cfg = Nvfp4Config::new(hd, PvMode::Fp4, false, 0).unwrap();
        for (i, p) in problems(hd).iter().enumerate() {
            check(cfg, Some(Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false }), p, 50 + i as u64);
        }
    }
}

#[test]
fn f16_pv_kernel_is_within_the_nvfp4_tolerance_of_the_reference() {
    let cfg = Nvfp4Config::new(128, PvMode::Half { bf16: false }, false, 0).unwrap();
    for (i, p) in problems(128).iter().enumerate() {
        check(cfg, None, p, 60 + i as u64);
    }
}

#[test]
fn a_wrong_lane_mapping_is_caught() {
    // The same model with the B operand's two registers swapped (k 0..31 <-> 32..63) must
    // miss the reference by far: the comparison above can fail.
    let p = AttentionProblem::new(1, 1, 64, 64).kv_len(64);
    let (q, k, _) = quattn::inputs::qkv(&p, 7);
    let qt = Nvfp4Tensor::quantize(&round_bf16_vec(&q), 64, 64).unwrap();
    let kt = Nvfp4Tensor::quantize(&round_bf16_vec(&k), 64, 64).unwrap();
    let logits = |swap: bool| -> Vec<f32> {
        let mut out = vec![0f32; 16 * 8];
        let mut a = [[0u32; 4]; 32];
        let mut b = [[0u32; 2]; 32];
        let mut sa = [0u32; 32];
        let mut sb = [0u32; 32];
        for lane in 0..32 {
            for (i, reg) in a[lane].iter_mut().enumerate() {
                *reg = le32(&qt.packed, lanes::a_code_offset(lane, i, 0, 64, 0));
            }
            for i in 0..2 {
                let (n, kk) = lanes::b_reg(lane, if swap { 1 - i } else { i });
                b[lane][i] = le32(&kt.packed, n * 32 + kk / 2);
            }
            sa[lane] = lanes::a_scale_row(lane).map_or(0, |r| le32(&qt.block_scales, lanes::scale_offset(r, 0, 64)));
            sb[lane] = le32(&kt.block_scales, lanes::scale_offset(lane / 4, 0, 64));
        }
        let mut c = [[0f32; 4]; 32];
        warp_mma(&a, &b, &sa, &sb, &mut c);
        for lane in 0..32 {
            for i in 0..4 {
                let (r, n) = lanes::c_elem(lane, i);
                out[r * 8 + n] = c[lane][i];
            }
        }
        out
    };
    let exact: Vec<f64> = (0..16 * 8)
        .map(|x| {
            let (r, n) = (x / 8, x % 8);
            (0..64).map(|c| qt.value(r, c) as f64 * kt.value(n, c) as f64).sum::<f64>() / (qt.tensor_scale as f64 * kt.tensor_scale as f64)
        })
        .collect();
    let good = ErrorMetrics::compare(&logits(false), &exact);
    let bad = ErrorMetrics::compare(&logits(true), &exact);
    assert!(good.rel_l2 < 1e-6, "{good:?}");
    assert!(bad.rel_l2 > 0.5, "{bad:?}");
}
