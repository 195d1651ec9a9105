//! Tensors above 2^31 elements on CUDA, through the device-tensor API: the native f16/bf16
//! kernels (wgmma on compute capability 9.0, HMMA from sm_80) index with 64-bit offsets, so a
//! long-context problem whose Q, K, V or O spans more than 2^31 - 1 elements runs where the
//! device has the memory. Every other family refuses such a problem at plan time with
//! `Error::TooLarge`, and `Strategy::Auto` picks a 64-bit family.
//!
//! Inputs are written on the device by a small NVRTC kernel (a 64-bit hash of each element's
//! index, so no two regions of a tensor repeat: an offset that wrapped at 32 bits reads other
//! values), O and the LSE are set to NaN before the timed run, and a few rows per case are
//! checked against an f64 computation on the host from the same inputs, copied back (the Q row,
//! the K and V of its KV head, the O row and its LSE). The sampled rows include the last ones,
//! whose offsets lie past 2^31 elements.
//!
//! Cases (each run on the forced wgmma f16, HMMA f16 and HMMA bf16 kernels):
//! * `q-long`: batch 1, 32 query heads (8 KV heads), 600k query rows, 500 keys, head dim 128,
//!   BHSD: Q and O span 2.46e9 elements each; heads 28..31 start past 2^31.
//! * `kv-long`: batch 2, 32 query heads (8 KV heads), 256 query rows, 2.2M keys, head dim 64,
//!   BSHD, causal: K and V span 2.25e9 elements each; batch 1's keys lie past 2^31.
//!
//! Prints one JSON line per (case, kernel) and a verdict line; exits non-zero when a check
//! fails. Without a CUDA device (or with too little memory for a case) it says why and skips.
//!
//!   cargo run --release --example large_tensors

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use half::{bf16, f16};
use quattn::cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use quattn::{AttentionProblem, CudaTensor, CudaTensorMut, Device, Element, Family, Layout, NativeKind, Precision, Session, Strategy};
use rayon::prelude::*;
use serde_json::json;

/// Fill and gather kernels, all index math in 64 bits.
const KERNELS: &str = r#"
typedef unsigned long long u64;
__device__ __forceinline__ u64 mix(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// x[i] = k / 1024 for a hashed k in [-1024, 1024): exact in f16; bf16 keeps its top 8 bits.
// The bits are built from k (no conversion intrinsics). constant != 0: every element is
// `value` (16-bit pattern).
extern "C" __global__ void fill16(unsigned short* x, u64 n, u64 seed, int bf16, int constant, unsigned int value) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (constant) { x[i] = (unsigned short)value; continue; }
        const int k = (int)(mix(i ^ (seed << 40)) & 2047) - 1024;
        const unsigned int sign = k < 0 ? 0x8000u : 0u;
        const unsigned int m = (unsigned int)(k < 0 ? -k : k);
        unsigned short h = 0;
        if (m != 0) {
            int p = 0;   // m = 1.f * 2^p, so k / 1024 = 1.f * 2^(p - 10)
            while ((m >> (p + 1)) != 0) ++p;
            if (bf16) {
                const unsigned int f = p <= 7 ? (m << (7 - p)) : (m >> (p - 7));
                h = (unsigned short)(sign | ((unsigned int)(p + 117) << 7) | (f & 0x7Fu));
            } else {
                h = (unsigned short)(sign | ((unsigned int)(p + 5) << 10) | ((m << (10 - p)) & 0x3FFu));
            }
        }
        x[i] = h;
    }
}
// dst[r * dim + d] = src[base + r * row_stride + d] for r < rows, d < dim.
extern "C" __global__ void gather16(const unsigned short* src, unsigned short* dst, u64 base, u64 row_stride, u64 rows, u64 dim) {
    const u64 n = rows * dim, stride = (u64)gridDim.x * blockDim.x;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        const u64 r = t / dim, d = t - r * dim;
        dst[t] = src[base + r * row_stride + d];
    }
}
"#;

/// One problem above 2^31 elements and the rows checked.
struct Case {
    name: &'static str,
    problem: AttentionProblem,
    /// `(batch, q head, row)`.
    rows: Vec<(usize, usize, usize)>,
}

fn cases() -> Vec<Case> {
    let q_long = AttentionProblem::new(1, 32, 600_000, 128).kv_heads(8).kv_len(500).with_lse(true);
    let kv_long =
        AttentionProblem::new(2, 32, 256, 64).kv_heads(8).kv_len(2_200_013).layout(Layout::Bshd).causal(true).with_lse(true);
    vec![
        Case {
            name: "q-long",
            rows: vec![(0, 0, 0), (0, 17, 300_001), (0, 28, 1), (0, 30, 123_457), (0, 31, 599_872), (0, 31, 599_999)],
            problem: q_long,
        },
        Case { name: "kv-long", rows: vec![(0, 0, 255), (0, 3, 7), (1, 28, 100), (1, 31, 0), (1, 31, 255)], problem: kv_long },
    ]
}

