//! The INT8 UMMA forward family (`cuda/fwd_int8_umma.cu`): attention with INT8 Q·Kᵀ on
//! Blackwell's 5th-generation tensor core (`tcgen05.mma.kind::i8` accumulating s32 in tensor
//! memory), an online softmax read from tensor memory one query row per thread, and P·V on
//! `tcgen05.mma.kind::f16` with an f32 accumulator in tensor memory. sm_100a only (B200/GB200,
//! compute capability 10.0).
//!
//! **Compiled and disassembled, not run on hardware.** No sm_100 device has run it: CI compiles
//! every variant for sm_100a with NVRTC and checks the SASS for the UMMA (`UTCIMMA`,
//! `UTCHMMA`) and tensor-memory (`LDTM`, `STTM`) instructions and for spills;
//! its arithmetic is the CPU emulation's (`tests/int8_umma_emulation.rs` runs that emulation
//! with this kernel's blocking). Descriptor encodings follow the PTX ISA and have not been
//! exercised by a device. [`Int8UmmaConfig::supported`] is true only for compute capability
//! 10.0; the facade must not dispatch here elsewhere.
//!
//! # Contract (shared with the sm_80 INT8 kernel family)
//! * Q and K are INT8 codes with the element strides of the source tensors (head dim
//!   contiguous); V and O are f16 with strides; LSE is f32 `[batch, q_heads, q_len]`.
//! * Q scales are f32 in the facade's `Int8ScaleLayout` for [`Int8UmmaConfig::blocking`]
//!   (`block_q` 128, `block_k` from [`INT8_UMMA_TILES`], 4 warps of 32 rows), per block or per
//!   warp, with `softmax_scale · log2 e` folded in (logits in log2 units). Per-thread scales
//!   follow an `mma.sync` m16 fragment that this kernel does not have: refused with a typed error.
//! * K scales f32 `[batch, kv_heads, ceil(kv_len / block_k)]`.
//! * An optional `lse_shift` f32 `[batch, q_heads, q_len]` (null pointer: none) is added to the
//!   LSE (K smoothing).
//! * Bottom-right causal mask, ragged lengths, GQA, head dims 64 and 128.

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_INT8_UMMA};
use crate::error::{NativeError, Result};
use crate::hmma::check_strides;
use crate::int8::Int8Args;

const KERNEL: &str = "fwd_int8_umma";

/// Query rows per CTA: the UMMA M and the 128 TMEM lanes.
pub const BLOCK_Q: u32 = 128;
/// Softmax warps per CTA: warp `w` owns TMEM lanes (= query rows) `32w .. 32w + 31`.
pub const WARPS: u32 = 4;

// Q-scale granularity: `PerWarp` is 32 consecutive rows, exactly one TMEM lane quarter;
// `PerThread` (a lane quad of an m16 `mma.sync` fragment) has no counterpart and is refused.
use quattn_core::{Int8Blocking, Int8Granularity, PvAccum};

/// One row of the tile table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8UmmaTile {
    pub head_dim: u32,
    /// Keys per KV tile: the N of the Q·Kᵀ UMMA, the K-scale block, the online-softmax step.
    pub block_k: u32,
}

/// Tile per head dim, and why. 128 keys: the widest S a thread can hold in registers (one query
/// row = 128 f32 scores next to the packing and TMEM-load temporaries: 254-255 registers, no
/// spill on sm_100a), the fewest online-softmax steps, and S (128 columns) + O (64 or 128) fit
/// one 256-column TMEM allocation, so two CTAs can share an SM's 512 columns. Not measured:
/// there is no sm_100 device to measure on.
pub const INT8_UMMA_TILES: [Int8UmmaTile; 2] =
    [Int8UmmaTile { head_dim: 64, block_k: 128 }, Int8UmmaTile { head_dim: 128, block_k: 128 }];

/// One compiled variant of the family: everything that changes the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8UmmaConfig {
    pub head_dim: u32,
    pub granularity: Int8Granularity,
    /// P·V accumulation: only [`PvAccum::F32`] (the TMEM accumulator of `kind::f16` is f32).
    pub pv: PvAccum,
}

impl Int8UmmaConfig {
    /// Head dims with a tile entry; others are refused so the facade can fall back.
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// tcgen05 exists only on the `a` target of compute capability 10.0.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm100a];

