//! The FP8 quantization prepass of the native FP8 families (`cuda/fp8_prepass.cu`): Q, K and V
//! in f16 or bf16 to e4m3 or e5m2 codes with f32 descales, per tensor or per (batch, head), on
//! the stream the attention kernel then runs on (no host synchronization between them).
//!
//! The numerics are the CPU codec's (`quattn::codec::fp8_scaled`), bit for bit: `descale = amax
//! / max_finite` (1 when the group is all zeros), `code = encode(x / descale)` with the quotient
//! rounded to f32 and then to the format (ties to even, saturating). Codes keep the inputs'
//! strides; descales are `[1]` per tensor or `[batch, heads]` per head (Q per query head, K and
//! V per KV head), the layout the FP8 attention kernels read. Elements that are NaN do not enter
//! the amax and become NaN codes; an infinite element makes its group's descale infinite.
//!
//! Two launches per slab of the tile sequence (see the kernel's header): the amax pass, whose
//! last tile per group writes the descale, then the quantize pass. A call is split into slabs
//! of whole descale groups of at most [`Fp8Prepass::slab_bytes`] input bytes (half the L2 by
//! default), so the quantize pass reads its input from L2: the DRAM traffic stays near one read
//! of the input and one write of the codes. A group larger than a slab (per-tensor descales of
//! a large tensor) is one slab, read from DRAM twice.
//!
//! The one-read pass ([`Fp8PrepassPass::OnePass`]) does both in one persistent launch that
//! holds each tile on chip while its group's max is gathered: the input is read from DRAM once.
//! It needs every tile of a group co-resident, so it runs only when no group has more tiles
//! than the device keeps CTAs resident ([`Fp8PrepassConfig::onepass_ctas`]); [`Fp8PrepassPath::Auto`]
//! takes it then and the two passes otherwise.

use quattn_core::{AttentionShape, DescaleGranularity, Dtype, Fp8Format, Strides};

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelSource};
use crate::error::{NativeError, Result};
use crate::fp8::Fp8Args;
use crate::hmma::span;
use crate::report::KernelVariant;

const KERNEL: &str = "fp8_prepass";

/// The prepass source (two passes, `-D PASS`).
pub static FP8_PREPASS: KernelSource =
    KernelSource { file: "fp8_prepass.cu", entry: "fp8_prepass", text: include_str!("../cuda/fp8_prepass.cu") };

/// Elements per tile (`cfg::TILE_PIECES * 8`): whole rows of one (batch, head).
pub const FP8_PREPASS_TILE: usize = 8192;
/// Threads per CTA of both passes.
const THREADS: u32 = 256;

/// One prepass: what changes its generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8PrepassConfig {
    /// Element type of Q, K and V (f16 or bf16).
    pub input: Dtype,
    pub format: Fp8Format,
}

/// The kernels of a prepass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8PrepassPass {
    /// Partial maxima per tile; the last tile of a group writes its descale.
    Amax,
    /// The codes.
    Quantize,
    /// Amax, descales and codes in one persistent launch that reads the input once.
    OnePass,
}

/// Which kernels a launch runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8PrepassPath {
    /// The one-read pass where it applies ([`Fp8PrepassConfig::onepass_ctas`]), else the amax
    /// and quantize passes.
    #[default]
    Auto,
    /// The amax and quantize passes, per slab.
    TwoPass,
    /// The one-read pass; an error where it does not apply.
    OnePass,
}

/// One compiled kernel of a prepass (the registry's and the compile report's unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8PrepassVariant {
    pub config: Fp8PrepassConfig,
    pub pass: Fp8PrepassPass,
}

/// Element counts of every buffer of a prepass (inputs and codes in elements = code bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8PrepassLens {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub q_descale: usize,
    /// K and V each.
    pub kv_descale: usize,
    /// f32 scratch, one per tile.
    pub partial: usize,
    /// u32 scratch: two per descale group (arrivals, maxima) and two for the one-read pass's
    /// work counter; zero before the first launch, left zero by each.
    pub counter: usize,
}

/// Device addresses of one prepass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8PrepassPtrs {
    /// Inputs, the config's element type.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// Codes (written), the inputs' strides.
    pub q_codes: u64,
    pub k_codes: u64,
    pub v_codes: u64,
    /// f32 descales (written).
    pub q_descale: u64,
    pub k_descale: u64,
    pub v_descale: u64,
    /// f32 `[tiles]` scratch.
    pub partial: u64,
    /// u32 `[2 groups + 2]` scratch, zero (the prepass leaves it zero).
    pub counter: u64,
}

/// Mirror of `Fp8PrepassTensor` in `fp8_prepass.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8PrepassTensor {
    pub x: u64,
    pub codes: u64,
    pub descale: u64,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub seq_stride: i64,
    pub batch: i32,
    pub heads: i32,
    pub len: i32,
    pub tiles_per_head: i32,
    pub tile_begin: i32,
    pub group_begin: i32,
}

