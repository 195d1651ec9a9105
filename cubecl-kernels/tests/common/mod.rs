//! Shared test harness: a naive f64 two-pass reference, host tensors in any layout, and a
//! runner that launches on a wgpu client with poisoned outputs.
#![allow(dead_code)]

use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use half::f16;
use quattn_core::Strides;
use quattn_cubecl::{AttentionShape, Dtype as ElemType, LaunchError, LaunchInfo, PortableKernel};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// A wgpu client, or `None` (with the reason printed) when the machine has no adapter at all.
pub fn wgpu_client() -> Option<ComputeClient<WgpuRuntime>> {
    let instance = wgpu::Instance::default();
    let adapters = cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if adapters.is_empty() {
        println!("SKIPPED: no wgpu adapter on this machine (not even a software one)");
        return None;
    }
    Some(WgpuRuntime::client(&WgpuDevice::DefaultDevice))
}

/// A CUDA client, or `None` (with the reason printed) when no driver or GPU can be opened.
#[cfg(feature = "cuda")]
pub fn cuda_client() -> Option<ComputeClient<cubecl::cuda::CudaRuntime>> {
    use cubecl::cuda::{CudaDevice, CudaRuntime};
    match std::panic::catch_unwind(|| CudaRuntime::client(&CudaDevice::default())) {
        Ok(client) => Some(client),
        Err(_) => {
            println!("SKIPPED: no CUDA device could be opened");
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Bhsd,
    Bshd,
}

/// Per-dtype error budget. The reference sees the same rounded inputs as the kernel, so the
/// error is accumulation order (f32) plus the final rounding of O (f16: 2^-11 per element).
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub o_rel_l2: f64,
    pub lse_abs: f64,
}

impl Tolerance {
    pub fn for_elem(elem: ElemType) -> Self {
        match elem {
            ElemType::F32 => Tolerance { o_rel_l2: 1e-5, lse_abs: 1e-4 },
            ElemType::F16 => Tolerance { o_rel_l2: 2e-3, lse_abs: 1e-4 },
            ElemType::Bf16 => Tolerance { o_rel_l2: 1.6e-2, lse_abs: 1e-4 },
        }
    }
}

/// A logical `[batch, heads, seq, dim]` tensor of f64 values (already rounded to the element
/// type under test).
#[derive(Clone)]
pub struct HostTensor {
    pub shape: [usize; 4],
    pub data: Vec<f64>,
}

impl HostTensor {
    pub fn at(&self, b: usize, h: usize, s: usize, d: usize) -> f64 {
        let [_, hh, ss, dd] = self.shape;
        self.data[((b * hh + h) * ss + s) * dd + d]
    }
}

fn round_to(elem: ElemType, x: f64) -> f64 {
    match elem {
        ElemType::F32 => x as f32 as f64,
        ElemType::F16 => f16::from_f64(x).to_f64(),
        ElemType::Bf16 => half::bf16::from_f64(x).to_f64(),
    }
}

/// Standard normal entries plus ~0.5% outliers of magnitude 6..10, which move the row max late
/// in the sequence and exercise the rescale path.
pub fn random_tensor(rng: &mut StdRng, shape: [usize; 4], elem: ElemType) -> HostTensor {
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            let mut x: f64 = rng.sample(StandardNormal);
            if rng.random::<f64>() < 0.005 {
                x = x.signum() * rng.random_range(6.0..10.0);
            }
            round_to(elem, x)
        })
        .collect();
    HostTensor { shape, data }
}

pub fn strides(layout: Layout, heads: usize, seq: usize, dim: usize) -> Strides {
    let layout = match layout {
        Layout::Bhsd => CoreLayout::Bhsd,
        Layout::Bshd => CoreLayout::Bshd,
    };
    Strides::new(layout, heads, seq, dim)
}

use quattn_core::Layout as CoreLayout;

