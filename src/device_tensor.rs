//! Attention on tensors the caller already holds on the device: no host copy, O (and the LSE)
//! written on the same device in the plan's element type, into buffers the caller provides.
//!
//! - **CubeCL** (wgpu and CUDA): [`Session::run_cubecl`] takes CubeCL [`Handle`]s of the
//!   session's client ([`Session::cubecl_client`]). CubeCL keeps one client per device and
//!   runtime, so handles a CubeCL program (or burn 0.21, whose CubeCL backends are built on
//!   CubeCL 0.10 like quattn) allocated on the same device are handles of this client.
//! - **CUDA** (feature `cuda`): [`Session::run_cuda`] takes caller-owned cudarc memory
//!   ([`CudaTensor`] / [`CudaTensorMut`] from a `CudaSlice` or `CudaView`, or raw device
//!   pointers) and the caller's `CudaStream`; quattn enqueues on that stream and does not
//!   synchronize. Native kernels run there; a plan whose kernel is a portable CubeCL kernel is
//!   refused with a typed error (CubeCL cannot adopt foreign CUDA memory: pass CubeCL handles
//!   through [`Session::run_cubecl`] instead). Native FP8 plans take f16 tensors there (the
//!   device prepass quantizes them on the stream), or pre-quantized e4m3 codes and f32
//!   descales through [`Session::run_cuda_fp8`] ([`CudaFp8`]); [`Session::quantize_fp8_cuda`]
//!   runs the prepass alone and returns the codes and the descales it chose.
//! - **CPU**: host slices through [`Session::run`].
//!
//! Every buffer is checked against the plan before anything is enqueued: element type, the
//! number of elements the problem's strides span (`AttentionProblem::q_len_elems` and
//! siblings), and the device it lives on. The host path ([`Session::run`]) uploads into such
//! buffers and runs the same launch.

use cubecl::prelude::{ComputeClient, Runtime};
use cubecl::server::Handle;

use crate::error::{Error, Result, TensorName};
use crate::session::{Plan, Session};

/// The tensors of one call on CubeCL handles: Q, K, V in the plan's element type, O written in
/// it, the LSE (f32 `[batch, q_heads, q_len]`) written when given.
#[derive(Clone, Copy)]
pub struct CubeclTensors<'a> {
    pub q: &'a Handle,
    pub k: &'a Handle,
    pub v: &'a Handle,
    pub o: &'a Handle,
    pub lse: Option<&'a Handle>,
}

impl Session {
    /// The session's CubeCL client for runtime `R` (`cubecl::wgpu::WgpuRuntime` on a wgpu
    /// device, `cubecl::cuda::CudaRuntime` on a CUDA one): allocate or adopt handles with it.
    pub fn cubecl_client<R: Runtime>(&self) -> Result<ComputeClient<R>> {
        Ok(self.cubecl_backend::<R>()?.client().clone())
    }

