//! On a GPU: the FP8 mma.sync family (`fwd_mma_fp8_*`, P in f16 and P in e4m3) on e4m3 codes
//! quantized here from N(0, 1) inputs with 0.1% ±8σ outliers, against
//! 1. an f64 reference on the dequantized inputs (what the codes and descales represent):
//!    relative L2, max |dO|, cosine of O; max |dLSE|. Printed, not a pass criterion: the
//!    difference is P's rounding (f16 or e4m3) plus f32 accumulation, the mode's own error.
//! 2. an emulation that rounds exactly where the kernel rounds (the header of
//!    `cuda/fwd_mma_fp8.cu`): the score scale `c` in f32, the running max in the kernel's tile
//!    order (last tile first), `off = fl(fl(m·c) − PL)`, `x = fl(s·c − off)`, P = f16(2^x) or
//!    e4m3(2^x) against that max, l the unrounded sum, O = acc / l · v_descale, LSE. Pass
//!    criterion, element by element: |O_kernel − O_emu| ≤ bound, where
//!    `bound = ulp_out(O_emu) + (ε · Σ_j P̃_j |v_j| + Σ_{j ambiguous} ΔP_j |v_j|) · v_descale / l`:
//!    * ulp_out: one unit in the last place of the f16/bf16 output (the kernel rounds its f32 O
//!      once; the emulation's O is exact).
//!    * ε = (kv_len / 8 + 64) · 2^-23 + 4 τ_max: f32 accumulation of P·V and l over at most
//!      kv_len / 16 MMA k-steps plus rescales, each rounding at 2^-24 relative (2x margin), and
//!      P's relative error τ entering both acc and l.
//!    * τ_j = 2^-20 + 2^-22 (|s_j c| + |off|) + 2^-19 c (Σ_d |q_d k_jd| + the row's largest
//!      such sum): the kernel's 2^x differs from the emulation's exact 2^x through ex2.approx
//!      (2^-22 relative), the f32 roundings of x's terms, and the f32 (tensor-core) accumulation
//!      order of the dot s_j and of the row max. A P element is ambiguous when rounding
//!      2^x·(1 − τ_j) and 2^x·(1 + τ_j) to P's format differs: the kernel may then have rounded
//!      it to either neighbour, and ΔP_j is their distance. Every other P element the kernel
//!      must round to the same value as the emulation.
//!
//!    LSE: |dLSE| ≤ 2^-18 (1 + |m c| + |log2 l|) + ε (natural-log units).
//!
//!    What the bound resolves: its accumulation and ambiguity terms are ~1e-5 of |V|, far below
//!    P's own rounding (f16: ~5e-4 relative, e4m3: ~3e-2), so the bound is in practice one
//!    output ulp. A systematic deviation (a misplaced rounding, the wrong key order or running
//!    max, a wrong scale, descale or mask) moves O by far more than that in many elements. A
//!    single misrounded P element shifts O by ΔP_j |v_j| / l, which exceeds one output ulp only
//!    when its weight p_j / l is large (a dominant key, as in the late-max case).
//!    Also checked: the V prepass output, byte for byte against the host permutation. The same
//!    comparison runs without a GPU against a CPU f32 model of the kernel (`--model`), which
//!    validates the bound itself.
//!
//! Cases: GQA, causal (bottom-right, including rows that see no key), ragged lengths, bshd
//! strides, per-tensor and per-head descales, head dims 64 and 128, bf16 O, and a case whose
//! row max grows in the last tile the kernel processes (keys 0..BLOCK_N).
//! Then timings (median of 10 launches, driver events) at seq 4096, head dim 128, batch 4,
//! 16 heads, prepass and forward separately. Exit status 1 on any failure.
//!
//! ```text
//! cargo run --release -p quattn-native --features cuda --example mma_fp8_check [-- --check-only|--bench-only|--model]
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use quattn_native::mma_fp8::vt_key_at;
use quattn_native::{
    AttentionShape, DescaleGranularity, Fp8Args, Fp8Buffers, Fp8MmaConfig, Fp8MmaKernel, Fp8P, Fp8VtConfig, Dtype, Layout, KernelCache,
    Strides,
};

type BoxErr = Box<dyn std::error::Error>;

// ---- e4m3, bit-exact with the facade's src/codec/fp8.rs (RNE, subnormals, saturating) -----------

/// `2^e` for `e` in [-149, 127], exact.
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