/// Mirror of `Fp8PrepassParams` in `fp8_prepass.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8PrepassParams {
    pub t: [Fp8PrepassTensor; 3],
    pub partial: u64,
    pub counter: u64,
    pub tile_begin: i32,
    pub tile_end: i32,
    pub piece_shift: i32,
    pub per_head: i32,
}

/// A range of the tile sequence made of whole descale groups: one amax launch and one quantize
/// launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slab {
    pub tile_begin: usize,
    pub tile_end: usize,
    /// Input bytes the slab reads.
    pub bytes: usize,
}

/// One tensor of the sequence: (heads, len, strides) and the tiles per head.
#[derive(Clone, Copy, Debug)]
struct Operand {
    heads: usize,
    len: usize,
    strides: Strides,
    tiles_per_head: usize,
}

impl Fp8PrepassConfig {
    /// `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` needs sm_89; plain CUDA otherwise: one build per
    /// native target from Ada on.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];

    pub fn new(input: Dtype, format: Fp8Format) -> Result<Self> {
        let c = Fp8PrepassConfig { input, format };
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        if self.input == Dtype::F32 {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: "inputs are f16 or bf16".into() });
        }
        Ok(())
    }

    /// Every config: f16 and bf16 inputs to e4m3 and e5m2.
    pub fn all() -> Vec<Fp8PrepassConfig> {
        let mut v = Vec::new();
        for input in [Dtype::F16, Dtype::Bf16] {
            for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                v.push(Fp8PrepassConfig { input, format });
            }
        }
        v
    }

    /// Every compiled kernel of the config: the two passes, then the one-read pass.
    pub fn passes(&self) -> [Fp8PrepassPass; 3] {
        [Fp8PrepassPass::Amax, Fp8PrepassPass::Quantize, Fp8PrepassPass::OnePass]
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// Largest finite magnitude of the format (the codec's `max_finite`).
    pub fn max_finite(&self) -> f32 {
        match self.format {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    fn operands(&self, s: &AttentionShape) -> [Operand; 3] {
        let rows = FP8_PREPASS_TILE / s.head_dim.max(1);
        let op = |heads, len: usize, strides| Operand { heads, len, strides, tiles_per_head: len.div_ceil(rows.max(1)) };
        [op(s.q_heads, s.q_len, s.q), op(s.kv_heads, s.kv_len, s.k), op(s.kv_heads, s.kv_len, s.v)]
    }

    /// Everything about `args` that does not need device pointers: a head dim of 8 to 8192 that
    /// is a power of two (whole rows per tile), V's head dim equal to it, per-tensor or per-head
    /// descales, no empty tensor, strides in whole 16-byte pieces of the input, a tile sequence
    /// and a grid that fit i32.
    pub fn validate_args(&self, args: &Fp8Args) -> Result<()> {
        self.validate()?;
        let s = &args.shape;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let d = s.head_dim;
        if !(8..=FP8_PREPASS_TILE).contains(&d) || !d.is_power_of_two() || s.v_head_dim != d {
            return bad(format!("head dims {d} / {} (V): the prepass takes one power of two from 8 to {FP8_PREPASS_TILE}", s.v_head_dim));
        }
        if args.descale == DescaleGranularity::PerBlock {
            return bad("per-block descales are not computed by the native prepass (per tensor or per head)".into());
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 || s.kv_len == 0 {
            return bad(format!("empty prepass: batch {}, heads {}/{}, lengths {}/{}", s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len));
        }
        for (name, st) in [("q", &s.q), ("k", &s.k), ("v", &s.v)] {
            crate::hmma::check_strides(name, st, 8)?;
        }
        let ops = self.operands(s);
        let tiles: usize = ops.iter().map(|o| s.batch * o.heads * o.tiles_per_head).sum();
        if tiles > i32::MAX as usize || s.batch > i32::MAX as usize || ops.iter().any(|o| o.heads > i32::MAX as usize || o.len > i32::MAX as usize) {
            return bad(format!("prepass of {tiles} tiles too large for one launch"));
        }
        Ok(())
    }

    /// Element counts of every buffer of a prepass over `args`.
    pub fn required_lens(&self, args: &Fp8Args) -> Fp8PrepassLens {
        let s = &args.shape;
        let ops = self.operands(s);
        let (q_descale, kv_descale) = args.descale_counts();
        let groups = self.groups(args);
        let elems = |o: &Operand| span(&o.strides, s.batch, o.heads, o.len, s.head_dim);
        Fp8PrepassLens {
            q: elems(&ops[0]),
            k: elems(&ops[1]),
            v: elems(&ops[2]),
            q_descale,
            kv_descale,
            partial: ops.iter().map(|o| s.batch * o.heads * o.tiles_per_head).sum(),
            counter: 2 * groups + 2,
        }
    }

    /// Descale groups of the tile sequence (one arrival counter each).
    fn groups(&self, args: &Fp8Args) -> usize {
        let (q_descale, kv_descale) = args.descale_counts();
        match args.descale {
            DescaleGranularity::PerTensor => 3,
            _ => q_descale + 2 * kv_descale,
        }
    }

    /// Tiles of the largest descale group.
    pub fn max_group_tiles(&self, args: &Fp8Args) -> usize {
        let s = &args.shape;
        let per_tensor = args.descale == DescaleGranularity::PerTensor;
        self.operands(s).iter().map(|o| if per_tensor { s.batch * o.heads * o.tiles_per_head } else { o.tiles_per_head }).max().unwrap_or(0)
    }

    /// The grid of the one-read pass over `args` on a device that keeps `resident` CTAs of it
    /// co-resident: one CTA per tile up to `resident`, or `None` where a group has more tiles
    /// than `resident` (its tiles could wait on one that never gets a CTA).
    pub fn onepass_ctas(&self, args: &Fp8Args, resident: usize) -> Option<usize> {
        let tiles = self.required_lens(args).partial;
        (resident > 0 && self.max_group_tiles(args) <= resident).then(|| tiles.min(resident))
    }

    /// Bytes the prepass moves at best: each input element read once, each code written once,
    /// the descales written (the model its bandwidth is measured against).
    pub fn model_bytes(&self, args: &Fp8Args) -> usize {
        let s = &args.shape;
        let elems = s.batch * (s.q_heads * s.q_len + 2 * s.kv_heads * s.kv_len) * s.head_dim;
        let (q_descale, kv_descale) = args.descale_counts();
        elems * (self.input.size_bytes() + 1) + 4 * (q_descale + 2 * kv_descale)
    }

    /// The tile sequence cut into slabs of whole descale groups of at most `budget` input bytes
    /// each (a group larger than the budget is a slab of its own); `None`: one slab.
    pub fn slabs(&self, args: &Fp8Args, budget: Option<usize>) -> Vec<Slab> {
        let s = &args.shape;
        let es = self.input.size_bytes();
        let mut groups: Vec<(usize, usize)> = Vec::new(); // (tiles, bytes)
        for o in self.operands(s) {
            let head_bytes = o.len * s.head_dim * es;
            match args.descale {
                DescaleGranularity::PerTensor => groups.push((s.batch * o.heads * o.tiles_per_head, s.batch * o.heads * head_bytes)),
                _ => groups.extend(std::iter::repeat_n((o.tiles_per_head, head_bytes), s.batch * o.heads)),
            }
        }
        let mut out: Vec<Slab> = Vec::new();
        let mut tile = 0;
        for (tiles, bytes) in groups {
            match out.last_mut() {
                Some(last) if budget.is_none_or(|b| last.bytes + bytes <= b) => {
                    last.tile_end += tiles;
                    last.bytes += bytes;
                }
                _ => out.push(Slab { tile_begin: tile, tile_end: tile + tiles, bytes }),
            }
            tile += tiles;
        }
        out
    }

    /// The kernels' parameters for one slab (strides as checked by [`Self::validate_args`]).
    pub fn params(&self, args: &Fp8Args, ptrs: &Fp8PrepassPtrs, slab: Slab) -> Fp8PrepassParams {
        let s = &args.shape;
        let per_head = args.descale != DescaleGranularity::PerTensor;
        let io = [(ptrs.q, ptrs.q_codes, ptrs.q_descale), (ptrs.k, ptrs.k_codes, ptrs.k_descale), (ptrs.v, ptrs.v_codes, ptrs.v_descale)];
        let mut t = [Fp8PrepassTensor::default(); 3];
        let (mut tile, mut group) = (0usize, 0usize);
        for (i, (o, (x, codes, descale))) in self.operands(s).into_iter().zip(io).enumerate() {
            let [batch_stride, head_stride, seq_stride] = o.strides.to_array().map(|v| v as i64);
            t[i] = Fp8PrepassTensor {
                x,
                codes,
                descale,
                batch_stride,
                head_stride,
                seq_stride,
                batch: s.batch as i32,
                heads: o.heads as i32,
                len: o.len as i32,
                tiles_per_head: o.tiles_per_head as i32,
                tile_begin: tile as i32,
                group_begin: group as i32,
            };
            tile += s.batch * o.heads * o.tiles_per_head;
            group += if per_head { s.batch * o.heads } else { 1 };
        }
        Fp8PrepassParams {
            t,
            partial: ptrs.partial,
            counter: ptrs.counter,
            tile_begin: slab.tile_begin as i32,
            tile_end: slab.tile_end as i32,
            piece_shift: (s.head_dim / 8).trailing_zeros() as i32,
            per_head: per_head as i32,
        }
    }

    /// Every address non-null and aligned: inputs 16 bytes, codes 8 (one 8-byte store per
    /// piece), f32 and u32 buffers 4.
    pub fn validate_ptrs(&self, p: &Fp8PrepassPtrs) -> Result<()> {
        let need = [
            ("q", p.q, 16),
            ("k", p.k, 16),
            ("v", p.v, 16),
            ("q_codes", p.q_codes, 8),
            ("k_codes", p.k_codes, 8),
            ("v_codes", p.v_codes, 8),
            ("q_descale", p.q_descale, 4),
            ("k_descale", p.k_descale, 4),
            ("v_descale", p.v_descale, 4),
            ("partial", p.partial, 4),
            ("counter", p.counter, 4),
        ];
        for (what, ptr, align) in need {
            if ptr == 0 || ptr % align != 0 {
                return Err(NativeError::InvalidArgs(format!("{what} address {ptr:#x} is null or not {align}-byte aligned")));
            }
        }
        Ok(())
    }
}

impl Fp8PrepassVariant {
    /// `fp8_prepass_{amax,quant,onepass}_{input}_{format}`, e.g. `fp8_prepass_quant_f16_e4m3`.
    pub fn name(&self) -> String {
        let pass = match self.pass {
            Fp8PrepassPass::Amax => "amax",
            Fp8PrepassPass::Quantize => "quant",
            Fp8PrepassPass::OnePass => "onepass",
        };
        let format = match self.config.format {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        };
        format!("{KERNEL}_{pass}_{}_{format}", self.config.input.name())
    }

    /// The `-D` defines (the header of `fp8_prepass.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.config.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("ELEM", (self.config.input == Dtype::Bf16) as u32),
            d("FORMAT", (self.config.format == Fp8Format::E5M2) as u32),
            d(
                "PASS",
                match self.pass {
                    Fp8PrepassPass::Amax => 0,
                    Fp8PrepassPass::Quantize => 1,
                    Fp8PrepassPass::OnePass => 2,
                },
            ),
        ])
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !Fp8PrepassConfig::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("{arch} is not a target (sm_89 and later)") });
        }
        Ok(CompileRequest { kernel: self.name(), source: &FP8_PREPASS, arch, defines: self.defines()? })
    }

    /// SASS that must be there: the amax pass's arrival atomic and max; the quantize pass's
    /// IEEE division (`FCHK` guards its fast path) and saturating pack to the format (the
    /// conversion the codec's encoder mirrors); the one-read pass's of both and its backoff
    /// sleep (its atomic max is an ATOMG or a RED by target: the compile test counts both).
    pub fn expected_instructions(&self) -> Vec<String> {
        let f = match self.config.format {
            Fp8Format::E4M3 => "E4M3",
            Fp8Format::E5M2 => "E5M2",
        };
        let quantize = vec!["FCHK".into(), format!("F2FP.SATFINITE.{f}.F32.PACK_AB_MERGE_C")];
        match self.pass {
            Fp8PrepassPass::Amax => vec!["ATOMG.E.ADD.STRONG.GPU".into(), "FMNMX".into()],
            Fp8PrepassPass::Quantize => quantize,
            Fp8PrepassPass::OnePass => {
                let mut v: Vec<String> = vec!["ATOMG.E.ADD.STRONG.GPU".into(), "FMNMX".into(), "NANOSLEEP".into()];
                v.extend(quantize);
                v
            }
        }
    }
}