    /// Runs `plan` on CubeCL handles of this session's client; returns once the work is
    /// enqueued on the client's stream (read O with the client, or [`Session::synchronize`]).
    /// On CUDA a native plan runs on the handles' memory too, ordered after CubeCL's stream.
    ///
    /// ```
    /// use half::f16;
    /// use quattn::cubecl::wgpu::WgpuRuntime;
    /// use quattn::{AttentionProblem, CubeclTensors, Device, Precision, Session, Strategy, WgpuAdapter};
    ///
    /// // Any wgpu adapter, mesa's software Vulkan included.
    /// let Ok(session) = Session::new(Device::Wgpu(WgpuAdapter::Default)) else { return Ok(()) };
    /// let problem = AttentionProblem::new(1, 4, 64, 64).causal(true);
    /// let plan = session.plan(&problem, Precision::F16_DEFAULT, Strategy::Auto)?;
    /// let client = session.cubecl_client::<WgpuRuntime>()?;
    /// let ones = vec![f16::from_f32(1.0); problem.q_len_elems()];
    /// let q = client.create_from_slice(bytemuck::cast_slice(&ones)); // what a CubeCL/burn program holds
    /// let o = client.empty(problem.o_len_elems() * 2);
    /// session.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &q, k: &q, v: &q, o: &o, lse: None })?;
    /// let o: Vec<f16> = bytemuck::pod_collect_to_vec(&client.read_one(o).expect("read O"));
    /// assert!(o.iter().all(|x| x.to_f32() == 1.0)); // the average of ones
    /// # Ok::<(), quattn::Error>(())
    /// ```
    pub fn run_cubecl<R: Runtime>(&self, plan: &Plan, t: CubeclTensors<'_>) -> Result<()> {
        self.cubecl_backend::<R>()?;
        if plan.is_portable_fp8() {
            return Err(Error::EntryPoint {
                kernel: plan.kernel_name(),
                reason: "an FP8 plan on the portable kernel reads codes and descales: use Session::run_cubecl_fp8".into(),
            });
        }
        if matches!(plan.kernel, crate::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Fp4(_), .. }) {
            return Err(Error::EntryPoint {
                kernel: plan.kernel_name(),
                reason: "a 4-bit plan reads codes, block scales and tensor scales: use Session::run_cubecl_fp4".into(),
            });
        }
        check_handles(plan, &t, plan.dtype().size_bytes())?;
        self.backend().run_handles(plan, &t)
    }

    /// Runs an FP8 plan (a [`crate::Precision::Fp8`] plan on the portable FP8 kernel) on CubeCL
    /// handles: Q, K and V hold FP8 codes (one byte per element, in the problem's layout, each
    /// buffer padded with any bytes to a multiple of 16), the descales are f32 with the shapes
    /// of the plan's granularity ([`Plan::fp8_descale_lens`]: `[1]` per tensor, `[batch,
    /// heads]` per head, `[batch, heads, ceil(len / block)]` per block, Q per q head, K and V per
    /// kv head); O is written in f16, the LSE in f32 when given. Real values are
    /// `decode(code) · descale`. Descale values are not read on the host: a non-finite or
    /// non-positive descale gives non-finite or wrong rows, never a fault.
    ///
    /// ```
    /// use quattn::cubecl::wgpu::WgpuRuntime;
    /// use quattn::{AttentionProblem, CubeclTensors, DescaleGranularity, Device, Fp8Descales, Fp8Format, Precision, PvFormat, Session, Strategy, WgpuAdapter};
    ///
    /// let Ok(session) = Session::new(Device::Wgpu(WgpuAdapter::Default)) else { return Ok(()) };
    /// let problem = AttentionProblem::new(1, 4, 64, 64);
    /// let precision = Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerTensor, p: PvFormat::F16 };
    /// let plan = session.plan(&problem, precision, Strategy::Auto)?;
    /// let client = session.cubecl_client::<WgpuRuntime>()?;
    /// // e4m3 code 0x38 is 1.0; with descale 0.5 every element is 0.5 (an FP8 KV cache, say).
    /// let codes = client.create_from_slice(&vec![0x38u8; problem.q_len_elems().next_multiple_of(16)]);
    /// let half = client.create_from_slice(bytemuck::cast_slice(&[0.5f32; 4]));
    /// let o = client.empty(problem.o_len_elems() * 2);
    /// let t = CubeclTensors { q: &codes, k: &codes, v: &codes, o: &o, lse: None };
    /// session.run_cubecl_fp8::<WgpuRuntime>(&plan, t, Fp8Descales { q: &half, k: &half, v: &half })?;
    /// let o: Vec<half::f16> = bytemuck::pod_collect_to_vec(&client.read_one(o).expect("read O"));
    /// assert!(o.iter().all(|x| x.to_f32() == 0.5));
    /// # Ok::<(), quattn::Error>(())
    /// ```
    pub fn run_cubecl_fp8<R: Runtime>(&self, plan: &Plan, t: CubeclTensors<'_>, descales: Fp8Descales<'_>) -> Result<()> {
        let backend = self.cubecl_backend::<R>()?;
        let (true, Some(lens)) = (plan.is_portable_fp8(), plan.fp8_descale_lens()) else {
            return Err(Error::EntryPoint {
                kernel: plan.kernel_name(),
                reason: "run_cubecl_fp8 runs FP8 plans on the portable FP8 kernel (native FP8 plans take CUDA memory: Session::run_cuda_fp8)".into(),
            });
        };
        check_handles(plan, &t, 1)?;
        for ((tensor, h), len) in [(TensorName::Q, descales.q), (TensorName::K, descales.k), (TensorName::V, descales.v)].into_iter().zip(lens) {
            let got = (h.size_in_used() / 4) as usize;
            if got < len {
                return Err(Error::Descales { tensor, reason: format!("the buffer holds {got} f32 descales, the plan's granularity needs {len}") });
            }
        }
        let lse = if plan.problem.return_lse { t.lse.cloned() } else { None };
        let d = crate::backend::gpu::GpuData {
            q: t.q.clone(),
            k: t.k.clone(),
            v: t.v.clone(),
            o: t.o.clone(),
            lse,
            descales: Some(crate::backend::gpu::Fp8Descales { q: descales.q.clone(), k: descales.k.clone(), v: descales.v.clone() }),
            fp4: None,
            // FP8 plans refuse variable-length batches.
            varlen: None,
        };
        backend.launch(plan, &d)
    }

    /// Runs a 4-bit plan ([`crate::Precision::Nvfp4`] or [`crate::Precision::Mxfp4`] on the
    /// portable 4-bit kernel) on pre-quantized codes held on the device ([`Fp4Tensors`]: the
    /// layouts are there). O is written in f32, the LSE in f32 when given. The values are
    /// `e2m1(code) · block_scale · tensor_scale` (MXFP4: no tensor scale). Plans with K smoothing
    /// are refused: smoothing is part of quattn's own quantization (the host path), and
    /// smoothed codes need the LSE shift it computes. Scale values are not read on the host: a
    /// NaN scale code gives NaN rows, never a fault.
    pub fn run_cubecl_fp4<R: Runtime>(&self, plan: &Plan, t: Fp4Tensors<'_>) -> Result<()> {
        self.run_cubecl_fp4_scales::<R>(plan, t, Fp4ScaleLayout::RowMajor)
    }

    /// [`Session::run_cubecl_fp4`] with the block scales in `layout`. With
    /// [`Fp4ScaleLayout::Blocked128x4`] each scale buffer holds
    /// [`quattn_cubecl::blocked_scale_bytes`] bytes of its `[rows, cols]` matrix (`q_scales`:
    /// `batch · q_heads · q_len` rows of `head_dim / block`; `k_scales` likewise; `v_scales` with
    /// 4-bit V: `batch · kv_heads · v_head_dim` rows of `v_cols / 16`), converted once on the
    /// client's stream into row-major scratch buffers before the attention kernel runs.
    pub fn run_cubecl_fp4_scales<R: Runtime>(&self, plan: &Plan, t: Fp4Tensors<'_>, layout: Fp4ScaleLayout) -> Result<()> {
        let backend = self.cubecl_backend::<R>()?;
        let refuse = |reason: &str| Err(Error::EntryPoint { kernel: plan.kernel_name(), reason: reason.into() });
        let crate::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Fp4(fp4), .. } = &plan.kernel else {
            return refuse("run_cubecl_fp4 takes a 4-bit plan on the portable 4-bit kernel (Precision::Nvfp4 or Mxfp4)");
        };
        if matches!(plan.precision, crate::Precision::Nvfp4 { smooth_k: true, .. } | crate::Precision::Mxfp4 { smooth_k: true }) {
            return refuse("K smoothing is part of quattn's quantization: plan with smooth_k false for pre-quantized codes, or pass f16/f32 values through Session::run");
        }
        let p = &plan.problem;
        if p.paged.is_some() || p.varlen.is_some() {
            return refuse("4-bit codes come as dense [batch, heads, len] rows");
        }
        let (d, dv) = (p.head_dim, p.v_head_dim);
        let block = fp4.format.block();
        let (q_rows, k_rows) = (p.batch * p.q_heads * p.q_len, p.batch * p.kv_heads * p.kv_len);
        let v_cols = p.kv_len.div_ceil(16) * 16;
        let nvfp4_v = fp4.v.is_4bit();
        let v_bytes = match nvfp4_v {
            true => p.batch * p.kv_heads * dv * v_cols / 2,
            false => k_rows * dv * 2,
        };
        // Each scale matrix's (rows, cols) and the bytes its layout takes.
        let v_scale_shape = (p.batch * p.kv_heads * dv, v_cols / 16);
        let scale_bytes = |(rows, cols): (usize, usize)| match layout {
            Fp4ScaleLayout::RowMajor => rows * cols,
            Fp4ScaleLayout::Blocked128x4 => quattn_cubecl::blocked_scale_bytes(rows, cols),
        };
        let (q_scale_shape, k_scale_shape) = ((q_rows, d / block), (k_rows, d / block));
        let mut checks = vec![
            (TensorName::Q, t.q, q_rows * d / 2),
            (TensorName::Q, t.q_scales, scale_bytes(q_scale_shape)),
            (TensorName::K, t.k, k_rows * d / 2),
            (TensorName::K, t.k_scales, scale_bytes(k_scale_shape)),
            (TensorName::V, t.v, v_bytes),
            (TensorName::Q, t.tensor_scales[0], 4),
            (TensorName::K, t.tensor_scales[1], 4),
            (TensorName::V, t.tensor_scales[2], 4),
            (TensorName::Output, t.o, p.o_len_elems() * 4),
        ];
        let v_scale_bytes = scale_bytes(v_scale_shape);
        let v_scales = match (nvfp4_v, t.v_scales) {
            (true, Some(h)) => {
                checks.push((TensorName::V, h, v_scale_bytes));
                h.clone()
            }
            (true, None) => return Err(Error::BufferLength { tensor: TensorName::V, expected: v_scale_bytes, got: 0 }),
            // Unread with bf16 V.
            (false, _) => backend.client().empty(4),
        };
        for (tensor, h, bytes) in checks {
            // Every byte buffer is read as 32-bit words.
            check_bytes(tensor, h.size_in_used(), bytes.next_multiple_of(4), 1)?;
        }
        let lse = match (t.lse, p.return_lse) {
            (Some(h), true) => {
                check_bytes(TensorName::Lse, h.size_in_used(), p.lse_len_elems(), 4)?;
                Some(h.clone())
            }
            (None, true) => return Err(Error::BufferLength { tensor: TensorName::Lse, expected: p.lse_len_elems(), got: 0 }),
            (_, false) => None,
        };
        let (mut q_scales, mut k_scales, mut v_scales) = (t.q_scales.clone(), t.k_scales.clone(), v_scales);
        if layout == Fp4ScaleLayout::Blocked128x4 {
            let client = backend.client();
            let convert = |h: &Handle, (rows, cols): (usize, usize)| {
                quattn_cubecl::scales_from_blocked(client, h, rows, cols)
                    .map_err(|e| Error::Kernel { kernel: "scales_from_blocked".into(), reason: e.to_string() })
            };
            q_scales = convert(&q_scales, q_scale_shape)?;
            k_scales = convert(&k_scales, k_scale_shape)?;
            if nvfp4_v {
                v_scales = convert(&v_scales, v_scale_shape)?;
            }
        }
        let d = crate::backend::gpu::GpuData {
            q: t.q.clone(),
            k: t.k.clone(),
            v: t.v.clone(),
            o: t.o.clone(),
            lse,
            descales: None,
            fp4: Some(crate::backend::gpu::Fp4Scales {
                q: q_scales,
                k: k_scales,
                v: v_scales,
                tensor: t.tensor_scales.map(|h| h.clone()),
                lse_shift: None,
            }),
            varlen: None,
        };
        backend.launch(plan, &d)
    }

    /// `append_kv` on CubeCL handles ([`crate::PagedKv::append`] on the device): writes
    /// `new_tokens` new keys and values per sequence (`k_new` `[batch, new_tokens, kv_heads,
    /// head_dim]`, `v_new` with `v_head_dim`, elements of `dtype`) into the pools `k_pool` /
    /// `v_pool` (`[num_pages, page_size, kv_heads, dim]`) at positions `seq_len(b) ..` through
    /// the block table, enqueued on the client's stream, and returns the cache with the lengths
    /// grown (host data, like the table). The same checks as the host append run first (pages
    /// missing from the table or the pool, two appended keys sharing a pool row, buffer sizes):
    /// on any of them nothing is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn append_kv_cubecl<R: Runtime>(
        &self,
        cache: &crate::PagedKv,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        dtype: crate::Dtype,
        pools: [&Handle; 2],
        new: [&Handle; 2],
        new_tokens: usize,
    ) -> Result<crate::PagedKv> {
        let backend = self.cubecl_backend::<R>()?;
        let batch = cache.batch();
        cache.check_append(kv_heads, head_dim, v_head_dim, new_tokens)?;
        let es = dtype.size_bytes();
        for (tensor, h, elems) in [
            (TensorName::K, pools[0], cache.pool_elems(kv_heads, head_dim)),
            (TensorName::V, pools[1], cache.pool_elems(kv_heads, v_head_dim)),
            (TensorName::K, new[0], batch * new_tokens * kv_heads * head_dim),
            (TensorName::V, new[1], batch * new_tokens * kv_heads * v_head_dim),
        ] {
            check_bytes(tensor, h.size_in_used(), elems, es)?;
        }
        let narrow = |what: &'static str, x: usize| u32::try_from(x).map_err(|_| Error::TooLarge { what, value: x as u128, limit: u32::MAX as u128, path: "append_kv_cubecl".into() });
        let table = backend.paged_table(cache);
        let geometry = quattn_cubecl::PagedCache {
            page_size: narrow("page_size", cache.page_size)?,
            num_pages: narrow("num_pages", cache.num_pages)?,
            max_pages: narrow("max_pages", cache.max_pages)?,
            table: &table,
        };
        quattn_cubecl::launch_paged_append::<R>(
            backend.client(),
            &geometry,
            narrow("batch", batch)?,
            narrow("kv_heads", kv_heads)?,
            narrow("head_dim", head_dim)?,
            narrow("v_head_dim", v_head_dim)?,
            es as u32,
            narrow("new_tokens", new_tokens)?,
            pools,
            new,
        )
        .map_err(|e| Error::Kernel { kernel: "paged_append".into(), reason: e.to_string() })?;
        Ok(cache.grown(new_tokens))
    }

    fn cubecl_backend<R: Runtime>(&self) -> Result<&crate::backend::gpu::CubeclBackend<R>> {
        self.backend()
            .cubecl()
            .and_then(|b| b.downcast_ref::<crate::backend::gpu::CubeclBackend<R>>())
            .ok_or_else(|| Error::WrongDevice {
                tensor: TensorName::Q,
                expected: format!("{} ({})", self.info().kind, self.info().adapter),
                got: format!("a CubeCL runtime `{}`", std::any::type_name::<R>()),
            })
    }
}

