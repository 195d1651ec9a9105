//! Runs the variable-length (`VARLEN`) variants of the wgmma (sm_90a) and HMMA (sm_80+) forward
//! kernels on a CUDA device against an f64 loop written here, sequence by sequence: lengths of 0,
//! 1 and non-multiples of the tiles, q_len != kv_len, GQA, causal (bottom-right per sequence) and
//! not, token-major and head-major packing, with and without an LSE buffer. O and LSE are
//! poisoned with NaN first, and a canary region past `total_q` must keep its poison.
//!
//! Without a CUDA device (or driver) every test prints why and returns.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use quattn_native::{device, Dtype, HmmaConfig, HmmaKernel, Strides, VarlenShape, WgmmaConfig, WgmmaKernel};

/// Rows of O (and entries of the LSE) past the real ones that the kernel must never write.
const CANARY_ROWS: usize = 37;

fn context_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    match device::open_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            println!("skipping {test}: no CUDA device ({e})");
            None
        }
    }
}

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    /// Roughly N(0, 1) (sum of four uniforms), one value in 64 an outlier of up to 12x.
    fn value(&mut self) -> f32 {
        let x = (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866;
        if self.next().is_multiple_of(64) {
            x * 12.0
        } else {
            x
        }
    }
}

/// One varlen problem: per-sequence lengths, heads, head dim, masks, packing.
#[derive(Clone, Debug)]
struct Case {
    lens_q: Vec<usize>,
    lens_k: Vec<usize>,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
    /// Q and O head-major (`[heads, total, d]`) instead of token-major.
    head_major_q: bool,
    with_lse: bool,
}

impl Case {
    fn cu(lens: &[usize]) -> Vec<i32> {
        let mut cu = vec![0i32];
        for l in lens {
            cu.push(cu.last().unwrap() + *l as i32);
        }
        cu
    }
    fn shape(&self) -> VarlenShape {
        let total_q: usize = self.lens_q.iter().sum();
        let total_k: usize = self.lens_k.iter().sum();
        let mut s = VarlenShape::packed(
            self.lens_q.len(),
            total_q,
            total_k,
            *self.lens_q.iter().max().unwrap(),
            *self.lens_k.iter().max().unwrap(),
            self.q_heads,
            self.kv_heads,
            self.head_dim,
            self.causal,
        );
        if self.head_major_q {
            // O keeps canary rows after each head's rows: a head stride past total_q.
            s.q = Strides { batch: 0, head: total_q * self.head_dim, seq: self.head_dim };
            s.o = Strides { batch: 0, head: (total_q + CANARY_ROWS) * self.head_dim, seq: self.head_dim };
        }
        s
    }
}

/// Elements as 16-bit codes and the f32 values they stand for.
fn encode(x: &[f32], dtype: Dtype) -> (Vec<u16>, Vec<f32>) {
    match dtype {
        Dtype::Bf16 => x.iter().map(|v| bf16::from_f32(*v)).map(|h| (h.to_bits(), h.to_f32())).unzip(),
        _ => x.iter().map(|v| f16::from_f32(*v)).map(|h| (h.to_bits(), h.to_f32())).unzip(),
    }
}
fn decode(x: u16, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Bf16 => bf16::from_bits(x).to_f64(),
        _ => f16::from_bits(x).to_f64(),
    }
}
fn nan_bits(dtype: Dtype) -> u16 {
    if dtype == Dtype::Bf16 {
        0x7fc0
    } else {
        0x7e00
    }
}