impl KernelVariant for Fp8PrepassVariant {
    fn name(&self) -> String {
        Fp8PrepassVariant::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Fp8PrepassVariant::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        Fp8PrepassVariant::expected_instructions(self)
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        0
    }
}

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::KernelCache;

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for Fp8PrepassParams {}

    /// The kernels of one prepass, loaded into a CUDA context.
    #[derive(Debug)]
    pub struct Fp8Prepass {
        config: Fp8PrepassConfig,
        arch: Arch,
        amax: CudaFunction,
        quantize: CudaFunction,
        onepass: CudaFunction,
        /// CTAs of the one-read pass the device keeps co-resident.
        resident: usize,
        slab_bytes: Option<usize>,
        path: Fp8PrepassPath,
    }

    impl Fp8Prepass {
        /// Compiles (or fetches from the global cache) every kernel of `config` for the
        /// context's device and loads them; slabs of half the device's L2; [`Fp8PrepassPath::Auto`].
        pub fn load(ctx: &Arc<CudaContext>, config: Fp8PrepassConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Fp8PrepassConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm89, Fp8PrepassConfig::target_for)?;
            let load = |pass| -> Result<CudaFunction> {
                Ok(crate::device::load_function(ctx, cache, &Fp8PrepassVariant { config, pass }.request(arch)?, 0)?.0)
            };
            let l2 = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
            let slab_bytes = (l2 > 0).then_some(l2 as usize / 2);
            let onepass = load(Fp8PrepassPass::OnePass)?;
            // The most shared memory per SM, so that registers, not the carveout, bound the
            // co-resident CTAs the grid is sized by.
            onepass.set_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
            let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let per_sm = onepass.occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)?;
            let resident = sms.max(0) as usize * per_sm as usize;
            log::debug!("{KERNEL}: one-read pass {per_sm} CTAs per SM x {sms} SMs");
            Ok(Fp8Prepass {
                config,
                arch,
                amax: load(Fp8PrepassPass::Amax)?,
                quantize: load(Fp8PrepassPass::Quantize)?,
                onepass,
                resident,
                slab_bytes,
                path: Fp8PrepassPath::Auto,
            })
        }

        pub fn config(&self) -> &Fp8PrepassConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }
        /// Input bytes per slab (`None`: the whole call in one slab).
        pub fn slab_bytes(&self) -> Option<usize> {
            self.slab_bytes
        }
        /// The same kernels with another slab size (measurements).
        pub fn with_slab_bytes(mut self, slab_bytes: Option<usize>) -> Self {
            self.slab_bytes = slab_bytes;
            self
        }
        /// The same kernels on another path (measurements, comparisons of the paths).
        pub fn with_path(mut self, path: Fp8PrepassPath) -> Self {
            self.path = path;
            self
        }
        pub fn path(&self) -> Fp8PrepassPath {
            self.path
        }
        /// CTAs of the one-read pass the device keeps co-resident.
        pub fn resident_ctas(&self) -> usize {
            self.resident
        }
        /// The one-read pass's grid over `args` if this prepass takes it (its path and
        /// [`Fp8PrepassConfig::onepass_ctas`]); `None`: the amax and quantize passes.
        pub fn onepass_grid(&self, args: &Fp8Args) -> Result<Option<usize>> {
            let ctas = self.config.onepass_ctas(args, self.resident);
            match (self.path, ctas) {
                (Fp8PrepassPath::TwoPass, _) => Ok(None),
                (Fp8PrepassPath::Auto, c) => Ok(c),
                (Fp8PrepassPath::OnePass, Some(c)) => Ok(Some(c)),
                (Fp8PrepassPath::OnePass, None) => Err(NativeError::InvalidArgs(format!(
                    "the one-read prepass needs every descale group within the {} co-resident CTAs; the largest has {} tiles",
                    self.resident,
                    self.config.max_group_tiles(args)
                ))),
            }
        }

        /// Enqueues the one-read pass or both passes of every slab on `stream` (the path).
        ///
        /// # Safety
        /// Each pointer must address device memory of at least the element counts of
        /// [`Fp8PrepassConfig::required_lens`] (the config's input type for Q, K, V; bytes for
        /// the codes; f32 for descales and partials; u32 for the counters, which must be zero),
        /// valid until the passes finish on `stream`, and no other prepass may use the same
        /// scratch concurrently.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, ptrs: &Fp8PrepassPtrs) -> Result<()> {
            self.config.validate_args(args)?;
            self.config.validate_ptrs(ptrs)?;
            if let Some(ctas) = self.onepass_grid(args)? {
                let tiles = self.config.required_lens(args).partial;
                let params = self.config.params(args, ptrs, Slab { tile_begin: 0, tile_end: tiles, bytes: 0 });
                let cfg = LaunchConfig { grid_dim: (ctas as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
                let mut b = stream.launch_builder(&self.onepass);
                b.arg(&params);
                // SAFETY: the parameter struct matches the kernel's signature; memory per
                // contract; at most the co-resident CTAs and no group larger (onepass_grid).
                unsafe { b.launch(cfg) }?;
                return Ok(());
            }
            for slab in self.config.slabs(args, self.slab_bytes) {
                let params = self.config.params(args, ptrs, slab);
                let ctas = (slab.tile_end - slab.tile_begin) as u32;
                for f in [&self.amax, &self.quantize] {
                    let cfg = LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
                    let mut b = stream.launch_builder(f);
                    b.arg(&params);
                    // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
                    unsafe { b.launch(cfg) }?;
                }
            }
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::Fp8Prepass;

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::Layout;

    /// The kernel's `thread_div_by`: x / d from r = RN(1/d) in a product and two fmas.
    fn div_by(x: f32, d: f32, r: f32) -> f32 {
        let q0 = x * r;
        let e = q0.mul_add(d, -x);
        (-e).mul_add(r, q0)
    }

    /// The kernel's `fast_descale`.
    fn fast_descale(d: f32) -> bool {
        (2f32.powi(-60)..=2f32.powi(60)).contains(&d)
    }

    /// `div_by` against the division for every input `xs` under the descale of every group
    /// maximum in `amaxes` it does not exceed, for both formats' largest finite values: bit for bit (NaN as NaN)
    /// wherever the quotient is at least 2^-18; below that (a bf16 subnormal under a larger
    /// descale, where the residual underflows) both must stay under 2^-17 with the same sign,
    /// where either format rounds them to the same signed zero code (e5m2's smallest
    /// subnormal is 2^-16, e4m3's 2^-9).
    fn check_div_by(xs: &[f32], amaxes: &[f32]) -> usize {
        let mut checked = 0;
        for max in [448.0f32, 57344.0] {
            for &amax in amaxes {
                let d = amax / max;
                if !fast_descale(d) {
                    continue;
                }
                let r = 1.0 / d;
                // A group's elements lie within its maximum (NaN elements do not enter it).
                for &x in xs.iter().filter(|x| !(x.abs() > amax)) {
                    let (want, got) = (x / d, div_by(x, d, r));
                    let tiny = 2f32.powi(-18);
                    let same = if want.abs() >= tiny {
                        want.to_bits() == got.to_bits()
                    } else {
                        got.abs() < 2.0 * tiny && want.is_sign_negative() == got.is_sign_negative()
                    };
                    assert!(
                        same || (want.is_nan() && got.is_nan()),
                        "x {x:e} ({:#x}) amax {amax:e} d {d:e}: {want:e} ({:#x}) != {got:e} ({:#x})",
                        x.to_bits(),
                        want.to_bits(),
                        got.to_bits()
                    );
                    checked += 1;
                }
            }
        }
        checked
    }

    fn f16_values() -> Vec<f32> {
        (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).filter(|x| !x.is_infinite()).collect()
    }

    fn bf16_values() -> Vec<f32> {
        (0..=u16::MAX).map(|b| half::bf16::from_bits(b).to_f32()).filter(|x| !x.is_infinite()).collect()
    }

    /// Every f16 input (±0, subnormals and NaNs included) under the descales of a spread of
    /// group maxima, and every bf16 input under a spread of bf16 maxima inside the fast range.
    /// `exhaustive_div_by_matches_the_division` covers every pair.
    #[test]
    fn div_by_matches_the_division_for_every_input() {
        let xs = f16_values();
        let amaxes: Vec<f32> = xs.iter().copied().filter(|x| *x > 0.0).step_by(257).collect();
        assert!(check_div_by(&xs, &amaxes) > 5_000_000);
        let ys = bf16_values();
        let amaxes: Vec<f32> = ys.iter().copied().filter(|x| *x > 0.0).step_by(509).collect();
        assert!(check_div_by(&ys, &amaxes) > 1_000_000);
    }

    /// Every (input, group maximum) pair of f16 and of bf16, both formats: about 8·10⁹
    /// divisions, minutes in a release build.
    /// `cargo test --release -p quattn-native --lib exhaustive_div_by -- --ignored`
    #[test]
    #[ignore]
    fn exhaustive_div_by_matches_the_division() {
        for xs in [f16_values(), bf16_values()] {
            let amaxes: Vec<f32> = xs.iter().copied().filter(|x| *x > 0.0).collect();
            check_div_by(&xs, &amaxes);
        }
    }

    fn args(layout: Layout, descale: DescaleGranularity) -> Fp8Args {
        Fp8Args::new(AttentionShape::contiguous(layout, 2, 8, 2, 300, 777, 128, false), descale)
    }

    #[test]
    fn params_layout_matches_the_kernel_structs() {
        // 3 pointers + 3 strides (8 bytes) + 6 four-byte fields.
        assert_eq!(std::mem::size_of::<Fp8PrepassTensor>(), 6 * 8 + 6 * 4);
        assert_eq!(std::mem::size_of::<Fp8PrepassParams>(), 3 * 72 + 2 * 8 + 4 * 4);
        let c = Fp8PrepassConfig::new(Dtype::F16, Fp8Format::E4M3).unwrap();
        let a = args(Layout::Bshd, DescaleGranularity::PerHead);
        let ptrs = Fp8PrepassPtrs { q: 16, k: 32, v: 48, q_codes: 64, k_codes: 72, v_codes: 80, q_descale: 4, k_descale: 8, v_descale: 12, partial: 20, counter: 24 };
        let slab = Slab { tile_begin: 3, tile_end: 9, bytes: 0 };
        let p = c.params(&a, &ptrs, slab);
        // 64 rows per tile at head dim 128: Q 300 rows -> 5 tiles per head, K/V 777 -> 13.
        assert_eq!((p.t[0].tiles_per_head, p.t[1].tiles_per_head, p.t[2].tiles_per_head), (5, 13, 13));
        assert_eq!((p.t[0].tile_begin, p.t[1].tile_begin, p.t[2].tile_begin), (0, 2 * 8 * 5, 2 * 8 * 5 + 2 * 2 * 13));
        assert_eq!((p.t[0].group_begin, p.t[1].group_begin, p.t[2].group_begin), (0, 16, 20));
        assert_eq!((p.t[1].x, p.t[1].codes, p.t[1].descale, p.t[1].heads, p.t[1].len), (32, 72, 8, 2, 777));
        assert_eq!((p.t[0].batch_stride, p.t[0].head_stride, p.t[0].seq_stride), (300 * 8 * 128, 128, 8 * 128));
        assert_eq!((p.tile_begin, p.tile_end, p.piece_shift, p.per_head), (3, 9, 4, 1));
        let pt = c.params(&args(Layout::Bhsd, DescaleGranularity::PerTensor), &ptrs, slab);
        assert_eq!((pt.t[1].group_begin, pt.t[2].group_begin, pt.per_head), (1, 2, 0));
    }

    #[test]
    fn lens_and_model_bytes() {
        let c = Fp8PrepassConfig::new(Dtype::Bf16, Fp8Format::E5M2).unwrap();
        let a = args(Layout::Bhsd, DescaleGranularity::PerHead);
        let l = c.required_lens(&a);
        assert_eq!((l.q, l.k, l.v), (2 * 8 * 300 * 128, 2 * 2 * 777 * 128, 2 * 2 * 777 * 128));
        // Counters: arrivals and maxima of 16 + 4 + 4 groups, then the work counter's two words.
        assert_eq!((l.q_descale, l.kv_descale, l.counter, l.partial), (16, 4, 2 * 24 + 2, 2 * 8 * 5 + 2 * 2 * 2 * 13));
        let t = c.required_lens(&Fp8Args { descale: DescaleGranularity::PerTensor, ..a });
        assert_eq!((t.q_descale, t.kv_descale, t.counter), (1, 1, 2 * 3 + 2));
        // Each element read once (2 bytes) and written once (1), plus the descales.
        assert_eq!(c.model_bytes(&a), (2 * 8 * 300 + 2 * 2 * 2 * 777) * 128 * 3 + 4 * 24);
    }

    #[test]
    fn slabs_are_whole_groups_covering_every_tile_once() {
        let c = Fp8PrepassConfig::new(Dtype::F16, Fp8Format::E4M3).unwrap();
        let a = args(Layout::Bhsd, DescaleGranularity::PerHead);
        let tiles = c.required_lens(&a).partial;
        let (q_head, kv_head) = (300 * 128 * 2, 777 * 128 * 2);
        for budget in [None, Some(0), Some(q_head), Some(3 * kv_head), Some(usize::MAX)] {
            let slabs = c.slabs(&a, budget);
            assert_eq!(slabs[0].tile_begin, 0);
            assert_eq!(slabs.last().unwrap().tile_end, tiles, "{budget:?}");
            for w in slabs.windows(2) {
                assert_eq!(w[0].tile_end, w[1].tile_begin);
            }
            let total: usize = slabs.iter().map(|s| s.bytes).sum();
            assert_eq!(total, (16 * 300 + 2 * 4 * 777) * 128 * 2);
            for s in &slabs {
                // Whole groups: Q heads of 5 tiles, then K and V heads of 13.
                let whole = |t: usize| t <= 80 && t % 5 == 0 || t >= 80 && (t - 80) % 13 == 0;
                assert!(whole(s.tile_begin) && whole(s.tile_end), "{s:?}");
                if let Some(b) = budget {
                    assert!(s.bytes <= b || s.tile_end - s.tile_begin <= 13, "{s:?} over {b}");
                }
            }
        }
        assert_eq!(c.slabs(&a, None).len(), 1);
        assert_eq!(c.slabs(&a, Some(0)).len(), 16 + 8);
        // Budget 3 x 198912: Q heads (76800 bytes) 7, 7, then 2 with 2 K heads, 2 K + 1 V, 3 V.
        assert_eq!(c.slabs(&a, Some(3 * kv_head)).len(), 2 + 3);
        // Per tensor: three groups, never split.
        let t = Fp8Args { descale: DescaleGranularity::PerTensor, ..a };
        assert_eq!(c.slabs(&t, Some(0)).iter().map(|s| s.tile_end - s.tile_begin).collect::<Vec<_>>(), vec![80, 52, 52]);
    }

    #[test]
    fn invalid_args_and_pointers_are_typed() {
        let c = Fp8PrepassConfig::new(Dtype::F16, Fp8Format::E4M3).unwrap();
        assert!(Fp8PrepassConfig::new(Dtype::F32, Fp8Format::E4M3).is_err());
        let a = args(Layout::Bshd, DescaleGranularity::PerHead);
        c.validate_args(&a).unwrap();
        let with = |f: &dyn Fn(&mut Fp8Args)| {
            let mut x = a;
            f(&mut x);
            c.validate_args(&x)
        };
        for (what, r) in [
            ("per block", with(&|x| x.descale = DescaleGranularity::PerBlock)),
            ("head dim 96", with(&|x| x.shape = AttentionShape::contiguous(Layout::Bhsd, 1, 1, 1, 4, 4, 96, false))),
            ("v head dim", with(&|x| x.shape.v_head_dim = 64)),
            ("kv_len 0", with(&|x| x.shape.kv_len = 0)),
            ("q stride", with(&|x| x.shape.q.seq = 1028)),
        ] {
            assert!(matches!(r, Err(NativeError::InvalidArgs(_))), "{what}: {r:?}");
        }
        assert!(with(&|x| x.shape = AttentionShape::contiguous(Layout::Bhsd, 1, 1, 1, 4, 4, 64, false)).is_ok());
        let good = Fp8PrepassPtrs { q: 16, k: 32, v: 48, q_codes: 8, k_codes: 8, v_codes: 8, q_descale: 4, k_descale: 4, v_descale: 4, partial: 4, counter: 4 };
        c.validate_ptrs(&good).unwrap();
        assert!(c.validate_ptrs(&Fp8PrepassPtrs { k: 40, ..good }).is_err());
        assert!(c.validate_ptrs(&Fp8PrepassPtrs { v_codes: 12, ..good }).is_err());
        assert!(c.validate_ptrs(&Fp8PrepassPtrs { counter: 0, ..good }).is_err());
    }

    #[test]
    fn names_and_defines() {
        let mut names: Vec<String> = Fp8PrepassConfig::all()
            .into_iter()
            .flat_map(|config| config.passes().map(|pass| Fp8PrepassVariant { config, pass }.name()))
            .collect();
        assert_eq!(names.len(), 12);
        assert!(names.contains(&"fp8_prepass_quant_bf16_e5m2".to_string()), "{names:?}");
        assert!(names.contains(&"fp8_prepass_onepass_f16_e4m3".to_string()), "{names:?}");
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 12);
        let v = Fp8PrepassVariant { config: Fp8PrepassConfig::new(Dtype::Bf16, Fp8Format::E5M2).unwrap(), pass: Fp8PrepassPass::Quantize };
        let d = v.defines().unwrap();
        assert!(d.contains(&("ELEM".into(), "1".into())) && d.contains(&("FORMAT".into(), "1".into())) && d.contains(&("PASS".into(), "1".into())));
        assert!(v.request(Arch::Sm80).is_err());
        assert_eq!(Fp8PrepassConfig::target_for((9, 0)), Some(Arch::Sm90));
        assert_eq!(Fp8PrepassConfig::target_for((8, 6)), None);
        assert_eq!(v.expected_instructions(), vec!["FCHK".to_string(), "F2FP.SATFINITE.E5M2.F32.PACK_AB_MERGE_C".into()]);
        let one = Fp8PrepassVariant { pass: Fp8PrepassPass::OnePass, ..v };
        assert!(one.defines().unwrap().contains(&("PASS".into(), "2".into())));
        let e = one.expected_instructions();
        assert!(e.contains(&"NANOSLEEP".to_string()) && e.contains(&"FCHK".to_string()), "{e:?}");
    }

    #[test]
    fn onepass_runs_only_where_every_group_fits_the_resident_ctas() {
        let c = Fp8PrepassConfig::new(Dtype::F16, Fp8Format::E4M3).unwrap();
        // Per head: Q heads of 5 tiles, K and V heads of 13; 80 + 2 * 52 = 184 tiles.
        let a = args(Layout::Bhsd, DescaleGranularity::PerHead);
        assert_eq!(c.max_group_tiles(&a), 13);
        assert_eq!(c.onepass_ctas(&a, 0), None);
        assert_eq!(c.onepass_ctas(&a, 12), None);
        assert_eq!(c.onepass_ctas(&a, 13), Some(13));
        assert_eq!(c.onepass_ctas(&a, 132 * 6), Some(184));
        // Per tensor: Q is one group of 80 tiles.
        let t = Fp8Args { descale: DescaleGranularity::PerTensor, ..a };
        assert_eq!(c.max_group_tiles(&t), 80);
        assert_eq!(c.onepass_ctas(&t, 79), None);
        assert_eq!(c.onepass_ctas(&t, 80), Some(80));
        // The bench's shapes on 132 SMs at 5 CTAs each (660): per head the largest group (a
        // 32768-row KV head at hd 128) has 512 tiles and qualifies; a 64 MB tensor per tensor
        // (4 x 16 heads x 64 tiles) does not.
        let big = |b, hq, hkv, sq, skv, d, g| Fp8Args::new(AttentionShape::contiguous(Layout::Bhsd, b, hq, hkv, sq, skv, d, false), g);
        let ph = DescaleGranularity::PerHead;
        assert_eq!(c.max_group_tiles(&big(1, 32, 8, 1, 32768, 128, ph)), 512);
        assert_eq!(c.onepass_ctas(&big(1, 32, 8, 1, 32768, 128, ph), 660), Some(660));
        assert_eq!(c.onepass_ctas(&big(1, 32, 8, 1, 32768, 128, ph), 511), None);
        assert_eq!(c.max_group_tiles(&big(4, 16, 16, 4096, 4096, 128, ph)), 64);
        assert_eq!(c.onepass_ctas(&big(4, 16, 16, 4096, 4096, 128, DescaleGranularity::PerTensor), 660), None);
        // A head of one row at hd 8 is one tile; hd 8192: one row per tile.
        assert_eq!(c.max_group_tiles(&big(1, 1, 1, 1, 1, 8, ph)), 1);
        assert_eq!(c.max_group_tiles(&big(1, 1, 1, 3, 5, 8192, ph)), 5);
        assert_eq!(c.onepass_ctas(&big(1, 1, 1, 3, 5, 8192, ph), 660), Some(3 + 5 + 5));
    }
}