/// The pre-quantized operands of a 4-bit call on CubeCL handles ([`Session::run_cubecl_fp4`]).
/// Codes are E2M1, two per byte (element `2i` in the low nibble); block scales one byte each
/// (NVFP4: UE4M3 per 16 elements; MXFP4: E8M0 per 32); rows are dense whatever the problem's
/// layout, and every buffer holds a whole number of 32-bit words (pad with any bytes):
///
/// - `q`: `[batch, q_heads, q_len]` rows of `head_dim / 2` bytes; `q_scales`: the same rows of
///   `head_dim / block` scale codes. `k` / `k_scales` likewise over `[batch, kv_heads, kv_len]`.
/// - `v`: with `Nvfp4V::Bf16` (and MXFP4), bf16 `[batch, kv_heads, kv_len, v_head_dim]`;
///   `v_scales` unused. With `Nvfp4V::Nvfp4` or `Nvfp4V::Nvfp4P16` (the same layout), `Vᵀ`
///   codes: per (batch, kv head, channel) a row of the keys padded with zero codes to
///   `v_cols = ceil(kv_len / 16) · 16`, `v_cols / 2` bytes; `v_scales` its UE4M3 codes,
///   `v_cols / 16` per row.
/// - `tensor_scales`: one f32 each for Q, K, V (1.0 for MXFP4's Q and K; V's unused with bf16
///   V), the scale of `codec::nvfp4`'s two-level scaling.
/// - `o`: f32 in the problem's layout; `lse`: f32 `[batch, q_heads, q_len]`, when the problem
///   asks for it.
#[derive(Clone, Copy)]
pub struct Fp4Tensors<'a> {
    pub q: &'a Handle,
    pub q_scales: &'a Handle,
    pub k: &'a Handle,
    pub k_scales: &'a Handle,
    pub v: &'a Handle,
    pub v_scales: Option<&'a Handle>,
    pub tensor_scales: [&'a Handle; 3],
    pub o: &'a Handle,
    pub lse: Option<&'a Handle>,
}