/// Naive f64 two-pass softmax attention: full score row, max, exp, sum, then P·V. Shares
/// nothing with the kernel's online structure. Returns (O `[b,h,s,dv]`, LSE `[b,h,s]`).
pub fn reference(
    args: &AttentionShape,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
) -> (Vec<f64>, Vec<f64>) {
    let (b_n, h_n, q_n, kv_n) = (args.batch, args.q_heads, args.q_len, args.kv_len);
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let group = args.q_heads / args.kv_heads;
    let offset = kv_n as i64 - q_n as i64;
    let scale = args.scale as f64;
    let mut o = vec![0.0; b_n * h_n * q_n * dv];
    let mut lse = vec![f64::NEG_INFINITY; b_n * h_n * q_n];
    let mut scores = vec![0.0; kv_n];
    for b in 0..b_n {
        for h in 0..h_n {
            let kvh = h / group;
            for i in 0..q_n {
                let visible = if args.causal {
                    (i as i64 + offset + 1).clamp(0, kv_n as i64) as usize
                } else {
                    kv_n
                };
                if visible == 0 {
                    continue;
                }
                for (j, s) in scores.iter_mut().enumerate().take(visible) {
                    *s = scale * (0..d).map(|x| q.at(b, h, i, x) * k.at(b, kvh, j, x)).sum::<f64>();
                }
                let m = scores[..visible].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = scores[..visible].iter().map(|s| (s - m).exp()).sum();
                let row = ((b * h_n + h) * q_n + i) * dv;
                for c in 0..dv {
                    o[row + c] = (0..visible)
                        .map(|j| (scores[j] - m).exp() * v.at(b, kvh, j, c))
                        .sum::<f64>()
                        / l;
                }
                lse[(b * h_n + h) * q_n + i] = m + l.ln();
            }
        }
    }
    (o, lse)
}

/// Writes a logical tensor into a flat buffer with the given strides (head-dim stride 1).
fn scatter(t: &HostTensor, st: Strides, len: usize, fill: f64) -> Vec<f64> {
    let mut out = vec![fill; len];
    let [bn, hn, sn, dn] = t.shape;
    for b in 0..bn {
        for h in 0..hn {
            for s in 0..sn {
                for d in 0..dn {
                    let idx = st.offset(b, h, s) + d;
                    out[idx] = t.at(b, h, s, d);
                }
            }
        }
    }
    out
}

/// The strided extent, and at least one 4-wide vector (what the vector kernels bind).
fn buffer_len(shape: [usize; 4], st: Strides) -> usize {
    let [bn, hn, sn, dn] = shape;
    st.extent(bn, hn, sn, dn).unwrap().max(4)
}

pub fn upload<R: Runtime>(client: &ComputeClient<R>, elem: ElemType, data: &[f64]) -> Handle {
    match elem {
        ElemType::F32 => {
            let v: Vec<f32> = data.iter().map(|&x| x as f32).collect();
            client.create_from_slice(f32::as_bytes(&v))
        }
        ElemType::F16 => {
            let v: Vec<f16> = data.iter().map(|&x| f16::from_f64(x)).collect();
            client.create_from_slice(f16::as_bytes(&v))
        }
        ElemType::Bf16 => {
            let v: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f64(x)).collect();
            client.create_from_slice(half::bf16::as_bytes(&v))
        }
    }
}

pub fn download<R: Runtime>(client: &ComputeClient<R>, elem: ElemType, handle: Handle) -> Vec<f64> {
    let bytes = client.read_one(handle).expect("read back");
    match elem {
        ElemType::F32 => f32::from_bytes(&bytes).iter().map(|&x| x as f64).collect(),
        ElemType::F16 => f16::from_bytes(&bytes).iter().map(|x| x.to_f64()).collect(),
        ElemType::Bf16 => half::bf16::from_bytes(&bytes).iter().map(|x| x.to_f64()).collect(),
    }
}

/// One test problem.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub causal: bool,
    pub layout: Layout,
    pub elem: ElemType,
    pub seed: u64,
}

impl Case {
    pub fn new(q_len: usize, kv_len: usize, head_dim: usize, causal: bool, elem: ElemType) -> Self {
        Self {
            batch: 1,
            q_heads: 2,
            kv_heads: 1,
            q_len,
            kv_len,
            head_dim,
            v_head_dim: head_dim,
            causal,
            layout: Layout::Bhsd,
            elem,
            seed: 0x5eed ^ (q_len as u64) << 8 ^ (kv_len as u64) << 24 ^ head_dim as u64,
        }
    }

    pub fn args(&self) -> AttentionShape {
        let (l, d, dv) = (self.layout, self.head_dim, self.v_head_dim);
        AttentionShape {
            batch: self.batch,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            q_len: self.q_len,
            kv_len: self.kv_len,
            head_dim: d,
            v_head_dim: dv,
            causal: self.causal,
            scale: 1.0 / (d as f32).sqrt(),
            q: strides(l, self.q_heads, self.q_len, d),
            k: strides(l, self.kv_heads, self.kv_len, d),
            v: strides(l, self.kv_heads, self.kv_len, dv),
            o: strides(l, self.q_heads, self.q_len, dv),
            write_lse: true,
        }
    }
}