/// The f64 reference of sequence `b`, head `h`, row `i`: (O row, LSE); no visible key gives
/// (zeros, -inf).
#[allow(clippy::too_many_arguments)]
fn reference_row(c: &Case, s: &VarlenShape, q: &[f32], k: &[f32], v: &[f32], b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
    let d = c.head_dim;
    let (cq, ck) = (Case::cu(&c.lens_q), Case::cu(&c.lens_k));
    let (q0, k0) = (cq[b] as usize, ck[b] as usize);
    let (ql, kl) = (c.lens_q[b] as i64, c.lens_k[b] as i64);
    let kvh = h / (c.q_heads / c.kv_heads);
    let qrow = &q[s.q.offset(0, h, q0 + i)..][..d];
    let last = if c.causal { (i as i64 + kl - ql).min(kl - 1) } else { kl - 1 };
    if last < 0 {
        return (vec![0.0; d], f64::NEG_INFINITY);
    }
    let scores: Vec<f64> = (0..=last as usize)
        .map(|j| {
            let krow = &k[s.k.offset(0, kvh, k0 + j)..][..d];
            qrow.iter().zip(krow).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * s.scale as f64
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    let mut o = vec![0.0; d];
    for (j, pj) in p.iter().enumerate() {
        let vrow = &v[s.v.offset(0, kvh, k0 + j)..][..d];
        for (oe, ve) in o.iter_mut().zip(vrow) {
            *oe += pj * *ve as f64;
        }
    }
    o.iter_mut().for_each(|x| *x /= l);
    (o, m + l.ln())
}

/// A varlen kernel of either family.
enum Kernel {
    Wgmma(Box<WgmmaKernel>),
    Hmma(HmmaKernel),
}

impl Kernel {
    fn name(&self) -> String {
        match self {
            Kernel::Wgmma(k) => k.config().name(),
            Kernel::Hmma(k) => k.config().name(),
        }
    }
}

/// Runs `case` on `kernel` with `dtype` inputs and checks every sequence; returns how many rows
/// were compared.
fn run_case(stream: &Arc<CudaStream>, kernel: &Kernel, dtype: Dtype, case: &Case, seed: u64) -> usize {
    let s = case.shape();
    let need = s.required_lens();
    let mut rng = Rng(seed | 1);
    let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.value()).collect() };
    let (qb, q) = encode(&random(need.q), dtype);
    let (kb, k) = encode(&random(need.k), dtype);
    let (vb, v) = encode(&random(need.v), dtype);
    // CANARY_ROWS rows after the last row of O (after the last head's, head-major).
    let o_len = need.o + CANARY_ROWS * s.o.seq;
    let lse_len = need.lse + CANARY_ROWS;
    let poison = nan_bits(dtype);
    let (cq, ck) = (Case::cu(&case.lens_q), Case::cu(&case.lens_k));
    s.check_cu_seqlens(&cq, &ck).unwrap();

    let qd = stream.clone_htod(&qb).unwrap();
    let kd = stream.clone_htod(&kb).unwrap();
    let vd = stream.clone_htod(&vb).unwrap();
    let mut od = stream.clone_htod(&vec![poison; o_len]).unwrap();
    let mut ld = stream.clone_htod(&vec![f32::NAN; lse_len]).unwrap();
    let cqd = stream.clone_htod(&cq).unwrap();
    let ckd = stream.clone_htod(&ck).unwrap();
    let lse = if case.with_lse { Some(&mut ld) } else { None };
    match kernel {
        Kernel::Wgmma(kn) => kn.launch_varlen::<u16, _, _, _, _, _, _, _>(stream, &s, &qd, &kd, &vd, &mut od, lse, &cqd, &ckd),
        Kernel::Hmma(kn) => kn.launch_varlen::<u16, _, _, _, _, _, _, _>(stream, &s, &qd, &kd, &vd, &mut od, lse, &cqd, &ckd),
    }
    .unwrap();
    stream.synchronize().unwrap();
    let o = stream.clone_dtoh(&od).unwrap();
    let lse = stream.clone_dtoh(&ld).unwrap();
    let what = format!("{} {dtype:?} {case:?}", kernel.name());

    // Every element no row of the problem owns keeps its poison: the canary rows past total_q
    // (and, head-major, past each head's rows), the LSE past q_heads * total_q, the whole LSE
    // without an LSE buffer.
    let mut owned = vec![false; o_len];
    for h in 0..s.q_heads {
        for t in 0..s.total_q {
            let at = s.o.offset(0, h, t);
            owned[at..at + s.head_dim].iter_mut().for_each(|x| *x = true);
        }
    }
    let stray = (0..o_len).filter(|&e| !owned[e] && o[e] != poison).count();
    assert_eq!(stray, 0, "{what}: {stray} O elements outside the problem's rows were written");
    let lse_written = if case.with_lse { need.lse } else { 0 };
    assert!(lse[lse_written..].iter().all(|x| x.is_nan()), "{what}: LSE written past its rows");

    // Sequence by sequence: relative L2 of O, max-abs of the LSE, exact zeros / -inf for rows
    // that see no key.
    let tol = if dtype == Dtype::Bf16 { 1.6e-2 } else { 2e-3 };
    let mut rows = 0;
    for b in 0..s.batch {
        let (mut num, mut den, mut lse_err) = (0.0f64, 0.0f64, 0.0f64);
        for h in 0..s.q_heads {
            for i in 0..case.lens_q[b] {
                let (r, rl) = reference_row(case, &s, &q, &k, &v, b, h, i);
                let at = s.o.offset(0, h, cq[b] as usize + i);
                let got: Vec<f64> = o[at..at + s.head_dim].iter().map(|x| decode(*x, dtype)).collect();
                if rl == f64::NEG_INFINITY {
                    assert!(got.iter().all(|x| *x == 0.0), "{what}: seq {b} head {h} row {i} sees no key, O {got:?}");
                } else {
                    num += got.iter().zip(&r).map(|(g, e)| (g - e) * (g - e)).sum::<f64>();
                    den += r.iter().map(|e| e * e).sum::<f64>();
                }
                if case.with_lse {
                    let gl = lse[h * s.total_q + cq[b] as usize + i] as f64;
                    if rl == f64::NEG_INFINITY {
                        assert_eq!(gl, f64::NEG_INFINITY, "{what}: seq {b} head {h} row {i} LSE");
                    } else {
                        lse_err = lse_err.max((gl - rl).abs());
                    }
                }
                rows += 1;
            }
        }
        if den > 0.0 {
            let rel = (num / den).sqrt();
            assert!(rel < tol, "{what}: sequence {b} rel-L2 {rel:e} >= {tol:e}");
        }
        assert!(lse_err < 1e-3, "{what}: sequence {b} LSE max-abs {lse_err:e}");
    }
    rows
}