/// Magnitude code of the E4M3 grid point nearest to `a` (finite, >= 0), ties to even, the
/// exponent range open above (the caller saturates).
fn e4m3_magnitude(a: f32) -> u32 {
    const MAN: i32 = 3;
    const BIAS: i32 = 7;
    if a == 0.0 {
        return 0;
    }
    let emin = 1 - BIAS;
    let exp_field = (a.to_bits() >> 23) as i32;
    let e = if exp_field == 0 { emin - 1 } else { exp_field - 127 };
    let e_eff = e.max(emin);
    let n = (a * pow2(MAN - e_eff)).round_ties_even() as u32;
    (((e_eff + BIAS - 1) as u32) << MAN) + n
}

/// Saturating E4M3 encode: past ±448 (and ±inf) -> ±448, NaN -> S.1111.111.
fn e4m3_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs();
    let code = if a.is_infinite() { u32::MAX } else { e4m3_magnitude(a) };
    if code > 0x7E {
        return sign | 0x7E;
    }
    sign | code as u8
}

fn e4m3_decode(code: u8) -> f32 {
    let mag = code & 0x7F;
    if mag == 0x7F {
        return f32::NAN;
    }
    let (e, m) = ((mag >> 3) as i32, (mag & 7) as f32);
    let v = if e == 0 { m * pow2(-9) } else { (8.0 + m) * pow2(e - 10) };
    if code & 0x80 != 0 {
        -v
    } else {
        v
    }
}

// ---- inputs ---------------------------------------------------------------------------------

/// Deterministic LCG, no RNG dependency.
struct Lcg(u64);
impl Lcg {
    fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407))
    }
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// N(0, 1) (Box-Muller), with probability 0.001 replaced by ±8.
    fn sample(&mut self) -> f32 {
        if self.uniform() < 0.001 {
            return if self.uniform() < 0.5 { -8.0 } else { 8.0 };
        }
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// One e4m3 tensor `[batch, heads, seq, dim]` in a strided device layout, with its descales.
struct Codes {
    heads: usize,
    strides: Strides,
    codes: Vec<u8>,
    /// Per tensor: `[1]`; per head: `[batch, heads]`.
    desc: Vec<f32>,
    per_head: bool,
}

impl Codes {
    fn at(&self, b: usize, h: usize, s: usize) -> usize {
        b * self.strides.batch as usize + h * self.strides.head as usize + s * self.strides.seq as usize
    }
    fn desc(&self, b: usize, h: usize) -> f32 {
        if self.per_head {
            self.desc[b * self.heads + h]
        } else {
            self.desc[0]
        }
    }
    /// Decoded code (without the descale).
    fn raw(&self, b: usize, h: usize, s: usize, d: usize) -> f32 {
        e4m3_decode(self.codes[self.at(b, h, s) + d])
    }

    /// Quantizes `x(b, h, s, d)` with the facade's recipe: descale = amax / 448 over the
    /// group (1 when amax is 0), code = e4m3(x / descale) (f32 division, RNE, saturating).
    fn quantize(batch: usize, heads: usize, seq: usize, dim: usize, bshd: bool, per_head: bool, x: impl Fn(usize, usize, usize, usize) -> f32) -> Codes {
        let strides = if bshd { Strides::new(Layout::Bshd, heads, seq, dim) } else { Strides::new(Layout::Bhsd, heads, seq, dim) };
        let groups = if per_head { batch * heads } else { 1 };
        let group = |b: usize, h: usize| if per_head { b * heads + h } else { 0 };
        let mut amax = vec![0f32; groups];
        for b in 0..batch {
            for h in 0..heads {
                for s in 0..seq {
                    for d in 0..dim {
                        let a = &mut amax[group(b, h)];
                        *a = a.max(x(b, h, s, d).abs());
                    }
                }
            }
        }
        let desc: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / 448.0 } else { 1.0 }).collect();
        let mut c = Codes { heads, strides, codes: vec![0u8; batch * heads * seq * dim], desc, per_head };
        for b in 0..batch {
            for h in 0..heads {
                let ds = c.desc[group(b, h)];
                for s in 0..seq {
                    let o = c.at(b, h, s);
                    for d in 0..dim {
                        c.codes[o + d] = e4m3_encode(x(b, h, s, d) / ds);
                    }
                }
            }
        }
        c
    }
}

struct Case {
    name: &'static str,
    head_dim: usize,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
    per_head: bool,
    /// Q[.., 0..8] = 3 and K[key 5, 0..8] = 8: every row's max grows in tile 0, the last one
    /// the kernel processes.
    late_max: bool,
    out: Dtype,
}