    /// Validated constructor.
    pub fn new(head_dim: usize, granularity: Int8Granularity, pv: PvAccum) -> Result<Self> {
        let cfg = Int8UmmaConfig { head_dim: head_dim as u32, granularity, pv };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Head dim in the table, per-block or per-warp Q scales, f32 P·V accumulation.
    pub fn validate(&self) -> Result<()> {
        self.tile()?;
        let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
        if self.granularity == Int8Granularity::PerThread {
            return bad(format!(
                "per-thread Q scales follow a 16-row mma.sync fragment; this kernel's warps own {} \
                 rows each (one TMEM lane quarter), use per-block or per-warp scales",
                BLOCK_Q / WARPS
            ));
        }
        if self.pv != PvAccum::F32 {
            return bad(format!("P·V accumulates in f32 tensor memory only, not {:?}", self.pv));
        }
        Ok(())
    }

    /// The tile of this head dim from [`INT8_UMMA_TILES`].
    pub fn tile(&self) -> Result<Int8UmmaTile> {
        INT8_UMMA_TILES.iter().copied().find(|t| t.head_dim == self.head_dim).ok_or(
            NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: Self::HEAD_DIMS,
            },
        )
    }

    /// The blocking the Q and K scales must be laid out for.
    pub fn blocking(&self) -> Result<Int8Blocking> {
        Ok(Int8Blocking { block_q: BLOCK_Q as usize, block_k: self.tile()?.block_k as usize, warps: WARPS as usize })
    }

    /// `fwd_int8_umma_{block|warp|thread}_d{hd}`, e.g. `fwd_int8_umma_block_d128`.
    pub fn name(&self) -> String {
        format!("{KERNEL}_{}_d{}", self.granularity.tag(), self.head_dim)
    }

    /// Every variant the report and tests compile.
    pub fn all() -> Vec<Int8UmmaConfig> {
        let mut v = Vec::new();
        for hd in [64, 128] {
            for g in [Int8Granularity::PerBlock, Int8Granularity::PerWarp] {
                v.push(Int8UmmaConfig { head_dim: hd, granularity: g, pv: PvAccum::F32 });
            }
        }
        v
    }

    /// The `-D` defines the kernel reads (see the header of `fwd_int8_umma.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("HEAD_DIM", self.head_dim),
            d("BLOCK_K", self.tile()?.block_k),
            d("Q_SCALE_WARP", (self.granularity == Int8Granularity::PerWarp) as u32),
        ])
    }

    /// The compile request for `arch` (only [`Arch::Sm100a`] exists).
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !Self::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("tcgen05 needs sm_100a, not {arch}"),
            });
        }
        Ok(CompileRequest { kernel: self.name(), source: &FWD_INT8_UMMA, arch, defines: self.defines()? })
    }

    /// Dynamic shared memory, mirror of `cfg::SMEM_BYTES`: the int8 Q tile, two stages of an
    /// int8 K and an f16 V tile, the f16 P tile, two mbarriers and the TMEM address.
    pub fn smem_bytes(&self) -> Result<u32> {
        let (d, bk) = (self.head_dim, self.tile()?.block_k);
        Ok(BLOCK_Q * d + 2 * bk * d + 2 * bk * d * 2 + BLOCK_Q * bk * 2 + 32)
    }

    /// SASS opcodes that must appear, as cuobjdump 13.x spells them for sm_100a: the s8 and f16
    /// UMMAs (`tcgen05.mma.kind::i8` / `kind::f16`), the TMEM loads and stores of 32 columns
    /// (`tcgen05.ld/st.32x32b.x32`) and the commit to an mbarrier (`tcgen05.commit`).
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        vec!["UTCIMMA", "UTCHMMA", "LDTM.x32", "STTM.x32", "UTCBAR"]
    }

    /// True only for devices that run sm_100a cubins: compute capability 10.0 (the `a` target
    /// rule of [`Arch::for_compute_capability`]: arch-specific cubins run on their exact chip).
    pub fn supported(cc: (u32, u32)) -> bool {
        Self::target_for(cc).is_some()
    }

    /// [`Arch::Sm100a`] for compute capability 10.0, else `None`.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }
}

/// Shapes and strides of one launch: the IMMA family's [`Int8Args`] (the softmax scale is
/// folded into the Q scales). Its checks against this family's config are
/// [`Int8UmmaConfig::validate_args`] and the other `Int8UmmaConfig` methods taking `args`.
pub type Int8UmmaArgs = Int8Args;