/// The device side of the example: the caller's stream and the helper kernels.
struct Gpu {
    stream: Arc<CudaStream>,
    fill: CudaFunction,
    gather: CudaFunction,
}

impl Gpu {
    fn launch_cfg(n: u64) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, 132 * 32) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    /// Hashed values (`constant` None) or one 16-bit pattern in `n16` 16-bit words of `x`.
    fn fill<T>(&self, x: &mut CudaSlice<T>, n16: u64, seed: u64, bf16: bool, constant: Option<u16>) -> Result<(), Box<dyn std::error::Error>> {
        let (is_bf16, is_const, value) = (bf16 as i32, constant.is_some() as i32, constant.unwrap_or(0) as u32);
        let mut b = self.stream.launch_builder(&self.fill);
        b.arg(x).arg(&n16).arg(&seed).arg(&is_bf16).arg(&is_const).arg(&value);
        // SAFETY: `x` holds at least `n16` 16-bit words (the callers pass its length in them).
        unsafe { b.launch(Self::launch_cfg(n16)) }?;
        Ok(())
    }

    /// `rows` rows of `dim` elements at `base + r * row_stride` of `src`, copied to the host.
    fn gather<T: DeviceRepr + Element + Default>(&self, src: &CudaSlice<T>, base: usize, row_stride: usize, rows: usize, dim: usize) -> Result<Vec<T>, Box<dyn std::error::Error>> {
        assert!(base + (rows - 1) * row_stride + dim <= src.len());
        let n = rows * dim;
        // SAFETY: the kernel writes all n elements before the copy reads them.
        let mut dst = unsafe { self.stream.alloc::<T>(n) }?;
        let (base, row_stride, rows, dim) = (base as u64, row_stride as u64, rows as u64, dim as u64);
        let mut b = self.stream.launch_builder(&self.gather);
        b.arg(src).arg(&mut dst).arg(&base).arg(&row_stride).arg(&rows).arg(&dim);
        // SAFETY: every source index is below src.len() (asserted), every destination below n.
        unsafe { b.launch(Self::launch_cfg(n as u64)) }?;
        Ok(self.stream.clone_dtoh(&dst)?)
    }
}

/// The f64 attention of one row: O and the natural-log LSE (keys the bottom-right causal mask
/// hides are skipped).
fn reference_row(p: &AttentionProblem, i: usize, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, f64) {
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let keys = if p.causal { (i + p.kv_len + 1).saturating_sub(p.q_len).min(p.kv_len) } else { p.kv_len };
    let scale = p.softmax_scale() as f64;
    let s: Vec<f64> = (0..keys).map(|j| scale * q.iter().zip(&k[j * d..][..d]).map(|(a, b)| a * b).sum::<f64>()).collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut o = vec![0.0; dv];
    let mut l = 0.0;
    for (j, &sj) in s.iter().enumerate() {
        let e = (sj - m).exp();
        l += e;
        for (oc, &vc) in o.iter_mut().zip(&v[j * dv..][..dv]) {
            *oc += e * vc;
        }
    }
    if keys == 0 {
        return (o, f64::NEG_INFINITY);
    }
    o.iter_mut().for_each(|x| *x /= l);
    (o, m + l.ln())
}

/// Errors of the sampled rows: max |O - ref|, that over max |ref|, max |LSE - ref|, and
/// whether any sampled value came out NaN (a row the kernel did not write).
struct RowErrors {
    o_max_abs: f64,
    o_rel: f64,
    lse_max_abs: f64,
    nan: bool,
}