fn cases() -> Vec<Case> {
    let c = |name, head_dim, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, per_head| Case {
        name, head_dim, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, per_head, late_max: false, out: Dtype::F16,
    };
    vec![
        c("plain", 128, 1, 2, 2, 256, 256, false, false, false),
        c("gqa-ragged-bshd", 128, 2, 4, 2, 200, 333, false, true, true),
        c("causal-gqa", 64, 1, 4, 1, 300, 333, true, false, false),
        c("causal-q>kv", 128, 1, 2, 2, 333, 130, true, true, true),
        c("decode-row", 64, 1, 1, 1, 1, 77, true, false, false),
        Case { late_max: true, ..c("late-max", 128, 1, 2, 1, 192, 700, false, false, true) },
        Case { out: Dtype::Bf16, ..c("bf16-out", 64, 2, 4, 2, 200, 333, true, true, true) },
    ]
}

/// Emulation-side rounding of P to the kernel's P format.
fn round_p(p: Fp8P, x: f64) -> f64 {
    match p {
        Fp8P::F16 => f16::from_f64(x).to_f64(),
        Fp8P::E4m3 => e4m3_decode(e4m3_encode(x as f32)) as f64,
    }
}

fn ulp_out(out: Dtype, x: f64) -> f64 {
    let a = x.abs().max(6.1e-5);
    let e = a.log2().floor();
    let man = match out {
        Dtype::F16 | Dtype::F32 => 10.0,
        Dtype::Bf16 => 7.0,
    };
    2f64.powf(e - man)
}

#[derive(Default)]
struct Stats {
    // Kernel vs the f64 reference on dequantized inputs.
    ref_diff2: f64,
    ref_norm2: f64,
    ref_dot: f64,
    out_norm2: f64,
    ref_max_abs: f64,
    ref_max_lse: f64,
    // Emulation vs the same reference (the mode's own error, for comparison).
    emu_diff2: f64,
    // Kernel vs emulation.
    emu_max_abs: f64,
    worst_ratio: f64,
    violations: usize,
    lse_violations: usize,
    ambiguous: usize,
    p_elems: usize,
    non_finite: usize,
    // Violations past 4x the bound (diagnosis), and the first violation.
    violations4: usize,
    first: String,
}

/// The quantized inputs of one case and the launch arguments.
struct Inputs {
    q: Codes,
    k: Codes,
    v: Codes,
    args: Fp8Args,
}

fn inputs(c: &Case) -> Inputs {
    let d = c.head_dim;
    let mut rq = Lcg::new(11 + c.q_len as u64);
    let mut rk = Lcg::new(23 + c.kv_len as u64);
    let mut rv = Lcg::new(37 + c.head_dim as u64);
    let gen = |r: &mut Lcg, n: usize| (0..n).map(|_| r.sample()).collect::<Vec<f32>>();
    let xq = gen(&mut rq, c.batch * c.q_heads * c.q_len * d);
    let xk = gen(&mut rk, c.batch * c.kv_heads * c.kv_len * d);
    let xv = gen(&mut rv, c.batch * c.kv_heads * c.kv_len * d);
    let lin = |heads: usize, seq: usize| move |b: usize, h: usize, s: usize, x: usize| ((b * heads + h) * seq + s) * d + x;
    let (lq, lk) = (lin(c.q_heads, c.q_len), lin(c.kv_heads, c.kv_len));
    let late = c.late_max;
    let q = Codes::quantize(c.batch, c.q_heads, c.q_len, d, c.bshd, c.per_head, |b, h, s, x| {
        if late && x < 8 { 3.0 } else { xq[lq(b, h, s, x)] }
    });
    let k = Codes::quantize(c.batch, c.kv_heads, c.kv_len, d, c.bshd, c.per_head, |b, h, s, x| {
        if late && s == 5 && x < 8 { 8.0 } else { xk[lk(b, h, s, x)] }
    });
    let v = Codes::quantize(c.batch, c.kv_heads, c.kv_len, d, c.bshd, c.per_head, |b, h, s, x| xv[lk(b, h, s, x)]);
    let o_strides = if c.bshd { Strides::new(Layout::Bshd, c.q_heads, c.q_len, d) } else { Strides::new(Layout::Bhsd, c.q_heads, c.q_len, d) };
    let shape = AttentionShape {
        batch: c.batch,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        q_len: c.q_len,
        kv_len: c.kv_len,
        head_dim: d,
        v_head_dim: d,
        q: q.strides,
        k: k.strides,
        v: v.strides,
        o: o_strides,
        scale: 1.0 / (d as f32).sqrt(),
        causal: c.causal,
        write_lse: true,
    };
    let args = Fp8Args::new(shape, if c.per_head { DescaleGranularity::PerHead } else { DescaleGranularity::PerTensor });
    Inputs { q, k, v, args }
}

/// What a kernel (or the CPU model) returned: O bits, LSE, Vt.
struct Outputs {
    o_bits: Vec<u16>,
    lse: Vec<f32>,
    vt: Vec<u8>,
}