/// Mirror of `UmmaParams` in `fwd_int8_umma.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8UmmaParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub lse_shift: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_seq_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_seq_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_seq_stride: i64,
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_group: i32,
    pub q_blocks: i32,
    pub k_blocks: i32,
    pub causal: i32,
    pub pad_: i32,
}

/// Grid, block and shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8UmmaLaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

/// Names of the pointers of [`Int8UmmaKernel::launch_raw`], in order.
pub const POINTER_NAMES: [&str; 8] = ["q", "k", "v", "o", "lse", "q_scale", "k_scale", "lse_shift"];

impl Int8UmmaConfig {
    /// `ceil(q_len / 128)`.
    pub fn q_blocks(&self, args: &Int8Args) -> usize {
        args.shape.q_len.div_ceil(BLOCK_Q as usize)
    }

    /// `ceil(kv_len / block_k)`.
    pub fn k_blocks(&self, args: &Int8Args) -> Result<usize> {
        Ok(args.shape.kv_len.div_ceil(self.tile()?.block_k as usize))
    }

    /// Element counts of Q, K, V, O, LSE, Q scales, K scales and `lse_shift` (0 when absent),
    /// in the order of [`POINTER_NAMES`].
    pub fn required_lens(&self, args: &Int8Args) -> Result<[usize; 8]> {
        // The spans of the shape's strides; `usize::MAX` where one overflows (no buffer passes).
        let [q, k, v, o] = args.shape.extents().unwrap_or([usize::MAX; 4]);
        let rows = args.shape.batch * args.shape.q_heads * args.shape.q_len;
        let q_scales = args.shape.batch
            * args.shape.q_heads
            * self.q_blocks(args)
            * match self.granularity {
                Int8Granularity::PerWarp => WARPS as usize,
                _ => 1,
            };
        Ok([
            q,
            k,
            v,
            o,
            rows,
            q_scales,
            args.shape.batch * args.shape.kv_heads * self.k_blocks(args)?,
            if args.lse_shift { rows } else { 0 },
        ])
    }