fn cases(head_dim: usize) -> Vec<Case> {
    let c = |lens_q: &[usize], lens_k: &[usize], causal, head_major_q, with_lse| Case {
        lens_q: lens_q.to_vec(),
        lens_k: lens_k.to_vec(),
        q_heads: 4,
        kv_heads: 2,
        head_dim,
        causal,
        head_major_q,
        with_lse,
    };
    vec![
        // q_len == kv_len, 0 and 1 and lengths around the 128-row / 64- and 128-key tiles.
        c(&[0, 1, 77, 128, 300, 513, 0], &[0, 1, 77, 128, 300, 513, 0], true, false, true),
        c(&[0, 1, 77, 128, 300, 513, 0], &[0, 1, 77, 128, 300, 513, 0], false, false, true),
        // q_len != kv_len both ways: causal rows before the alignment see nothing, an empty KV
        // sequence gives zeros, one query against many keys (decode-like).
        c(&[1, 17, 0, 200, 129, 64], &[5, 300, 9, 0, 129, 700], true, false, true),
        c(&[1, 17, 0, 200, 129, 64], &[5, 300, 9, 0, 129, 700], false, true, true),
        c(&[300, 3], &[40, 250], true, true, false),
        // One sequence only: the dense problem.
        c(&[260], &[260], true, false, true),
    ]
}

fn check_family(test: &str, load: impl Fn(&Arc<CudaContext>, usize, Dtype) -> Option<Kernel>, dtypes: &[Dtype]) {
    let Some(ctx) = context_or_skip(test) else { return };
    let stream = ctx.default_stream();
    let mut ran = 0;
    for hd in [64, 128] {
        for &dtype in dtypes {
            let Some(kernel) = load(&ctx, hd, dtype) else { continue };
            for (n, case) in cases(hd).iter().enumerate() {
                let rows = run_case(&stream, &kernel, dtype, case, 0x9e37_79b9 + (hd * 100 + n) as u64);
                println!("{} {dtype:?} case {n}: {rows} rows ok", kernel.name());
                ran += 1;
            }
        }
    }
    if ran == 0 {
        println!("skipping {test}: the device runs none of these variants");
    }
}