/// Runs `plan` on device tensors of `T` holding hashed inputs, times one run, and checks the
/// sampled rows against f64.
fn run_one<T: Element + DeviceRepr + Default>(
    gpu: &Gpu,
    session: &Session,
    case: &Case,
    precision: Precision,
    strategy: Strategy,
    bufs: &mut Buffers<T>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let p = &case.problem;
    let plan = match session.plan(p, precision, strategy) {
        Ok(plan) => plan,
        Err(e) => return Ok(json!({ "case": case.name, "precision": precision.name(), "strategy": format!("{strategy:?}"), "skipped": e.to_string() })),
    };
    let s = &gpu.stream;
    let bf = T::DTYPE == quattn::Dtype::Bf16;
    let nan: u16 = if bf { 0x7FC0 } else { 0x7E00 };
    let run = |b: &mut Buffers<T>| {
        session.run_cuda(
            &plan,
            s,
            CudaTensor::new(&b.q, s),
            CudaTensor::new(&b.k, s),
            CudaTensor::new(&b.v, s),
            CudaTensorMut::new(&mut b.o, s),
            Some(CudaTensorMut::new(&mut b.lse, s)),
        )
    };
    run(bufs)?; // warm-up
    s.synchronize()?;
    let (o_len, lse_len) = (bufs.o.len() as u64, bufs.lse.len() as u64);
    gpu.fill(&mut bufs.o, o_len, 0, bf, Some(nan))?;
    gpu.fill(&mut bufs.lse, 2 * lse_len, 0, bf, Some(0xFFFF))?; // f32 NaN
    s.synchronize()?;
    let t = Instant::now();
    run(bufs)?;
    s.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;

    // Copy back what the sampled rows read, one (batch, KV head) of K and V at a time.
    let (qs, ks, vs, os) = (p.q_strides(), p.k_strides(), p.v_strides(), p.o_strides());
    let widen = |x: Vec<T>| x.into_iter().map(|a| a.to_f32() as f64).collect::<Vec<f64>>();
    let mut kv: HashMap<(usize, usize), (Vec<f64>, Vec<f64>)> = HashMap::new();
    let mut rows = Vec::new();
    for &(b, h, i) in &case.rows {
        let kh = h / p.group_size();
        if let std::collections::hash_map::Entry::Vacant(e) = kv.entry((b, kh)) {
            let k = widen(gpu.gather(&bufs.k, ks.offset(b, kh, 0), ks.seq, p.kv_len, p.head_dim)?);
            let v = widen(gpu.gather(&bufs.v, vs.offset(b, kh, 0), vs.seq, p.kv_len, p.v_head_dim)?);
            e.insert((k, v));
        }
        let q = widen(gpu.gather(&bufs.q, qs.offset(b, h, i), 0, 1, p.head_dim)?);
        let o = widen(gpu.gather(&bufs.o, os.offset(b, h, i), 0, 1, p.v_head_dim)?);
        let lse_at = (b * p.q_heads + h) * p.q_len + i;
        let lse = s.clone_dtoh(&bufs.lse.slice(lse_at..lse_at + 1))?[0] as f64;
        rows.push((b, h, i, kh, q, o, lse));
    }
    let checked: Vec<(Vec<f64>, f64, Vec<f64>, f64)> = rows
        .par_iter()
        .map(|(b, _, i, kh, q, o, lse)| {
            let (k, v) = &kv[&(*b, *kh)];
            let (want_o, want_lse) = reference_row(p, *i, q, k, v);
            (o.clone(), *lse, want_o, want_lse)
        })
        .collect();
    let mut e = RowErrors { o_max_abs: 0.0, o_rel: 0.0, lse_max_abs: 0.0, nan: false };
    let mut ref_max = 0.0f64;
    for (o, lse, want_o, want_lse) in &checked {
        e.nan |= o.iter().any(|x| x.is_nan()) || lse.is_nan();
        for (a, w) in o.iter().zip(want_o) {
            e.o_max_abs = e.o_max_abs.max((a - w).abs());
            ref_max = ref_max.max(w.abs());
        }
        let lse_err = if *want_lse == f64::NEG_INFINITY && *lse == f64::NEG_INFINITY { 0.0 } else { (lse - want_lse).abs() };
        e.lse_max_abs = e.lse_max_abs.max(lse_err);
    }
    e.o_rel = e.o_max_abs / ref_max.max(1e-30);
    // Tolerances above what the kernels' arithmetic gives and far below what a wrapped offset
    // gives (the values of other rows: errors of order max |O|). At 2.2M keys O nearly cancels
    // (|O| about 1e-3 of |V|), and the f32 accumulation of P·V over those keys reaches 2.8e-3
    // of max |O| with f16 inputs on the H200, bit-identical on the wgmma and HMMA kernels;
    // bf16 rounds P to 8 bits (5.5e-3).
    let o_tol = 2e-2;
    let passed = !e.nan && e.o_rel <= o_tol && e.lse_max_abs <= 5e-3;
    let last_o_offset = case.rows.iter().map(|&(b, h, i)| os.offset(b, h, i) + p.v_head_dim).max().unwrap_or(0);
    let last_key_offset = case.rows.iter().map(|&(b, h, _)| ks.offset(b, h / p.group_size(), p.kv_len - 1) + p.head_dim).max().unwrap_or(0);
    Ok(json!({
        "case": case.name,
        "kernel": plan.kernel_name(),
        "precision": precision.name(),
        "strategy": format!("{strategy:?}"),
        "shape": {
            "batch": p.batch, "q_heads": p.q_heads, "kv_heads": p.kv_heads, "q_len": p.q_len, "kv_len": p.kv_len,
            "head_dim": p.head_dim, "layout": format!("{:?}", p.layout), "causal": p.causal,
        },
        "elements": { "q": p.q_len_elems(), "k": p.k_len_elems(), "v": p.v_len_elems(), "o": p.o_len_elems(), "limit_32bit": i32::MAX },
        "sampled_rows": case.rows.len(),
        "largest_sampled_offset": { "o": last_o_offset, "k": last_key_offset },
        "o_max_abs": e.o_max_abs,
        "o_rel": e.o_rel,
        "o_tol": o_tol,
        "lse_max_abs": e.lse_max_abs,
        "nan": e.nan,
        "ms": ms,
        "tflops": p.shape().flops() / (ms * 1e-3) / 1e12,
        "passed": passed,
    }))
}