    /// Validates everything that does not need device pointers.
    pub fn validate_args(&self, args: &Int8Args) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let s = &args.shape;
        if s.head_dim != self.head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!(
                "head dims {} / {} (V) for a kernel of head dim {}",
                s.head_dim, s.v_head_dim, self.head_dim
            ));
        }
        if args.shape.batch == 0 || args.shape.q_heads == 0 || args.shape.kv_heads == 0 || args.shape.q_len == 0 {
            return bad(format!("empty problem: {args:?}"));
        }
        if !args.shape.q_heads.is_multiple_of(args.shape.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", args.shape.q_heads, args.shape.kv_heads));
        }
        if args.shape.q_len > i32::MAX as usize || args.shape.kv_len > i32::MAX as usize {
            return bad("sequence length exceeds i32".into());
        }
        if self.q_blocks(args) > i32::MAX as usize || args.shape.q_heads > 65535 || args.shape.batch > 65535 {
            return bad(format!("batch {} / heads {} exceed the grid limit 65535", args.shape.batch, args.shape.q_heads));
        }
        // cp.async copies and the O stores move 16 bytes: 16 int8 codes, 8 f16 elements.
        for (name, s, unit) in [("q", &args.shape.q, 16), ("k", &args.shape.k, 16), ("v", &args.shape.v, 8), ("o", &args.shape.o, 8)] {
            check_strides(name, s, unit)?;
        }
        Ok(())
    }

    /// Kernel parameters for device pointers in the order of [`POINTER_NAMES`] (strides as
    /// checked by [`Self::validate_args`]: below 2^63).
    pub fn params(&self, args: &Int8Args, ptrs: [u64; 8]) -> Result<Int8UmmaParams> {
        let [q, k, v, o] = [args.shape.q, args.shape.k, args.shape.v, args.shape.o].map(|s| s.to_array().map(|x| x as i64));
        Ok(Int8UmmaParams {
            q: ptrs[0],
            k: ptrs[1],
            v: ptrs[2],
            o: ptrs[3],
            lse: ptrs[4],
            q_scale: ptrs[5],
            k_scale: ptrs[6],
            lse_shift: if args.lse_shift { ptrs[7] } else { 0 },
            q_batch_stride: q[0],
            q_head_stride: q[1],
            q_seq_stride: q[2],
            k_batch_stride: k[0],
            k_head_stride: k[1],
            k_seq_stride: k[2],
            v_batch_stride: v[0],
            v_head_stride: v[1],
            v_seq_stride: v[2],
            o_batch_stride: o[0],
            o_head_stride: o[1],
            o_seq_stride: o[2],
            q_len: args.shape.q_len as i32,
            kv_len: args.shape.kv_len as i32,
            q_heads: args.shape.q_heads as i32,
            kv_group: (args.shape.q_heads / args.shape.kv_heads) as i32,
            q_blocks: self.q_blocks(args) as i32,
            k_blocks: self.k_blocks(args)? as i32,
            causal: args.shape.causal as i32,
            pad_: 0,
        })
    }

    /// Grid `(query blocks, q_heads, batch)`, 128 threads and 128 query rows per CTA.
    pub fn launch_shape(&self, args: &Int8Args) -> Result<Int8UmmaLaunchShape> {
        Ok(Int8UmmaLaunchShape {
            grid: (self.q_blocks(args) as u32, args.shape.q_heads as u32, args.shape.batch as u32),
            block: (32 * WARPS, 1, 1),
            smem_bytes: self.smem_bytes()?,
        })
    }

    /// Checks device pointers: non-null wherever the kernel reads or writes something (a
    /// tensor of [`Self::required_lens`] 0, e.g. K with `kv_len` 0 or an absent `lse_shift`,
    /// may be null), 16-byte aligned where the kernel moves 16 bytes, 4-byte aligned f32s.
    fn check_pointers(&self, args: &Int8Args, ptrs: &[u64; 8]) -> Result<()> {
        let lens = self.required_lens(args)?;
        for (i, ((&p, name), len)) in ptrs.iter().zip(POINTER_NAMES).zip(lens).enumerate() {
            if len == 0 {
                continue;
            }
            let align = if i < 4 { 16 } else { 4 };
            if p == 0 || p % align != 0 {
                return Err(NativeError::InvalidArgs(format!(
                    "{name} pointer {p:#x} must be non-null and {align}-byte aligned"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
pub use launch::Int8UmmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{
        CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
        PushKernelArg,
    };

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for Int8UmmaParams {}

    /// One INT8 UMMA variant loaded into a CUDA context, ready to launch. Only a compute
    /// capability 10.0 context can load it (see the module docs: never run on hardware yet).
    #[derive(Debug)]
    pub struct Int8UmmaKernel {
        config: Int8UmmaConfig,
        function: CudaFunction,
        compiled: Arc<CompiledKernel>,
    }

    impl Int8UmmaKernel {
        /// Compiles (or fetches from the global cache) `config` for sm_100a and loads it;
        /// [`NativeError::UnsupportedArch`] on any device other than compute capability 10.0.
        pub fn load(ctx: &Arc<CudaContext>, config: Int8UmmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Int8UmmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm100a, Int8UmmaConfig::target_for)?;
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes()?)?;
            Ok(Int8UmmaKernel { config, function, compiled })
        }

        pub fn config(&self) -> &Int8UmmaConfig {
            &self.config
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Launches on `stream` with typed buffers. `H` is the 2-byte f16 element type of V
        /// and O (`half::f16`, `u16`, ...). Shapes, strides, buffer lengths and alignment are
        /// checked before anything is enqueued; `lse_shift` must be `Some` iff
        /// `args.lse_shift`.
        #[allow(clippy::too_many_arguments)]
        pub fn launch<H, Q, K, V, O, L, QS, KS, SH>(
            &self,
            stream: &Arc<CudaStream>,
            args: &Int8UmmaArgs,
            q: &Q,
            k: &K,
            v: &V,
            o: &mut O,
            lse: &mut L,
            q_scale: &QS,
            k_scale: &KS,
            lse_shift: Option<&SH>,
        ) -> Result<()>
        where
            Q: DevicePtr<i8>,
            K: DevicePtr<i8>,
            V: DevicePtr<H>,
            O: DevicePtrMut<H>,
            L: DevicePtrMut<f32>,
            QS: DevicePtr<f32>,
            KS: DevicePtr<f32>,
            SH: DevicePtr<f32>,
        {
            if std::mem::size_of::<H>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "V/O element type must be 2 bytes (f16), got {}",
                    std::mem::size_of::<H>()
                )));
            }
            if lse_shift.is_some() != args.lse_shift {
                return Err(NativeError::InvalidArgs(format!(
                    "args.lse_shift is {} but an lse_shift buffer was {}",
                    args.lse_shift,
                    if lse_shift.is_some() { "given" } else { "not given" }
                )));
            }
            self.config.validate_args(args)?;
            let need = self.config.required_lens(args)?;
            let have = [
                q.len(),
                k.len(),
                v.len(),
                o.len(),
                lse.len(),
                q_scale.len(),
                k_scale.len(),
                lse_shift.map(|s| s.len()).unwrap_or(0),
            ];
            for ((name, n), h) in POINTER_NAMES.iter().zip(need).zip(have) {
                if h < n {
                    return Err(NativeError::InvalidArgs(format!("{name} has {h} elements, needs {n}")));
                }
            }
            let (qp, _gq) = q.device_ptr(stream);
            let (kp, _gk) = k.device_ptr(stream);
            let (vp, _gv) = v.device_ptr(stream);
            let (op, _go) = o.device_ptr_mut(stream);
            let (lp, _gl) = lse.device_ptr_mut(stream);
            let (qsp, _gqs) = q_scale.device_ptr(stream);
            let (ksp, _gks) = k_scale.device_ptr(stream);
            let shift = lse_shift.map(|s| s.device_ptr(stream));
            let shp = shift.as_ref().map(|(p, _)| *p).unwrap_or(0);
            // SAFETY: lengths were checked against every offset the kernel touches.
            unsafe { self.launch_raw(stream, args, [qp, kp, vp, op, lp, qsp, ksp, shp]) }
        }

        /// Launches with raw device addresses in the order of [`POINTER_NAMES`]
        /// (`lse_shift` ignored unless `args.lse_shift`).
        ///
        /// # Safety
        /// Each pointer must address device memory of at least
        /// [`Int8UmmaConfig::required_lens`] elements (i8 Q/K, 2-byte V/O, f32 otherwise), valid
        /// until the kernel finishes on `stream`.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &Int8UmmaArgs, ptrs: [u64; 8]) -> Result<()> {
            self.config.validate_args(args)?;
            self.config.check_pointers(args, &ptrs)?;
            let shape = self.config.launch_shape(args)?;
            let params = self.config.params(args, ptrs)?;
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::{AttentionShape, Layout, Strides};

    fn cfg(hd: usize, g: Int8Granularity) -> Int8UmmaConfig {
        Int8UmmaConfig::new(hd, g, PvAccum::F32).unwrap()
    }

    #[test]
    fn unsupported_configs_are_typed() {
        let e = Int8UmmaConfig::new(96, Int8Granularity::PerBlock, PvAccum::F32).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedHeadDim { head_dim: 96, .. }), "{e}");
        let e = Int8UmmaConfig::new(128, Int8Granularity::PerThread, PvAccum::F32).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedConfig { .. }), "{e}");
        assert!(e.to_string().contains("per-thread"), "{e}");
        let e = Int8UmmaConfig::new(64, Int8Granularity::PerWarp, PvAccum::F16PerTile).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedConfig { .. }), "{e}");
        let c = cfg(64, Int8Granularity::PerBlock);
        assert!(matches!(c.request(Arch::Sm90a), Err(NativeError::UnsupportedConfig { .. })));
        assert!(c.request(Arch::Sm100a).is_ok());
    }

    #[test]
    fn dispatch_only_on_compute_capability_10_0() {
        assert!(Int8UmmaConfig::supported((10, 0)));
        for cc in [(8, 0), (8, 9), (9, 0), (10, 3), (11, 0), (12, 0), (12, 1)] {
            assert!(!Int8UmmaConfig::supported(cc), "{cc:?}");
        }
        assert_eq!(Int8UmmaConfig::target_for((10, 0)), Some(Arch::Sm100a));
    }

    #[test]
    fn names_defines_blocking_and_smem() {
        let mut names: Vec<String> = Int8UmmaConfig::all().iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), 4);
        assert!(names.contains(&"fwd_int8_umma_block_d128".to_string()));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4);
        let c = cfg(128, Int8Granularity::PerWarp);
        assert_eq!(c.blocking().unwrap(), Int8Blocking { block_q: 128, block_k: 128, warps: 4 });
        let d = c.defines().unwrap();
        for (k, v) in [("HEAD_DIM", "128"), ("BLOCK_K", "128"), ("Q_SCALE_WARP", "1")] {
            assert!(d.contains(&(k.into(), v.into())), "{d:?}");
        }
        // Q 16 KiB + K 2 x 16 KiB + V 2 x 32 KiB + P 32 KiB + barriers: one CTA per SM at hd128.
        assert_eq!(c.smem_bytes().unwrap(), 16384 + 32768 + 65536 + 32768 + 32);
        assert_eq!(cfg(64, Int8Granularity::PerBlock).smem_bytes().unwrap(), 8192 + 16384 + 32768 + 32768 + 32);
        assert!(c.smem_bytes().unwrap() <= 227 * 1024);
    }

    #[test]
    fn params_layout_matches_the_kernel_struct() {
        // 8 pointers + 12 strides (8 bytes each), then 8 four-byte fields.
        assert_eq!(std::mem::size_of::<Int8UmmaParams>(), 20 * 8 + 8 * 4);
        assert_eq!(std::mem::align_of::<Int8UmmaParams>(), 8);
        let p = Int8UmmaParams::default();
        let base = &p as *const _ as usize;
        let at = |f: *const u8| f as usize - base;
        assert_eq!(at(&p.lse_shift as *const _ as *const u8), 7 * 8);
        assert_eq!(at(&p.q_batch_stride as *const _ as *const u8), 8 * 8);
        assert_eq!(at(&p.o_seq_stride as *const _ as *const u8), 19 * 8);
        assert_eq!(at(&p.q_len as *const _ as *const u8), 160);
        assert_eq!(at(&p.q_blocks as *const _ as *const u8), 176);
        assert_eq!(at(&p.causal as *const _ as *const u8), 184);
    }

    fn args() -> Int8UmmaArgs {
        let mut shape = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 300, 1000, 128, true);
        shape.o = Strides::new(Layout::Bshd, 8, 300, 128);
        Int8UmmaArgs { shape, lse_shift: false }
    }

    #[test]
    fn args_validation_lengths_and_params() {
        let c = cfg(128, Int8Granularity::PerWarp);
        let mut a = args();
        c.validate_args(&a).unwrap();
        let shape = c.launch_shape(&a).unwrap();
        assert_eq!(shape.grid, (3, 8, 2));
        assert_eq!(shape.block, (128, 1, 1));
        let lens = c.required_lens(&a).unwrap();
        assert_eq!(lens[0], 2 * 8 * 300 * 128);
        assert_eq!(lens[4], 2 * 8 * 300);
        // Per-warp Q scales: [batch, q_heads, ceil(300/128) = 3, 4 warps]; K: ceil(1000/128) = 8.
        assert_eq!(lens[5], 2 * 8 * 3 * 4);
        assert_eq!(lens[6], 2 * 2 * 8);
        assert_eq!(lens[7], 0);
        let p = c.params(&a, [16, 32, 48, 64, 4, 8, 12, 20]).unwrap();
        assert_eq!((p.kv_group, p.q_blocks, p.k_blocks, p.causal, p.lse_shift), (4, 3, 8, 1, 0));
        a.lse_shift = true;
        assert_eq!(c.required_lens(&a).unwrap()[7], 2 * 8 * 300);
        assert_eq!(c.params(&a, [16, 32, 48, 64, 4, 8, 12, 20]).unwrap().lse_shift, 20);
        // Null or misaligned pointers are refused before a launch.
        assert!(c.check_pointers(&a, &[16, 32, 48, 64, 4, 8, 12, 20]).is_ok());
        assert!(c.check_pointers(&a, &[16, 32, 48, 64, 4, 8, 12, 0]).is_err());
        assert!(c.check_pointers(&a, &[16, 40, 48, 64, 4, 8, 12, 20]).is_err());
        assert!(c.check_pointers(&a, &[16, 32, 48, 64, 4, 0, 12, 20]).is_err());
        a.lse_shift = false;
        assert!(c.check_pointers(&a, &[16, 32, 48, 64, 4, 8, 12, 0]).is_ok());
        // No keys: K, V and the K scales are never touched and may be null.
        a.shape.kv_len = 0;
        assert!(c.check_pointers(&a, &[16, 0, 0, 64, 4, 8, 0, 0]).is_ok());
        a.shape.kv_len = 1000;
        // Int8 rows move in 16-byte chunks: a Q sequence stride of 8 codes is refused.
        a.shape.q.seq = 136;
        assert!(matches!(c.validate_args(&a), Err(NativeError::InvalidArgs(_))));
        a.shape.q.seq = 128;
        a.shape.kv_heads = 3;
        assert!(c.validate_args(&a).is_err());
        a.shape.kv_heads = 2;
        a.shape.q_len = 0;
        assert!(c.validate_args(&a).is_err());
    }
}