/// How the block-scale codes of a pre-quantized 4-bit call ([`Session::run_cubecl_fp4_scales`])
/// are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fp4ScaleLayout {
    /// One byte per scale, each tensor's rows as [`Fp4Tensors`] describes them.
    #[default]
    RowMajor,
    /// The 128x4-blocked layout of NVIDIA's block-scaled MMAs, as cuBLAS and CUTLASS keep NVFP4
    /// and MXFP4 scale factors ([`quattn_cubecl::blocked_scale_offset`]), over the same
    /// `[rows, cols]` matrices; converted once on the device.
    Blocked128x4,
}

/// The f32 descale buffers of an FP8 call on CubeCL handles ([`Session::run_cubecl_fp8`]).
#[derive(Clone, Copy)]
pub struct Fp8Descales<'a> {
    pub q: &'a Handle,
    pub k: &'a Handle,
    pub v: &'a Handle,
}

/// Sizes in bytes against what the plan's strides span, with inputs of `in_size` bytes per
/// element (FP8 codes: 1) and O in the plan's element type.
fn check_handles(plan: &Plan, t: &CubeclTensors<'_>, in_size: usize) -> Result<()> {
    let p = &plan.problem;
    let es = plan.dtype().size_bytes();
    for (tensor, h, elems, size) in [
        (TensorName::Q, t.q, p.q_len_elems(), in_size),
        (TensorName::K, t.k, p.k_len_elems(), in_size),
        (TensorName::V, t.v, p.v_len_elems(), in_size),
        (TensorName::Output, t.o, p.o_len_elems(), es),
    ] {
        check_bytes(tensor, h.size_in_used(), elems, size)?;
    }
    match (t.lse, p.return_lse) {
        (Some(h), _) => check_bytes(TensorName::Lse, h.size_in_used(), p.lse_len_elems(), 4),
        (None, true) => Err(Error::BufferLength { tensor: TensorName::Lse, expected: p.lse_len_elems(), got: 0 }),
        (None, false) => Ok(()),
    }
}