fn run_gpu(stream: &Arc<CudaStream>, kernel: &Fp8MmaKernel, c: &Case, inp: &Inputs) -> Result<Outputs, BoxErr> {
    let Inputs { q, k, v, args } = inp;
    let lens = kernel.config().required_lens(args);
    let qd = stream.clone_htod(&q.codes)?;
    let kd = stream.clone_htod(&k.codes)?;
    let vd = stream.clone_htod(&v.codes)?;
    let qs = stream.clone_htod(&q.desc)?;
    let ks = stream.clone_htod(&k.desc)?;
    let vs = stream.clone_htod(&v.desc)?;
    // Outputs start as NaN (and Vt as 0xFF, an e4m3 NaN): anything the kernels leave unwritten fails.
    let nan_bits = match c.out {
        Dtype::F16 | Dtype::F32 => 0x7E00u16,
        Dtype::Bf16 => 0x7FC0u16,
    };
    let mut vtd = stream.clone_htod(&vec![0xFFu8; lens.vt])?;
    let mut od = stream.clone_htod(&vec![nan_bits; lens.o])?;
    let mut ld = stream.clone_htod(&vec![f32::NAN; lens.lse])?;
    kernel.launch(
        stream,
        args,
        Fp8Buffers::<u16, _, _, _, _, _, _, _>::new(&qd, &kd, &vd, &mut vtd, &mut od, &mut ld, &qs, &ks, &vs),
    )?;
    Ok(Outputs { o_bits: stream.clone_dtoh(&od)?, lse: stream.clone_dtoh(&ld)?, vt: stream.clone_dtoh(&vtd)? })
}

/// The host permutation of the V prepass.
fn host_vt(c: &Case, inp: &Inputs) -> Vec<u8> {
    let (d, vt_len) = (c.head_dim, quattn_native::mma_fp8::vt_len(&inp.args.shape));
    let mut vt = vec![0u8; c.batch * c.kv_heads * d * vt_len];
    for b in 0..c.batch {
        for h in 0..c.kv_heads {
            for x in 0..d {
                for pos in 0..vt_len {
                    let key = vt_key_at(pos);
                    if key < c.kv_len {
                        vt[((b * c.kv_heads + h) * d + x) * vt_len + pos] = inp.v.codes[inp.v.at(b, h, key) + x];
                    }
                }
            }
        }
    }
    vt
}

/// A CPU model of the kernel in f32, to validate the comparison's bound without a GPU (`--model`):
/// dots summed in f32 per 32-dim k-step, the running max per tile (last tile first), exp2 with a
/// relative perturbation of up to 2^-22 (ex2.approx's error), P rounded from f32, P·V summed in
/// f32 per 16-key step, l in f32, O = acc · (v_descale / l) rounded to the output type.
fn run_model(c: &Case, inp: &Inputs, p_fmt: Fp8P, block_n: usize) -> Outputs {
    let Inputs { q, k, v, args } = inp;
    let d = c.head_dim;
    let o_strides = args.shape.o;
    let mut o_bits = vec![0u16; c.batch * c.q_heads * c.q_len * d];
    let mut lse = vec![0f32; c.batch * c.q_heads * c.q_len];
    let scale_log2 = args.shape.scale * std::f32::consts::LOG2_E;
    #[allow(clippy::excessive_precision)]
    let pl: f32 = if p_fmt == Fp8P::E4m3 { 8.807354922057604 } else { 0.0 };
    let group = c.q_heads / c.kv_heads;
    let mut rng = Lcg::new(5);
    for b in 0..c.batch {
        for h in 0..c.q_heads {
            let kh = h / group;
            let cs = scale_log2 * (q.desc(b, h) * k.desc(b, kh));
            for i in 0..c.q_len {
                let visible =
                    if c.causal { (i as i64 + c.kv_len as i64 - c.q_len as i64 + 1).clamp(0, c.kv_len as i64) as usize } else { c.kv_len };
                let s: Vec<f32> = (0..visible)
                    .map(|j| {
                        let mut acc = 0f32;
                        for k0 in (0..d).step_by(32) {
                            let part: f32 = (k0..k0 + 32).map(|x| q.raw(b, h, i, x) * k.raw(b, kh, j, x)).sum();
                            acc += part;
                        }
                        acc
                    })
                    .collect();
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let mut acc = vec![0f32; d];
                for t in (0..visible.div_ceil(block_n)).rev() {
                    let (k0, k1) = (t * block_n, ((t + 1) * block_n).min(visible));
                    let mn = s[k0..k1].iter().fold(m, |a, &x| a.max(x));
                    if mn > m {
                        let alpha = ((m - mn) * cs).exp2();
                        l *= alpha;
                        acc.iter_mut().for_each(|a| *a *= alpha);
                        m = mn;
                    }
                    let off = m * cs - pl;
                    let mut pr = Vec::new();
                    for &sj in &s[k0..k1] {
                        let p = sj.mul_add(cs, -off).exp2() * (1.0 + ((rng.uniform() * 2.0 - 1.0) * 2f64.powi(-22)) as f32);
                        l += p;
                        pr.push(match p_fmt {
                            Fp8P::F16 => f16::from_f32(p).to_f32(),
                            Fp8P::E4m3 => e4m3_decode(e4m3_encode(p)),
                        });
                    }
                    for (step, ps) in pr.chunks(16).enumerate() {
                        for (x, a) in acc.iter_mut().enumerate() {
                            let part: f32 = ps.iter().enumerate().map(|(jj, &pj)| pj * v.raw(b, kh, k0 + 16 * step + jj, x)).sum();
                            *a += part;
                        }
                    }
                }
                let inv = if l > 0.0 { v.desc(b, kh) / l } else { 0.0 };
                let oo = i * o_strides.seq as usize + h * o_strides.head as usize + b * o_strides.batch as usize;
                for x in 0..d {
                    let y = acc[x] * inv;
                    o_bits[oo + x] = match c.out {
                        Dtype::F16 | Dtype::F32 => f16::from_f32(y).to_bits(),
                        Dtype::Bf16 => bf16::from_f32(y).to_bits(),
                    };
                }
                lse[(b * c.q_heads + h) * c.q_len + i] =
                    if l > 0.0 { (m * cs + l.log2() - pl) * std::f32::consts::LN_2 } else { f32::NEG_INFINITY };
            }
        }
    }
    Outputs { o_bits, lse, vt: host_vt(c, inp) }
}