/// Device buffers of one case in one element type.
struct Buffers<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
}

impl<T: DeviceRepr> Buffers<T> {
    fn new(gpu: &Gpu, p: &AttentionProblem, bf: bool) -> Result<Self, Box<dyn std::error::Error>> {
        let s = &gpu.stream;
        // SAFETY: every element is written by the fill kernels below or by the attention kernel
        // (O, LSE) before anything reads it.
        let mut b = unsafe {
            Buffers {
                q: s.alloc::<T>(p.q_len_elems())?,
                k: s.alloc::<T>(p.k_len_elems())?,
                v: s.alloc::<T>(p.v_len_elems())?,
                o: s.alloc::<T>(p.o_len_elems())?,
                lse: s.alloc::<f32>(p.lse_len_elems())?,
            }
        };
        for (i, x) in [&mut b.q, &mut b.k, &mut b.v].into_iter().enumerate() {
            let n = x.len() as u64;
            gpu.fill(x, n, i as u64 + 1, bf, None)?;
        }
        s.synchronize()?;
        Ok(b)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = match Session::new(Device::Cuda(0)) {
        Ok(s) => s,
        Err(e) => {
            println!("{}", json!({ "skipped": format!("no CUDA device: {e}") }));
            return Ok(());
        }
    };
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let ptx = quattn::cudarc::nvrtc::compile_ptx(KERNELS)?;
    let module = ctx.load_module(ptx)?;
    let gpu = Gpu { stream, fill: module.load_function("fill16")?, gather: module.load_function("gather16")? };
    eprintln!("{}", session.info().adapter);

    let mut failed = 0;
    let mut passed = 0;
    for case in cases() {
        let p = &case.problem;
        // Auto must pick a 64-bit family for tensors above 2^31 elements (wgmma on 9.0).
        let auto = session.plan(p, Precision::F16_DEFAULT, Strategy::Auto);
        let auto_ok = matches!(&auto, Ok(plan) if matches!(plan.family(), Family::Native(NativeKind::Wgmma | NativeKind::Hmma)));
        println!(
            "{}",
            json!({ "case": case.name, "auto": auto.as_ref().map(|p| p.kernel_name()).map_err(|e| e.to_string()), "auto_64bit_family": auto_ok })
        );
        if !auto_ok {
            failed += 1;
        }
        // A 32-bit family refuses it with the typed limit.
        let portable = session.plan(p, Precision::F16_DEFAULT, Strategy::PortableFamily(quattn::PortableKind::Fma));
        let refused = matches!(&portable, Err(quattn::Error::TooLarge { .. }));
        println!("{}", json!({ "case": case.name, "portable_fma": portable.map(|p| p.kernel_name()).map_err(|e| e.to_string()), "refused_too_large": refused }));
        if !refused {
            failed += 1;
        }
        let bytes = 2 * (p.q_len_elems() + p.k_len_elems() + p.v_len_elems() + p.o_len_elems()) + 4 * p.lse_len_elems();
        let (free, _) = quattn::cudarc::driver::result::mem_get_info()?;
        if bytes + (2 << 30) > free {
            println!("{}", json!({ "case": case.name, "skipped": format!("needs {bytes} bytes of device memory, {free} free") }));
            continue;
        }
        let mut report = |r: serde_json::Value| {
            match r.get("passed").and_then(|x| x.as_bool()) {
                Some(true) => passed += 1,
                Some(false) => failed += 1,
                None => {}
            }
            println!("{r}");
        };
        {
            let mut b = Buffers::<f16>::new(&gpu, p, false)?;
            for kind in [NativeKind::Wgmma, NativeKind::Hmma] {
                report(run_one(&gpu, &session, &case, Precision::F16_DEFAULT, Strategy::Native(kind), &mut b)?);
            }
        }
        let mut b = Buffers::<bf16>::new(&gpu, p, true)?;
        report(run_one(&gpu, &session, &case, Precision::BF16_DEFAULT, Strategy::Native(NativeKind::Hmma), &mut b)?);
    }
    println!("{}", json!({ "verdict": if failed == 0 { "PASS" } else { "FAIL" }, "passed": passed, "failed": failed }));
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