pub(crate) fn check_bytes(tensor: TensorName, bytes: u64, elems: usize, elem_size: usize) -> Result<()> {
    let got = (bytes / elem_size as u64) as usize;
    if got < elems {
        return Err(Error::BufferLength { tensor, expected: elems, got });
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::CudaCall;
#[cfg(feature = "cuda")]
pub use cuda::{CudaCodes, CudaCodesMut, CudaFp8, CudaFp8Mut, CudaTensor, CudaTensorMut};

#[cfg(feature = "cuda")]
mod cuda {
    use std::marker::PhantomData;
    use std::sync::Arc;

    use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

    use crate::error::{Error, Result, TensorName};
    use crate::session::{Plan, Session};
    use crate::tensor::Element;
    use crate::{AttentionProblem, DescaleGranularity, Dtype, Fp8Format};

    /// A caller-owned CUDA buffer quattn reads: its device address, length in elements and
    /// element type. Made from a cudarc `CudaSlice` / `CudaView` it keeps cudarc's stream
    /// bookkeeping guard until the call returns, so cudarc orders later work on other streams
    /// after quattn's kernels.
    pub struct CudaTensor<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        pub(crate) dtype: Dtype,
        _guard: Option<SyncOnDrop<'a>>,
    }

    /// A caller-owned CUDA buffer quattn writes (O, LSE).
    pub struct CudaTensorMut<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        pub(crate) dtype: Dtype,
        _guard: Option<SyncOnDrop<'a>>,
        _mut: PhantomData<&'a mut ()>,
    }

    impl<'a> CudaTensor<'a> {
        /// A cudarc slice or view of `f32`, `half::f16` or `half::bf16`, used on `stream`.
        pub fn new<T: Element, S: DevicePtr<T>>(s: &'a S, stream: &'a CudaStream) -> Self {
            let len = s.len();
            let (ptr, guard) = s.device_ptr(stream);
            CudaTensor { ptr, len, dtype: T::DTYPE, _guard: Some(guard) }
        }

        /// Raw device memory of the session's device.
        ///
        /// # Safety
        /// `ptr` must address `len` elements of `dtype` in the session's CUDA context, valid and
        /// not written by other work until the kernels quattn enqueues on the call's stream
        /// have finished.
        pub unsafe fn from_raw(ptr: u64, len: usize, dtype: Dtype) -> Self {
            CudaTensor { ptr, len, dtype, _guard: None }
        }
    }

    impl<'a> CudaTensorMut<'a> {
        /// A mutable cudarc slice or view of `f32`, `half::f16` or `half::bf16`, used on `stream`.
        pub fn new<T: Element, S: DevicePtrMut<T>>(s: &'a mut S, stream: &'a CudaStream) -> Self {
            let len = s.len();
            let (ptr, guard) = s.device_ptr_mut(stream);
            CudaTensorMut { ptr, len, dtype: T::DTYPE, _guard: Some(guard), _mut: PhantomData }
        }

        /// Raw device memory of the session's device, written by the call.
        ///
        /// # Safety
        /// As [`CudaTensor::from_raw`], and nothing else may read or write it until the call's
        /// kernels have finished.
        pub unsafe fn from_raw(ptr: u64, len: usize, dtype: Dtype) -> Self {
            CudaTensorMut { ptr, len, dtype, _guard: None, _mut: PhantomData }
        }
    }

    /// A caller-owned CUDA buffer of FP8 codes (one byte per element) quattn reads.
    pub struct CudaCodes<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        _guard: Option<SyncOnDrop<'a>>,
    }

    /// A caller-owned CUDA buffer of FP8 codes quattn writes.
    pub struct CudaCodesMut<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        _guard: Option<SyncOnDrop<'a>>,
        _mut: PhantomData<&'a mut ()>,
    }

    impl<'a> CudaCodes<'a> {
        /// A cudarc slice or view of `u8` codes, used on `stream`.
        pub fn new<S: DevicePtr<u8>>(s: &'a S, stream: &'a CudaStream) -> Self {
            let len = s.len();
            let (ptr, guard) = s.device_ptr(stream);
            CudaCodes { ptr, len, _guard: Some(guard) }
        }

        /// Raw device memory of the session's device.
        ///
        /// # Safety
        /// As [`CudaTensor::from_raw`], for `len` bytes.
        pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
            CudaCodes { ptr, len, _guard: None }
        }
    }

    impl<'a> CudaCodesMut<'a> {
        /// A mutable cudarc slice or view of `u8` codes, used on `stream`.
        pub fn new<S: DevicePtrMut<u8>>(s: &'a mut S, stream: &'a CudaStream) -> Self {
            let len = s.len();
            let (ptr, guard) = s.device_ptr_mut(stream);
            CudaCodesMut { ptr, len, _guard: Some(guard), _mut: PhantomData }
        }

        /// Raw device memory of the session's device, written by the call.
        ///
        /// # Safety
        /// As [`CudaTensorMut::from_raw`], for `len` bytes.
        pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
            CudaCodesMut { ptr, len, _guard: None, _mut: PhantomData }
        }
    }

    /// Pre-quantized Q, K and V of one FP8 call ([`Session::run_cuda_fp8`]): e4m3 codes in the
    /// problem's layout (the strides of Q, K and V count bytes), a value being
    /// `decode(code) · descale`, and f32 descales ([`CudaTensor`]s of `f32`) with the lengths
    /// of [`Plan::fp8_descale_lens`]: `[1]` each per tensor, or `[batch, q_heads]` for Q and
    /// `[batch, kv_heads]` for K and V per head (FlashAttention-3's `q_descale` / `k_descale`
    /// / `v_descale`).
    pub struct CudaFp8<'a> {
        pub q: CudaCodes<'a>,
        pub k: CudaCodes<'a>,
        pub v: CudaCodes<'a>,
        pub q_descale: CudaTensor<'a>,
        pub k_descale: CudaTensor<'a>,
        pub v_descale: CudaTensor<'a>,
    }

    /// Where [`Session::quantize_fp8_cuda`] writes: codes with the inputs' strides, the f32
    /// descales it chose (lengths as in [`CudaFp8`]).
    pub struct CudaFp8Mut<'a> {
        pub q: CudaCodesMut<'a>,
        pub k: CudaCodesMut<'a>,
        pub v: CudaCodesMut<'a>,
        pub q_descale: CudaTensorMut<'a>,
        pub k_descale: CudaTensorMut<'a>,
        pub v_descale: CudaTensorMut<'a>,
    }

    /// `Error::Descales` unless `got` f32 descales are the `need` of `tensor`.
    fn check_descales(tensor: TensorName, dtype: Dtype, got: usize, need: usize) -> Result<()> {
        if dtype != Dtype::F32 {
            return Err(Error::Dtype { tensor, expected: Dtype::F32, got: dtype });
        }
        if got != need {
            return Err(Error::Descales {
                tensor,
                reason: format!("the buffer holds {got} f32 descales, the plan's granularity takes {need}"),
            });
        }
        Ok(())
    }

    /// O (and the LSE) against the plan: element type, length, the LSE present when asked for.
    fn check_outputs(plan: &Plan, o: &CudaTensorMut<'_>, lse: Option<&CudaTensorMut<'_>>) -> Result<()> {
        let p = &plan.problem;
        let want = plan.dtype();
        if o.dtype != want {
            return Err(Error::Dtype { tensor: TensorName::Output, expected: want, got: o.dtype });
        }
        if o.len < p.o_len_elems() {
            return Err(Error::BufferLength { tensor: TensorName::Output, expected: p.o_len_elems(), got: o.len });
        }
        match lse {
            Some(l) if l.dtype != Dtype::F32 => Err(Error::Dtype { tensor: TensorName::Lse, expected: Dtype::F32, got: l.dtype }),
            Some(l) if l.len < p.lse_len_elems() => Err(Error::BufferLength { tensor: TensorName::Lse, expected: p.lse_len_elems(), got: l.len }),
            None if p.return_lse => Err(Error::BufferLength { tensor: TensorName::Lse, expected: p.lse_len_elems(), got: 0 }),
            _ => Ok(()),
        }
    }

    /// The buffers of one CUDA call, checked against a plan.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct CudaCall {
        pub q: u64,
        pub k: u64,
        pub v: u64,
        pub o: u64,
        /// 0 when the caller wants no LSE (the backend supplies scratch where a kernel needs one).
        pub lse: u64,
        /// A paged or variable-length plan's tables on the device (0: the backend copies the
        /// plan's).
        pub tables: u64,
    }

    impl Session {
        /// Runs `plan` on caller-owned CUDA memory, enqueued on `stream` (which must belong to
        /// the session's device); returns without synchronizing. Q, K, V and O are in the
        /// plan's element type ([`Plan::dtype`]); `lse`, when given, is f32
        /// `[batch, q_heads, q_len]`. A native FP8 plan ([`crate::Precision::Fp8`] on a native
        /// kernel) takes f16 Q, K and V here and quantizes them on the stream with the device
        /// prepass (bit-exact with `codec::fp8_scaled`) before its kernels; codes already in
        /// FP8 go through [`Session::run_cuda_fp8`].
        pub fn run_cuda(
            &self,
            plan: &Plan,
            stream: &Arc<CudaStream>,
            q: CudaTensor<'_>,
            k: CudaTensor<'_>,
            v: CudaTensor<'_>,
            o: CudaTensorMut<'_>,
            lse: Option<CudaTensorMut<'_>>,
        ) -> Result<()> {
            let p = &plan.problem;
            let want = plan.dtype();
            for (tensor, dtype, len, elems) in [
                (TensorName::Q, q.dtype, q.len, p.q_len_elems()),
                (TensorName::K, k.dtype, k.len, p.k_len_elems()),
                (TensorName::V, v.dtype, v.len, p.v_len_elems()),
            ] {
                if dtype != want {
                    return Err(Error::Dtype { tensor, expected: want, got: dtype });
                }
                if len < elems {
                    return Err(Error::BufferLength { tensor, expected: elems, got: len });
                }
            }
            check_outputs(plan, &o, lse.as_ref())?;
            let cuda = self.cuda_backend()?;
            let call = CudaCall { q: q.ptr, k: k.ptr, v: v.ptr, o: o.ptr, lse: lse.as_ref().map_or(0, |l| l.ptr), tables: 0 };
            cuda.run_raw(plan, stream, &call)
            // The cudarc guards drop here, after the launch is enqueued.
        }

        /// Runs a native FP8 plan on pre-quantized codes ([`CudaFp8`]: e4m3 Q, K, V and their
        /// f32 descales, as an FP8 KV cache holds them), enqueued on `stream`; returns without
        /// synchronizing. O is written in the plan's element type ([`Plan::dtype`], f16), the
        /// LSE (f32 `[batch, q_heads, q_len]`) when given. The family's Vᵀ prepass runs on V
        /// at every call, into the stream's scratch. Descale values are not read on the host:
        /// a non-finite or non-positive descale gives non-finite or wrong rows, never a fault;
        /// NaN codes give NaN in the rows that see them.
        ///
        /// Errors: [`Error::EntryPoint`] for a plan that is not native FP8 (portable FP8 plans
        /// take CubeCL handles: [`Session::run_cubecl_fp8`]), [`Error::BufferLength`] for short
        /// code or output buffers, [`Error::Dtype`] / [`Error::Descales`] for descale buffers
        /// that are not f32 or not exactly [`Plan::fp8_descale_lens`] long.
        ///
        /// ```
        /// use quattn::cudarc::driver::CudaContext;
        /// use quattn::{AttentionProblem, CudaCodes, CudaFp8, CudaTensor, CudaTensorMut, DescaleGranularity, Device, Fp8Format, KernelId, Precision, PvFormat, Session, Strategy};
        ///
        /// // A CUDA device with the native FP8 kernels (compute capability 8.9 or newer), else nothing to show.
        /// let Ok(session) = Session::new(Device::Cuda(0)) else { return Ok(()) };
        /// let problem = AttentionProblem::new(1, 8, 64, 128).kv_heads(2).kv_len(256);
        /// let precision = Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerHead, p: PvFormat::Fp8 };
        /// let plan = session.plan(&problem, precision, Strategy::Auto)?;
        /// if !matches!(plan.kernel, KernelId::Native(_)) { return Ok(()) }
        /// let stream = CudaContext::new(0).expect("CUDA device 0").default_stream();
        /// // An FP8 KV cache: e4m3 codes (0x38 is 1.0) and one descale per (batch, kv head).
        /// let q = stream.clone_htod(&vec![0x38u8; problem.q_len_elems()]).expect("upload");
        /// let kv = stream.clone_htod(&vec![0x38u8; problem.k_len_elems()]).expect("upload");
        /// let [qn, kn, vn] = plan.fp8_descale_lens().expect("an FP8 plan");
        /// let q_descale = stream.clone_htod(&vec![0.5f32; qn]).expect("upload");
        /// let k_descale = stream.clone_htod(&vec![0.25f32; kn]).expect("upload");
        /// let v_descale = stream.clone_htod(&vec![2.0f32; vn]).expect("upload");
        /// let mut o = stream.alloc_zeros::<half::f16>(problem.o_len_elems()).expect("alloc");
        /// let codes = CudaFp8 {
        ///     q: CudaCodes::new(&q, &stream),
        ///     k: CudaCodes::new(&kv, &stream),
        ///     v: CudaCodes::new(&kv, &stream),
        ///     q_descale: CudaTensor::new(&q_descale, &stream),
        ///     k_descale: CudaTensor::new(&k_descale, &stream),
        ///     v_descale: CudaTensor::new(&v_descale, &stream),
        /// };
        /// session.run_cuda_fp8(&plan, &stream, codes, CudaTensorMut::new(&mut o, &stream), None)?;
        /// let o = stream.clone_dtoh(&o).expect("read O"); // waits for the stream
        /// assert!(o.iter().all(|x| x.to_f32() == 2.0)); // every V value is 1.0 · 2.0
        /// # Ok::<(), quattn::Error>(())
        /// ```
        pub fn run_cuda_fp8(&self, plan: &Plan, stream: &Arc<CudaStream>, x: CudaFp8<'_>, o: CudaTensorMut<'_>, lse: Option<CudaTensorMut<'_>>) -> Result<()> {
            let p = &plan.problem;
            let (true, Some(need)) = (matches!(plan.kernel, crate::KernelId::Native(_)), plan.fp8_descale_lens()) else {
                return Err(Error::EntryPoint {
                    kernel: plan.kernel_name(),
                    reason: "run_cuda_fp8 runs FP8 plans on the native FP8 kernels (portable FP8 plans take CubeCL handles: Session::run_cubecl_fp8)".into(),
                });
            };
            for (tensor, len, elems) in [(TensorName::Q, x.q.len, p.q_len_elems()), (TensorName::K, x.k.len, p.k_len_elems()), (TensorName::V, x.v.len, p.v_len_elems())] {
                if len < elems {
                    return Err(Error::BufferLength { tensor, expected: elems, got: len });
                }
            }
            for ((tensor, d), need) in [(TensorName::Q, &x.q_descale), (TensorName::K, &x.k_descale), (TensorName::V, &x.v_descale)].into_iter().zip(need) {
                check_descales(tensor, d.dtype, d.len, need)?;
            }
            check_outputs(plan, &o, lse.as_ref())?;
            let cuda = self.cuda_backend()?;
            let ptrs = quattn_native::Fp8Ptrs {
                q: x.q.ptr,
                k: x.k.ptr,
                v: x.v.ptr,
                vt: 0,
                o: o.ptr,
                lse: lse.as_ref().map_or(0, |l| l.ptr),
                q_descale: x.q_descale.ptr,
                k_descale: x.k_descale.ptr,
                v_descale: x.v_descale.ptr,
            };
            cuda.run_raw_fp8(plan, stream, &ptrs)
        }

        /// The device FP8 prepass alone: f16 or bf16 Q, K and V of `problem` (one element type
        /// for the three) to `format` codes with descales of `granularity` (per tensor or per
        /// (batch, head)), written into `out` on `stream`; returns without synchronizing. Codes
        /// and descales are bit-exact with `codec::fp8_scaled::Fp8Tensor::quantize` on the same
        /// values (codes keep the inputs' strides; descales `[1]` or `[batch, heads]`, Q per
        /// query head, K and V per KV head), so the descales the prepass chose can be read back
        /// and inspected, and the codes passed to [`Session::run_cuda_fp8`]. NaN elements
        /// become NaN codes without entering their group's descale; an infinite element makes
        /// its group's descale infinite. Head dims that are powers of two from 8 to 8192.
        #[allow(clippy::too_many_arguments)]
        pub fn quantize_fp8_cuda(
            &self,
            problem: &AttentionProblem,
            format: Fp8Format,
            granularity: DescaleGranularity,
            stream: &Arc<CudaStream>,
            q: CudaTensor<'_>,
            k: CudaTensor<'_>,
            v: CudaTensor<'_>,
            out: CudaFp8Mut<'_>,
        ) -> Result<()> {
            problem.validate()?;
            let Some(need) = crate::codec::fp8_scaled::descale_counts(problem, granularity) else {
                return Err(Error::Quantization("the device prepass computes per-tensor or per-head descales, not per-block".into()));
            };
            let p = problem;
            let input = q.dtype;
            if input == Dtype::F32 {
                return Err(Error::Dtype { tensor: TensorName::Q, expected: Dtype::F16, got: input });
            }
            for (tensor, t, elems, codes) in [
                (TensorName::Q, &q, p.q_len_elems(), out.q.len),
                (TensorName::K, &k, p.k_len_elems(), out.k.len),
                (TensorName::V, &v, p.v_len_elems(), out.v.len),
            ] {
                if t.dtype != input {
                    return Err(Error::Dtype { tensor, expected: input, got: t.dtype });
                }
                if t.len < elems {
                    return Err(Error::BufferLength { tensor, expected: elems, got: t.len });
                }
                if codes < elems {
                    return Err(Error::BufferLength { tensor, expected: elems, got: codes });
                }
            }
            for ((tensor, d), need) in [(TensorName::Q, &out.q_descale), (TensorName::K, &out.k_descale), (TensorName::V, &out.v_descale)].into_iter().zip(need) {
                check_descales(tensor, d.dtype, d.len, need)?;
            }
            let config = quattn_native::Fp8PrepassConfig::new(input, format).map_err(|e| Error::Quantization(e.to_string()))?;
            let args = quattn_native::Fp8Args::new(p.shape(), granularity);
            config.validate_args(&args).map_err(|e| Error::Quantization(e.to_string()))?;
            let ptrs = quattn_native::Fp8PrepassPtrs {
                q: q.ptr,
                k: k.ptr,
                v: v.ptr,
                q_codes: out.q.ptr,
                k_codes: out.k.ptr,
                v_codes: out.v.ptr,
                q_descale: out.q_descale.ptr,
                k_descale: out.k_descale.ptr,
                v_descale: out.v_descale.ptr,
                partial: 0,
                counter: 0,
            };
            self.cuda_backend()?.quantize_raw(config, &args, stream, &ptrs)
        }

        fn cuda_backend(&self) -> Result<&crate::backend::cuda::CudaBackend> {
            self.backend().as_any().downcast_ref::<crate::backend::cuda::CudaBackend>().ok_or_else(|| Error::WrongDevice {
                tensor: TensorName::Q,
                expected: format!("{} ({})", self.info().kind, self.info().adapter),
                got: "CUDA memory".into(),
            })
        }
    }
}