/// Errors of one run against the reference.
#[derive(Debug)]
pub struct Report {
    pub info: LaunchInfo,
    pub o_rel_l2: f64,
    pub lse_max_abs: f64,
    /// O entries that were not written (still NaN) or not finite.
    pub o_non_finite: usize,
    /// Rows expected to see no key whose O is not exactly 0 or whose LSE is not -inf.
    pub empty_row_errors: usize,
    /// The raw outputs (O's buffer as laid out, LSE), for bitwise comparisons between runs.
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

impl Report {
    pub fn assert_within(&self, case: &Case) {
        let tol = Tolerance::for_elem(case.elem);
        assert_eq!(self.o_non_finite, 0, "unwritten/non-finite O entries: {self:?} for {case:?}");
        assert_eq!(self.empty_row_errors, 0, "empty rows wrong: {self:?} for {case:?}");
        assert!(self.o_rel_l2 < tol.o_rel_l2, "O rel-L2 too large: {self:?} for {case:?}");
        assert!(self.lse_max_abs < tol.lse_abs, "LSE error too large: {self:?} for {case:?}");
    }
}

/// Runs `kernel` on the case's problem (the kernel is launched as given; see [`select`]).
pub fn run_case<R: Runtime>(
    client: &ComputeClient<R>,
    case: &Case,
    kernel: &PortableKernel,
) -> Result<Report, LaunchError> {
    let args = case.args();
    let mut rng = StdRng::seed_from_u64(case.seed);
    let (b, hq, hk) = (case.batch, case.q_heads, case.kv_heads);
    let (sq, sk) = (case.q_len, case.kv_len);
    let (d, dv) = (case.head_dim, case.v_head_dim);
    let q = random_tensor(&mut rng, [b, hq, sq, d], case.elem);
    let k = random_tensor(&mut rng, [b, hk, sk, d], case.elem);
    let v = random_tensor(&mut rng, [b, hk, sk, dv], case.elem);

    let o_shape = [b, hq, sq, dv];
    let q_h = upload(client, case.elem, &scatter(&q, args.q, buffer_len(q.shape, args.q), 0.0));
    let k_h = upload(client, case.elem, &scatter(&k, args.k, buffer_len(k.shape, args.k), 0.0));
    let v_h = upload(client, case.elem, &scatter(&v, args.v, buffer_len(v.shape, args.v), 0.0));
    // Poison: every O and LSE entry must be written by the kernel.
    let o_len = buffer_len(o_shape, args.o);
    let o_h = upload(client, case.elem, &vec![f64::NAN; o_len]);
    let lse_h = upload(client, ElemType::F32, &vec![f64::NAN; (b * hq * sq).max(1)]);

    let info = quattn_cubecl::launch(client, kernel, &args, case.elem, &q_h, &k_h, &v_h, &o_h, Some(&lse_h))?;

    let o_flat = download(client, case.elem, o_h);
    let lse_got = download(client, ElemType::F32, lse_h);
    let (o_ref, lse_ref) = reference(&args, &q, &k, &v);

    let (mut err2, mut ref2, mut non_finite, mut empty_errors, mut lse_err) = (0.0, 0.0, 0, 0, 0.0f64);
    for bi in 0..b {
        for h in 0..hq {
            for i in 0..sq {
                let row = (bi * hq + h) * sq + i;
                let empty = lse_ref[row] == f64::NEG_INFINITY;
                for c in 0..dv {
                    let idx = args.o.offset(bi, h, i) + c;
                    let got = o_flat[idx];
                    let want = o_ref[row * dv + c];
                    if !got.is_finite() {
                        non_finite += 1;
                        continue;
                    }
                    if empty && got != 0.0 {
                        empty_errors += 1;
                    }
                    err2 += (got - want).powi(2);
                    ref2 += want * want;
                }
                let got = lse_got[row];
                if empty {
                    if got != f64::NEG_INFINITY {
                        empty_errors += 1;
                    }
                } else if got.is_finite() {
                    lse_err = lse_err.max((got - lse_ref[row]).abs());
                } else {
                    lse_err = f64::INFINITY;
                }
            }
        }
    }
    Ok(Report {
        info,
        o_rel_l2: if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() },
        lse_max_abs: lse_err,
        o_non_finite: non_finite,
        empty_row_errors: empty_errors,
        o: o_flat,
        lse: lse_got,
    })
}

/// The kernel [`quattn_cubecl::select`] chooses for the case (`family` forced or not).
pub fn select<R: Runtime>(
    client: &ComputeClient<R>,
    case: &Case,
    accumulation: quattn_cubecl::Accumulation,
    family: Option<quattn_cubecl::Family>,
) -> Result<PortableKernel, LaunchError> {
    quattn_cubecl::select(client, &case.args(), case.elem, accumulation, family).map(|s| s.kernel)
}

/// Selects with f32 accumulation, then runs.
pub fn run_selected<R: Runtime>(
    client: &ComputeClient<R>,
    case: &Case,
    family: Option<quattn_cubecl::Family>,
) -> Result<Report, LaunchError> {
    let kernel = select(client, case, Default::default(), family)?;
    run_case(client, case, &kernel)
}