/// Compares one variant's outputs with the reference and the emulation; returns whether they pass.
fn compare(label: &str, c: &Case, inp: &Inputs, p_fmt: Fp8P, block_n: usize, out: &Outputs) -> bool {
    let Inputs { q, k, v, args } = inp;
    let args = *args;
    let d = c.head_dim;
    let o_strides = args.shape.o;
    let (o_bits, lse, vt) = (&out.o_bits, &out.lse, &out.vt);
    // Decoded codes (without descales), indexed like the codes.
    let kdec: Vec<f64> = k.codes.iter().map(|&x| e4m3_decode(x) as f64).collect();
    let vdec: Vec<f64> = v.codes.iter().map(|&x| e4m3_decode(x) as f64).collect();
    let out_val = |bits: u16| match c.out {
        Dtype::F16 | Dtype::F32 => f16::from_bits(bits).to_f64(),
        Dtype::Bf16 => bf16::from_bits(bits).to_f64(),
    };

    // The prepass, byte for byte.
    let want_vt = host_vt(c, inp);
    let vt_bad = if vt.len() < want_vt.len() { usize::MAX } else { want_vt.iter().zip(vt.iter()).filter(|(a, b)| a != b).count() };

    let mut st = Stats::default();
    let scale_log2 = args.shape.scale * std::f32::consts::LOG2_E;
    // The kernel's P_LOG2_SCALE literal (log2 448), rounded to f32 alike.
    #[allow(clippy::excessive_precision)]
    let pl: f32 = if p_fmt == Fp8P::E4m3 { 8.807354922057604 } else { 0.0 };
    let eps_acc = (c.kv_len as f64 / 8.0 + 64.0) * 2f64.powi(-23);
    let group = c.q_heads / c.kv_heads;
    for b in 0..c.batch {
        for h in 0..c.q_heads {
            let kh = h / group;
            let (qdesc, kdesc, vdesc) = (q.desc(b, h), k.desc(b, kh), v.desc(b, kh));
            // The kernel's score scale: two f32 multiplies.
            let cs = scale_log2 * (qdesc * kdesc);
            for i in 0..c.q_len {
                let visible =
                    if c.causal { (i as i64 + c.kv_len as i64 - c.q_len as i64 + 1).clamp(0, c.kv_len as i64) as usize } else { c.kv_len };
                let qrow: Vec<f64> = (0..d).map(|x| q.raw(b, h, i, x) as f64).collect();
                let dots: Vec<(f64, f64)> = (0..visible)
                    .map(|j| {
                        let krow = &kdec[k.at(b, kh, j)..][..d];
                        let (mut s, mut a) = (0f64, 0f64);
                        for x in 0..d {
                            let t = qrow[x] * krow[x];
                            s += t;
                            a += t.abs();
                        }
                        (s, a)
                    })
                    .collect();
                // The dot error of the row's max moves every P of the row (through m).
                let sabs_max = dots.iter().map(|t| t.1).fold(0f64, f64::max);
                // ---- f64 reference on the dequantized inputs ----
                let logit_scale = args.shape.scale as f64 * qdesc as f64 * kdesc as f64;
                let mref = dots.iter().map(|t| t.0).fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = dots.iter().map(|t| ((t.0 - mref) * logit_scale).exp()).collect();
                let wsum: f64 = w.iter().sum();
                // ---- the emulation: the kernel's tiles, last first ----
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f64);
                let mut acc = vec![0f64; d];
                let mut mag = vec![0f64; d]; // Σ P̃|v|
                let mut amb = vec![0f64; d]; // Σ ΔP|v| over ambiguous P
                let mut tau_max = 0f64;
                let n_tiles = visible.div_ceil(block_n);
                for t in (0..n_tiles).rev() {
                    let (k0, k1) = (t * block_n, ((t + 1) * block_n).min(visible));
                    let tmax = dots[k0..k1].iter().map(|x| x.0 as f32).fold(f32::NEG_INFINITY, f32::max);
                    let mn = m.max(tmax);
                    if mn > m {
                        let alpha = if m == f32::NEG_INFINITY { 0.0 } else { ((m as f64 - mn as f64) * cs as f64).exp2() };
                        l *= alpha;
                        for x in 0..d {
                            acc[x] *= alpha;
                            mag[x] *= alpha;
                            amb[x] *= alpha;
                        }
                        m = mn;
                    }
                    let mc = m * cs;
                    let off = mc - pl;
                    for (j, &(s64, sabs)) in dots.iter().enumerate().take(k1).skip(k0) {
                        let s = s64 as f32;
                        // fma(s, c, -off): exact in f64, one rounding to f32.
                        let xarg = (s as f64 * cs as f64 - off as f64) as f32;
                        let p = (xarg as f64).exp2();
                        l += p;
                        let tau = 2f64.powi(-20)
                            + 2f64.powi(-22) * ((s as f64 * cs as f64).abs() + (off as f64).abs())
                            + 2f64.powi(-19) * cs as f64 * (sabs + sabs_max);
                        tau_max = tau_max.max(tau);
                        let pr = round_p(p_fmt, p);
                        let (lo, hi) = (round_p(p_fmt, p * (1.0 - tau)), round_p(p_fmt, p * (1.0 + tau)));
                        st.p_elems += 1;
                        if lo != hi {
                            st.ambiguous += 1;
                        }
                        let vrow = &vdec[v.at(b, kh, j)..][..d];
                        for x in 0..d {
                            let vv = vrow[x];
                            acc[x] += pr * vv;
                            mag[x] += pr * vv.abs();
                            if lo != hi {
                                amb[x] += (hi - lo) * vv.abs();
                            }
                        }
                    }
                }
                let eps = eps_acc + 4.0 * tau_max;
                let oo = i * o_strides.seq as usize + h * o_strides.head as usize + b * o_strides.batch as usize;
                for x in 0..d {
                    let got = out_val(o_bits[oo + x]);
                    if !got.is_finite() {
                        st.non_finite += 1;
                        continue;
                    }
                    let (emu, bound) = if visible == 0 {
                        (0.0, 0.0)
                    } else {
                        let emu = acc[x] / l * vdesc as f64;
                        (emu, ulp_out(c.out, emu) + (eps * mag[x] + amb[x]) / l * vdesc as f64)
                    };
                    let r = if visible == 0 {
                        0.0
                    } else {
                        (0..visible).map(|j| w[j] * vdec[v.at(b, kh, j) + x]).sum::<f64>() / wsum * vdesc as f64
                    };
                    let diff = (got - emu).abs();
                    st.emu_max_abs = st.emu_max_abs.max(diff);
                    if diff > bound {
                        if st.violations == 0 {
                            st.first = format!(
                                " first: b{b} h{h} row {i} dim {x}: got {got:.6e} emu {emu:.6e} bound {bound:.2e} \
                                 (Σ P|v| {:.3e}, ambiguous {:.3e}, l {l:.4e})",
                                mag[x], amb[x]
                            );
                        }
                        st.violations += 1;
                        if diff > 4.0 * bound {
                            st.violations4 += 1;
                        }
                    }
                    if bound > 0.0 {
                        st.worst_ratio = st.worst_ratio.max(diff / bound);
                    }
                    st.ref_diff2 += (got - r) * (got - r);
                    st.emu_diff2 += (emu - r) * (emu - r);
                    st.ref_norm2 += r * r;
                    st.out_norm2 += got * got;
                    st.ref_dot += got * r;
                    st.ref_max_abs = st.ref_max_abs.max((got - r).abs());
                }
                let got_lse = lse[(b * c.q_heads + h) * c.q_len + i] as f64;
                if visible == 0 {
                    if got_lse != f64::NEG_INFINITY {
                        st.lse_violations += 1;
                    }
                } else {
                    let mc = (m * cs) as f64;
                    let emu_lse = (mc + l.log2() - pl as f64) * std::f64::consts::LN_2;
                    let bound = 2f64.powi(-18) * (1.0 + mc.abs() + l.log2().abs()) + eps;
                    let e = (got_lse - emu_lse).abs();
                    if e.is_nan() || e > bound {
                        st.lse_violations += 1;
                    }
                    let ref_lse = mref * logit_scale + wsum.ln();
                    st.ref_max_lse = st.ref_max_lse.max((got_lse - ref_lse).abs());
                }
            }
        }
    }
    let rel = (st.ref_diff2 / st.ref_norm2.max(1e-300)).sqrt();
    let emu_rel = (st.emu_diff2 / st.ref_norm2.max(1e-300)).sqrt();
    let cos = st.ref_dot / (st.ref_norm2.sqrt() * st.out_norm2.sqrt()).max(1e-300);
    let ok = st.violations == 0 && st.lse_violations == 0 && st.non_finite == 0 && vt_bad == 0;
    println!(
        "{} {:34} {:16} | vs f64 ref: relL2 {rel:.2e} (emu {emu_rel:.2e}) maxabs {:.2e} cos {cos:.7} dLSE {:.1e} | \
         vs emu: max {:.1e} worst/bound {:.2} viol {} (>4x {}) lse-viol {} ambiguous P {}/{} | nonfinite {} vt-bad {}{}",
        if ok { "ok  " } else { "FAIL" },
        label,
        c.name,
        st.ref_max_abs,
        st.ref_max_lse,
        st.emu_max_abs,
        st.worst_ratio,
        st.violations,
        st.violations4,
        st.lse_violations,
        st.ambiguous,
        st.p_elems,
        st.non_finite,
        vt_bad,
        st.first
    );
    ok
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median milliseconds of the prepass and of the forward at seq `seq`, head dim 128, batch 4,
/// 16 heads (batch * seq = 16k for seq 4096).
fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: &Fp8MmaKernel, seq: usize, causal: bool) -> Result<(f64, f64), BoxErr> {
    let d = kernel.config().head_dim as usize;
    let (batch, heads) = (4usize, 16usize);
    let s = Strides::new(Layout::Bhsd, heads, seq, d);
    let shape = AttentionShape {
        batch, q_heads: heads, kv_heads: heads, q_len: seq, kv_len: seq, head_dim: d, v_head_dim: d, q: s, k: s, v: s, o: s,
        scale: 1.0 / (d as f32).sqrt(), causal, write_lse: true,
    };
    let args = Fp8Args::new(shape, DescaleGranularity::PerTensor);
    let lens = kernel.config().required_lens(&args);
    let mut r = Lcg::new(99);
    let codes: Vec<u8> = (0..lens.q).map(|_| e4m3_encode(r.sample() * 56.0)).collect();
    let qd = stream.clone_htod(&codes)?;
    let desc = stream.clone_htod(&[1.0f32 / 56.0])?;
    let mut vtd = stream.alloc_zeros::<u8>(lens.vt)?;
    let mut od = stream.alloc_zeros::<u16>(lens.o)?;
    let mut ld = stream.alloc_zeros::<f32>(lens.lse)?;
    let ev = || ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
    let (e0, e1, e2) = (ev()?, ev()?, ev()?);
    let (mut t_vt, mut t_fwd) = (Vec::new(), Vec::new());
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let (q, _g0) = qd.device_ptr(stream);
    let (vt, _g1) = vtd.device_ptr_mut(stream);
    let (o, _g2) = od.device_ptr_mut(stream);
    let (lse, _g3) = ld.device_ptr_mut(stream);
    let (dp, _g4) = desc.device_ptr(stream);
    // Q, K and V share one code buffer (lens.q = lens.k = lens.v here).
    let ptrs = quattn_native::Fp8Ptrs { q, k: q, v: q, vt, o, lse, q_descale: dp, k_descale: dp, v_descale: dp };
    for it in 0..13 {
        // Prepass, then forward, each between two events.
        e0.record(stream)?;
        // SAFETY: every buffer was allocated with the lengths of `required_lens`.
        unsafe { kernel.launch_vt_raw(stream, &args, &ptrs)? };
        e1.record(stream)?;
        // SAFETY: as above; Vt was written by the prepass just before.
        unsafe { kernel.launch_fwd_raw(stream, &args, &ptrs)? };
        e2.record(stream)?;
        e2.synchronize()?;
        if it >= 3 {
            t_vt.push(e0.elapsed_ms(&e1)? as f64);
            t_fwd.push(e1.elapsed_ms(&e2)? as f64);
        }
    }
    Ok((median(t_vt), median(t_fwd)))
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (check_only, bench_only) = (mode == "--check-only", mode == "--bench-only");
    if mode == "--model" {
        // No GPU: the CPU f32 model of the kernel against the same comparison.
        let mut all_ok = true;
        for c in cases() {
            let inp = inputs(&c);
            for p in [Fp8P::F16, Fp8P::E4m3] {
                let out = run_model(&c, &inp, p, 64);
                all_ok &= compare(&format!("model-{p:?}"), &c, &inp, p, 64, &out);
            }
        }
        println!("{}", if all_ok { "ALL OK" } else { "SOME FAILED" });
        if !all_ok {
            std::process::exit(1);
        }
        return Ok(());
    }
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    println!("device {} cc {:?}", ctx.name()?, ctx.compute_capability()?);
    match quattn_native::nvrtc() {
        Ok(n) => println!("nvrtc {:?} from {:?}", n.version, n.lib_dir),
        Err(e) => println!("nvrtc: {e}"),
    }
    let arch = quattn_native::device::target_arch(&ctx, "fwd_mma_fp8", quattn_native::Arch::Sm89, Fp8MmaConfig::target_for)?;

    // Every variant the checks and timings use, compiled in parallel into the global cache
    // first (NVRTC is single-threaded per program).
    let mut configs = Vec::new();
    for hd in [64, 128] {
        for p in [Fp8P::F16, Fp8P::E4m3] {
            configs.push(Fp8MmaConfig::new(hd, p, Dtype::F16)?);
        }
    }
    configs.push(Fp8MmaConfig::new(64, Fp8P::F16, Dtype::Bf16)?);
    configs.push(Fp8MmaConfig::new(64, Fp8P::E4m3, Dtype::Bf16)?);
    let t0 = std::time::Instant::now();
    let mut reqs: Vec<_> = configs.iter().map(|c| c.request(arch)).collect::<Result<_, _>>()?;
    for hd in [64, 128] {
        reqs.push(Fp8VtConfig::new(hd)?.request(arch)?);
    }
    let cache = KernelCache::global();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = reqs.iter().map(|r| s.spawn(move || cache.get_or_compile(r).err().map(|e| format!("{}: {e}", r.kernel)))).collect();
        hs.into_iter().filter_map(|h| h.join().ok().flatten()).collect()
    });
    for e in &errors {
        println!("COMPILE FAIL {e}");
    }
    println!("compiled {} kernels for {arch} in {:.1} s", reqs.len(), t0.elapsed().as_secs_f64());

    let mut all_ok = errors.is_empty();
    let kernels: Vec<Fp8MmaKernel> = configs.iter().map(|c| Fp8MmaKernel::load(&ctx, *c)).collect::<Result<_, _>>()?;
    for k in &kernels {
        let r = k.compiled().resources;
        println!(
            "{:34} {arch} regs {:3} spill {} tile {:?}",
            k.config().name(),
            r.map(|r| r.registers).unwrap_or(0),
            r.map(|r| r.spill_store_bytes).unwrap_or(0),
            k.config().tile_for(arch)?
        );
    }
    if !bench_only {
        for c in cases() {
            for k in kernels.iter().filter(|k| k.config().head_dim as usize == c.head_dim && k.config().out == c.out) {
                let block_n = k.config().tile_for(arch)?.block_n as usize;
                let inp = inputs(&c);
                let out = run_gpu(&stream, k, &c, &inp)?;
                all_ok &= compare(&k.config().name(), &c, &inp, k.config().p, block_n, &out);
            }
        }
    }
    if !check_only {
        for k in kernels.iter().filter(|k| k.config().head_dim == 128) {
            for causal in [false, true] {
                let seq = 4096;
                let (vt_ms, fwd_ms) = bench(&ctx, &stream, k, seq, causal)?;
                let flops = 4.0 * (4 * 16 * seq * seq * 128) as f64 * if causal { 0.5 } else { 1.0 };
                println!(
                    "time {:34} seq {seq} hd128 b4 h16 {:7}: prepass {vt_ms:.3} ms, forward {fwd_ms:.3} ms = {:.1} TFLOP/s (median of 10, {arch})",
                    k.config().name(),
                    if causal { "causal" } else { "full" },
                    flops / (fwd_ms * 1e-3) / 1e12
                );
            }
        }
    }
    println!("{}", if all_ok { "ALL OK" } else { "SOME FAILED" });
    if !all_ok {
        std::process::exit(1);
    }
    Ok(())
}