#[cfg(feature = "hip")]
pub use hip::{HipTensor, HipTensorMut};

#[cfg(feature = "hip")]
mod hip {
    use std::marker::PhantomData;

    use crate::backend::hip::{HipBackend, HipCall};
    use crate::error::{Error, Result, TensorName};
    use crate::session::{Plan, Session};
    use crate::Dtype;

    /// A caller-owned HIP device buffer quattn reads: its device address, length in elements and
    /// element type. There is no HIP bindings crate to borrow from, so it is made from a raw
    /// address only ([`HipTensor::from_raw`]).
    #[derive(Debug)]
    pub struct HipTensor<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        pub(crate) dtype: Dtype,
        _life: PhantomData<&'a ()>,
    }

    /// A caller-owned HIP device buffer quattn writes (O, LSE).
    #[derive(Debug)]
    pub struct HipTensorMut<'a> {
        pub(crate) ptr: u64,
        pub(crate) len: usize,
        pub(crate) dtype: Dtype,
        _life: PhantomData<&'a mut ()>,
    }

    impl HipTensor<'_> {
        /// Raw device memory of the session's HIP device.
        ///
        /// # Safety
        /// `ptr` must address `len` elements of `dtype` allocated on the session's device
        /// (`hipMalloc` or equivalent), valid and not written by other work until the call
        /// returns.
        pub unsafe fn from_raw(ptr: u64, len: usize, dtype: Dtype) -> Self {
            HipTensor { ptr, len, dtype, _life: PhantomData }
        }
    }

    impl HipTensorMut<'_> {
        /// Raw device memory of the session's HIP device, written by the call.
        ///
        /// # Safety
        /// As [`HipTensor::from_raw`], and nothing else may read or write it until the call
        /// returns.
        pub unsafe fn from_raw(ptr: u64, len: usize, dtype: Dtype) -> Self {
            HipTensorMut { ptr, len, dtype, _life: PhantomData }
        }
    }

    impl Session {
        /// Runs `plan` on caller-owned HIP memory of the session's device and returns when the
        /// device has finished (the call's own buffers are freed on return). Q, K, V and O are
        /// in the plan's element type ([`Plan::dtype`]); `lse`, when given, is f32
        /// `[batch, q_heads, q_len]`. An FP8 plan takes f16 Q, K and V and quantizes them on the
        /// device with the prepass (the arch's e4m3, bit-exact with the codecs) before its
        /// kernel, as [`Session::run_cuda`] does. Not run on hardware (no AMD device where this
        /// was written).
        ///
        /// Errors: [`Error::WrongDevice`] on a session that is not on a HIP device,
        /// [`Error::Dtype`] / [`Error::BufferLength`] for buffers of another element type or
        /// shorter than the problem's extents, an LSE missing when the problem asks for it;
        /// [`Error::Kernel`] for a null or misaligned address (Q, K, V 16 bytes, O 8, LSE 4) or
        /// a failing HIP call.
        pub fn run_hip(&self, plan: &Plan, q: HipTensor<'_>, k: HipTensor<'_>, v: HipTensor<'_>, o: HipTensorMut<'_>, lse: Option<HipTensorMut<'_>>) -> Result<()> {
            let hip = self.backend().as_any().downcast_ref::<HipBackend>().ok_or_else(|| Error::WrongDevice {
                tensor: TensorName::Q,
                expected: format!("{} ({})", self.info().kind, self.info().adapter),
                got: "HIP memory".into(),
            })?;
            let p = &plan.problem;
            let want = plan.dtype();
            let lse_len = p.lse_len_elems();
            let checks = [
                (TensorName::Q, q.dtype, q.len, p.q_len_elems(), want),
                (TensorName::K, k.dtype, k.len, p.k_len_elems(), want),
                (TensorName::V, v.dtype, v.len, p.v_len_elems(), want),
                (TensorName::Output, o.dtype, o.len, p.o_len_elems(), want),
            ];
            let lse_check = lse.as_ref().map(|l| (TensorName::Lse, l.dtype, l.len, lse_len, Dtype::F32));
            for (tensor, dtype, len, elems, expected) in checks.into_iter().chain(lse_check) {
                if dtype != expected {
                    return Err(Error::Dtype { tensor, expected, got: dtype });
                }
                if len < elems {
                    return Err(Error::BufferLength { tensor, expected: elems, got: len });
                }
            }
            if lse.is_none() && p.return_lse {
                return Err(Error::BufferLength { tensor: TensorName::Lse, expected: lse_len, got: 0 });
            }
            let call = HipCall { q: q.ptr, k: k.ptr, v: v.ptr, o: o.ptr, lse: lse.as_ref().map_or(0, |l| l.ptr) };
            hip.run_raw(plan, &call)
        }
    }
}