#[test]
fn wgmma_varlen_matches_the_f64_reference_per_sequence() {
    check_family(
        "wgmma_varlen_matches_the_f64_reference_per_sequence",
        |ctx, hd, _| {
            let cc = device::compute_capability(ctx).unwrap();
            if WgmmaConfig::target_for(cc).is_none() {
                println!("wgmma varlen: sm_{}{} is not sm_90a, nothing to run", cc.0, cc.1);
                return None;
            }
            Some(Kernel::Wgmma(Box::new(WgmmaKernel::load(ctx, WgmmaConfig::varlen(hd).unwrap()).unwrap())))
        },
        &[Dtype::F16],
    );
}

#[test]
fn hmma_varlen_matches_the_f64_reference_per_sequence() {
    check_family(
        "hmma_varlen_matches_the_f64_reference_per_sequence",
        |ctx, hd, dtype| {
            let cc = device::compute_capability(ctx).unwrap();
            if HmmaConfig::target_for(cc).is_none() {
                println!("hmma varlen: sm_{}{} has no HMMA target, nothing to run", cc.0, cc.1);
                return None;
            }
            Some(Kernel::Hmma(HmmaKernel::load(ctx, HmmaConfig::varlen(hd, dtype).unwrap()).unwrap()))
        },
        &[Dtype::F16, Dtype::Bf16],
    );
}

#[test]
fn bad_varlen_launches_are_typed_errors() {
    let Some(ctx) = context_or_skip("bad_varlen_launches_are_typed_errors") else { return };
    let cc = device::compute_capability(&ctx).unwrap();
    if HmmaConfig::target_for(cc).is_none() {
        println!("skipping bad_varlen_launches_are_typed_errors: sm_{}{} has no HMMA target", cc.0, cc.1);
        return;
    }
    let stream = ctx.default_stream();
    let s = VarlenShape::packed(2, 10, 12, 6, 7, 2, 1, 64, true);
    let need = s.required_lens();
    let q = stream.alloc_zeros::<u16>(need.q).unwrap();
    let k = stream.alloc_zeros::<u16>(need.k).unwrap();
    let v = stream.alloc_zeros::<u16>(need.v).unwrap();
    let mut o = stream.alloc_zeros::<u16>(need.o).unwrap();
    let cu3 = stream.clone_htod(&[0i32, 4, 10]).unwrap();
    let cu2 = stream.clone_htod(&[0i32, 12]).unwrap();
    let varlen = HmmaKernel::load(&ctx, HmmaConfig::varlen(64, Dtype::F16).unwrap()).unwrap();
    let err = varlen
        .launch_varlen::<u16, _, _, _, _, cudarc::driver::CudaSlice<f32>, _, _>(&stream, &s, &q, &k, &v, &mut o, None, &cu3, &cu2)
        .unwrap_err();
    assert!(err.to_string().contains("cu_seqlens_k has 2 entries"), "{err}");
    let other = VarlenShape { head_dim: 128, v_head_dim: 128, ..s };
    let err = varlen
        .launch_varlen::<u16, _, _, _, _, cudarc::driver::CudaSlice<f32>, _, _>(&stream, &other, &q, &k, &v, &mut o, None, &cu3, &cu3)
        .unwrap_err();
    assert!(err.to_string().contains("head dim 64"), "{err}");
    // A dense variant refuses a varlen launch.
    let dense = HmmaKernel::load(&ctx, HmmaConfig::new(64, Dtype::F16, quattn_native::QkAccum::F32, quattn_native::PvAccum::F32).unwrap()).unwrap();
    let err = dense
        .launch_varlen::<u16, _, _, _, _, cudarc::driver::CudaSlice<f32>, _, _>(&stream, &s, &q, &k, &v, &mut o, None, &cu3, &cu3)
        .unwrap_err();
    assert!(err.to_string().contains("not a variable-length variant"), "{err}");
}
