//! The launch path: problem -> validated shapes -> variant and tiles -> compile-time config ->
//! launch. Dispatch by runtime capability happens here and nowhere else.

use cubecl::features::Plane;
use cubecl::ir::features::TypeUsage;
use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};

use crate::error::LaunchError;
use crate::kernel::cmma::{fwd_cmma, CmmaConfig};
use crate::kernel::mma::{fwd_mma, MmaFwdConfig};
use crate::kernel::fma::{fwd_portable_fma, FmaConfig};
use crate::kernel::fma_half::{fwd_portable_fma_half, HalfConfig};
use crate::kernel::fma_vec::{fwd_portable_fma_vec, FmaVecConfig};
use crate::kernel::fma_vec_int8::{fwd_portable_fma_vec_int8, Int8Config, Int8ShapeLaunch};
use crate::kernel::AttnShapeLaunch;
use crate::problem::{Accumulation, AttentionArgs, ElemType, QkAccumulation};
use crate::quant::{check_quant_args, Int8Blocking, Int8Operands, Int8Quant};
use crate::tiling::{
    select_cmma_tiles, select_fma_half_tiles, select_fma_tiles, select_fma_vec_tiles, select_mma_tiles, CmmaTiles,
    FmaTiles, FmaVecTiles, MmaTiles,
};

/// Which kernel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Variant {
    /// The best variant the runtime supports.
    #[default]
    Auto,
    /// Register-tiled FMA kernel on 4-wide vectors; runs everywhere. Falls back to
    /// `PortableFmaScalar` when a row start of Q, K, V or O is not 4-aligned or no vector
    /// tiling fits.
    PortableFma,
    /// The scalar register-tiled FMA kernel (any strides).
    PortableFmaScalar,
    /// Matrix-unit kernel (f16/bf16 only); needs 16x16x16 cmma with f32 accumulation and
    /// 32-wide planes (CUDA).
    Cmma,
    /// Register-resident matrix-unit kernel on manual MMA (f16/bf16 only): needs the runtime's
    /// m16n8k16 `mma` with f32 accumulation, `ldmatrix`, and 32-wide planes (CUDA sm_80+).
    Mma,
}

impl Variant {
    /// The kernel family's name in plans, logs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Auto => "auto",
            Variant::PortableFma => "portable_fma",
            Variant::PortableFmaScalar => "portable_fma_scalar",
            Variant::Cmma => "cmma",
            Variant::Mma => "mma",
        }
    }
}

/// How the vector FMA kernels (f32- and f16-accumulating) bring each K and V tile into
/// shared memory. A speed knob: every choice stages the same values (zero past the keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvLoads {
    /// Each load tests its row against the key count (one guarded load per vector). Through
    /// NVIDIA's Vulkan driver every such load became its own branch region, waiting on the
    /// previous one: 22.7 TFLOP/s where `TileChecked` runs 34.6.
    Direct,
    /// One test per tile: a tile inside the keys loads with no per-row test.
    TileChecked,
    /// `TileChecked`, and the loads are issued a phase early into registers: this tile's V
    /// during Q·Kᵀ and the softmax, the next tile's K during P·V (software pipelining without
    /// asynchronous copies, which WGSL lacks).
    #[default]
    Prefetch,
}

impl KvLoads {
    /// Kernel-name suffix.
    pub const fn suffix(self) -> &'static str {
        match self {
            KvLoads::Direct => "_direct",
            KvLoads::TileChecked => "_tc",
            KvLoads::Prefetch => "",
        }
    }
}

/// What the caller may force; `Default` lets the crate choose everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchOptions {
    pub variant: Variant,
    /// Pin the scalar FMA kernel's tiling (`None`: first fitting entry of the tile table).
    pub fma_tiles: Option<FmaTiles>,
    /// Pin the vectorized FMA kernel's tiling (`None`: first fitting entry of the tile table).
    pub fma_vec_tiles: Option<FmaVecTiles>,
    /// Pin the cmma tiling (`None`: first fitting entry of the tile table).
    pub cmma_tiles: Option<CmmaTiles>,
    /// Pin the mma tiling (`None`: first fitting entry of the tile table).
    pub mma_tiles: Option<MmaTiles>,
    /// FlashAttention-4's conditional rescale (exact either way; a speed knob).
    pub lazy_rescale: bool,
    /// Allow plane (subgroup) shuffles for the row reductions when the runtime reports them.
    pub allow_plane_ops: bool,
    /// Where to accumulate in f16 (default: nowhere). Anything else runs the packed-f16 FMA
    /// kernel, on f16 inputs; the matrix-unit families refuse it.
    pub accumulation: Accumulation,
    /// K/V staging of the vector FMA kernels (`None`: the crate's choice, `Prefetch`).
    pub kv_loads: Option<KvLoads>,
    /// Separate K and V stages in the packed-f16 kernel: two barriers per tile instead of
    /// four, for `bk * dv` more halves of shared memory (`None`: where they fit).
    pub split_kv: Option<bool>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        Self {
            variant: Variant::Auto,
            fma_tiles: None,
            fma_vec_tiles: None,
            cmma_tiles: None,
            mma_tiles: None,
            lazy_rescale: true,
            allow_plane_ops: true,
            accumulation: Accumulation::default(),
            kv_loads: None,
            split_kv: None,
        }
    }
}

/// What was launched, for logs and benchmarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Kernel variant and tile config, e.g. `portable_fma_d64_bq32_bk32`.
    pub kernel: String,
    pub variant: Variant,
    pub cube_count: (u32, u32, u32),
    pub units_per_cube: u32,
    pub shared_memory_bytes: usize,
    pub lazy_rescale: bool,
    pub plane_reduce: bool,
    /// False when the problem was empty and nothing was enqueued.
    pub launched: bool,
}

/// Runs forward attention with default options. See [`launch_with`].
#[allow(clippy::too_many_arguments)]
pub fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    launch_with(client, args, elem, &LaunchOptions::default(), q, k, v, o, lse)
}

/// Runs forward attention: `O = softmax(scale · Q·Kᵀ) · V` (optionally causal), O in `elem`,
/// LSE in f32 `[batch, q_heads, q_len]` when `args.write_lse`.
///
/// Everything is validated before anything is enqueued; the launch itself is asynchronous, so
/// device-side failures surface at the client's next `flush`/`sync`/read.
#[allow(clippy::too_many_arguments)]
pub fn launch_with<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    args.validate()?;
    check_elem_supported(client, elem)?;
    check_buffers(args, elem, q, k, v, o, lse)?;

    if !options.accumulation.is_f32() {
        let tiles = half_tiles(client, args, elem, options)?;
        return launch_fma_half(client, args, options, tiles, q, k, v, o, lse);
    }
    match options.variant {
        Variant::PortableFmaScalar => launch_fma(client, args, elem, options, q, k, v, o, lse),
        Variant::PortableFma => launch_fma_any(client, args, elem, options, q, k, v, o, lse),
        Variant::Cmma => match cmma_unavailable(client, args, elem, options) {
            None => launch_cmma(client, args, elem, options, q, k, v, o, lse),
            Some(reason) => Err(LaunchError::VariantUnavailable { variant: "cmma", reason }),
        },
        Variant::Mma => match mma_unavailable(client, args, elem, options) {
            None => launch_mma(client, args, elem, options, q, k, v, o, lse),
            Some(reason) => Err(LaunchError::VariantUnavailable { variant: "mma", reason }),
        },
        Variant::Auto => {
            let (variant, reason) = auto_variant(client, args, elem, options);
            if let Some(reason) = reason {
                log::debug!("{} kernel chosen: {reason}", variant.name());
            }
            match variant {
                Variant::Mma => launch_mma(client, args, elem, options, q, k, v, o, lse),
                Variant::Cmma => launch_cmma(client, args, elem, options, q, k, v, o, lse),
                _ => launch_fma_any(client, args, elem, options, q, k, v, o, lse),
            }
        }
    }
}

/// The kernel family `Variant::Auto` launches for these arguments on this runtime, best
/// first: `Variant::Mma` where the runtime reports m16n8k16 manual MMA with f32 accumulation,
/// `ldmatrix` and 32-wide planes and an mma tiling fits; else `Variant::Cmma` where it reports
/// 16x16x16 cmma likewise; else `Variant::PortableFma`. The reason says why the better kernels
/// are out (`None` when the mma kernel is chosen). For plans and logs; the launch makes the
/// same call.
pub fn auto_variant<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> (Variant, Option<String>) {
    if !options.accumulation.is_f32() {
        return (
            Variant::PortableFma,
            Some("f16 accumulation runs on the packed-f16 FMA kernel only".into()),
        );
    }
    let Some(no_mma) = mma_unavailable(client, args, elem, options) else {
        return (Variant::Mma, None);
    };
    match cmma_unavailable(client, args, elem, options) {
        None => (Variant::Cmma, Some(format!("no mma: {no_mma}"))),
        Some(no_cmma) => (Variant::PortableFma, Some(format!("no mma: {no_mma}; no cmma: {no_cmma}"))),
    }
}

/// Why the variant `options.variant` forces cannot run these arguments on this runtime (`None`
/// when it can, and always for `Auto` and the FMA kernels, which run everywhere the element
/// type does). Plans call this to refuse a forced kernel family before anything is uploaded;
/// the launch makes the same checks.
pub fn variant_unavailable<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Option<String> {
    if !options.accumulation.is_f32() {
        return half_tiles(client, args, elem, options).err().map(|e| e.to_string());
    }
    match options.variant {
        Variant::Mma => mma_unavailable(client, args, elem, options),
        Variant::Cmma => cmma_unavailable(client, args, elem, options),
        Variant::Auto | Variant::PortableFma | Variant::PortableFmaScalar => None,
    }
}

/// The manual MMA the mma kernel is written for: m16n8k16, `elem` inputs, f32 accumulation.
fn mma_config(elem: ElemType) -> cubecl::ir::features::MmaConfig {
    cubecl::ir::features::MmaConfig {
        a_type: elem.storage(),
        b_type: elem.storage(),
        cd_type: ElemType::F32.storage(),
        m: 16,
        n: 8,
        k: 16,
    }
}

/// Whether the runtime's register layout of manual MMA fragments is the one the mma kernel
/// indexes (every fragment register a pair of elements, row-major A and accumulator,
/// column-major B, 32 lanes, no duplication): CUDA's. `None` when it is, else what differs.
pub(crate) fn mma_layout_mismatch<R: Runtime>(elem: ElemType) -> Option<String> {
    use cubecl::ir::{Matrix, MatrixIdent, MatrixLayout};
    let props = R::target_properties().mma;
    let pair = |ident, storage| {
        let matrix = Matrix { ident, m: 16, n: 8, k: 16, storage, layout: MatrixLayout::ColMajor };
        props.contiguous_elements.apply(ident, matrix) == 2
    };
    let ok = props.const_plane_size == 32
        && props.register_layout_a == MatrixLayout::RowMajor
        && props.register_layout_b == MatrixLayout::ColMajor
        && props.register_layout_acc == MatrixLayout::RowMajor
        && props.register_duplication_a == 1
        && props.register_duplication_b == 1
        && props.register_duplication_acc == 1
        && pair(MatrixIdent::A, elem.storage())
        && pair(MatrixIdent::B, elem.storage())
        && pair(MatrixIdent::Accumulator, ElemType::F32.storage());
    (!ok).then(|| format!("the runtime's MMA register layout is not the one the kernel indexes: {props:?}"))
}

/// The cmma tiling: the pinned one, validated, else the first fitting entry of the table.
pub(crate) fn resolve_cmma_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<CmmaTiles, LaunchError> {
    let hw = &client.properties().hardware;
    let tiles = match options.cmma_tiles {
        Some(t) => t,
        None => select_cmma_tiles(args.head_dim, args.v_head_dim, elem.size_bytes() as u32, hw.max_shared_memory_size, hw.max_units_per_cube)
            .ok_or_else(|| LaunchError::VariantUnavailable { variant: "cmma", reason: "no tiling fits".into() })?,
    };
    tiles.validate()?;
    Ok(tiles)
}

/// The mma tiling: the pinned one, validated, else the first fitting entry of the table.
pub(crate) fn resolve_mma_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<MmaTiles, LaunchError> {
    let hw = &client.properties().hardware;
    let tiles = match options.mma_tiles {
        Some(t) => t,
        None => select_mma_tiles(args.head_dim, args.v_head_dim, elem.size_bytes() as u32, hw.max_shared_memory_size, hw.max_units_per_cube)
            .ok_or_else(|| LaunchError::VariantUnavailable { variant: "mma", reason: "no tiling fits".into() })?,
    };
    tiles.validate(args.head_dim, args.v_head_dim)?;
    Ok(tiles)
}

/// The scalar FMA kernel's tiling: the pinned one, validated, else the first fitting entry.
pub(crate) fn fma_scalar_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<FmaTiles, LaunchError> {
    let hw = &client.properties().hardware;
    // Shared-memory stages hold the input element type.
    let stage_bytes = elem.size_bytes() as u32;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    match options.fma_tiles {
        Some(tiles) => {
            tiles.validate(d, dv)?;
            Ok(tiles)
        }
        None => select_fma_tiles(d, dv, stage_bytes, hw.max_shared_memory_size, hw.max_units_per_cube).ok_or_else(|| {
            LaunchError::SharedMemoryExceeded {
                kernel: format!("portable_fma_d{d}"),
                required: crate::tiling::fma_candidates(d.max(dv))
                    .iter()
                    .map(|t| t.smem_bytes(d, dv, stage_bytes) as usize)
                    .min()
                    .unwrap_or(0),
                available: hw.max_shared_memory_size,
            }
        }),
    }
}

/// Why the mma kernel cannot run this problem on this runtime, if it cannot.
fn mma_unavailable<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Option<String> {
    if elem == ElemType::F32 {
        return Some("f32 inputs have no m16n8k16 f32-accumulating matrix op".into());
    }
    let mma = mma_config(elem);
    let features = client.features();
    if !features.matmul.mma.contains(&mma) {
        return Some(format!("runtime `{}` reports no manual {mma:?}", R::name(client)));
    }
    if !features.matmul.ldmatrix.contains(&elem.storage()) {
        return Some(format!("runtime `{}` reports no ldmatrix for {elem:?}", R::name(client)));
    }
    let hw = &client.properties().hardware;
    if !features.plane.contains(Plane::Ops) || hw.plane_size_min != 32 || hw.plane_size_max != 32 {
        return Some("the kernel needs plane ops on 32-wide planes".into());
    }
    if let Some(reason) = mma_layout_mismatch::<R>(elem) {
        return Some(reason);
    }
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    match options.mma_tiles {
        Some(t) => {
            if let Err(e) = t.validate(d, dv) {
                return Some(e.to_string());
            }
            let smem = t.smem_bytes(d, dv, bytes) as usize;
            if smem > hw.max_shared_memory_size || t.units() > hw.max_units_per_cube {
                return Some(format!(
                    "{t} needs {smem} bytes of shared memory and {} units per cube; the runtime allows {} and {}",
                    t.units(),
                    hw.max_shared_memory_size,
                    hw.max_units_per_cube
                ));
            }
        }
        None => {
            if select_mma_tiles(d, dv, bytes, hw.max_shared_memory_size, hw.max_units_per_cube).is_none() {
                return Some(format!(
                    "no mma tiling fits d={d} dv={dv} in {} bytes of shared memory",
                    hw.max_shared_memory_size
                ));
            }
        }
    }
    None
}

/// Why the cmma kernel cannot run this problem on this runtime, if it cannot.
fn cmma_unavailable<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Option<String> {
    use cubecl::ir::features::MmaConfig;
    if elem == ElemType::F32 {
        return Some("f32 inputs have no 16x16x16 f32-accumulating matrix op".into());
    }
    let storage = elem.storage();
    let f32_storage = ElemType::F32.storage();
    let mma = MmaConfig { a_type: storage, b_type: storage, cd_type: f32_storage, m: 16, n: 16, k: 16 };
    let features = client.features();
    if !features.matmul.cmma.contains(&mma) {
        return Some(format!("runtime `{}` reports no {mma:?}", R::name(client)));
    }
    let hw = &client.properties().hardware;
    if !features.plane.contains(Plane::Ops) || hw.plane_size_min != 32 || hw.plane_size_max != 32 {
        return Some("the kernel needs plane ops on 32-wide planes".into());
    }
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    let fits = match options.cmma_tiles {
        Some(t) => {
            t.validate().is_ok()
                && t.smem_bytes(d, dv, bytes) as usize <= hw.max_shared_memory_size
                && t.units() <= hw.max_units_per_cube
        }
        None => select_cmma_tiles(d, dv, bytes, hw.max_shared_memory_size, hw.max_units_per_cube)
            .is_some(),
    };
    if !fits {
        return Some(format!(
            "no cmma tiling fits {} bytes of shared memory",
            hw.max_shared_memory_size
        ));
    }
    None
}

/// Whether the runtime behind `client` can run the kernels on `elem` inputs, or the error that
/// names the missing element type. Callers check this at plan time; `launch` checks it again.
pub fn check_elem_supported<R: Runtime>(
    client: &ComputeClient<R>,
    elem: ElemType,
) -> Result<(), LaunchError> {
    // The FMA kernel computes in f32, so the element type only needs loads, stores, shared
    // memory and conversion.
    let usage = client.features().type_usage(elem.storage());
    if usage.contains(TypeUsage::Conversion) && usage.contains(TypeUsage::Buffer) {
        Ok(())
    } else {
        Err(LaunchError::UnsupportedElemType { elem, runtime: R::name(client) })
    }
}

fn check_buffers(
    args: &AttentionArgs,
    elem: ElemType,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<(), LaunchError> {
    let elem_bytes = elem.size_bytes() as u64;
    for ((tensor, elems), handle) in args.extents().into_iter().zip([q, k, v, o]) {
        check_extent(tensor, elems, elem_bytes, handle)?;
    }
    match (args.write_lse, lse) {
        (true, Some(handle)) => check_extent("lse", args.lse_len(), 4, handle),
        (true, None) => Err(LaunchError::InvalidProblem { reason: "write_lse is set but no lse buffer was given".into() }),
        (false, Some(_)) => Err(LaunchError::InvalidProblem { reason: "an lse buffer was given but write_lse is not set".into() }),
        (false, None) => Ok(()),
    }
}

pub(crate) fn check_extent(
    tensor: &'static str,
    elems: u64,
    elem_bytes: u64,
    handle: &Handle,
) -> Result<(), LaunchError> {
    // Indices are 32-bit in the kernel.
    if elems > u32::MAX as u64 {
        return Err(LaunchError::IndexOverflow { tensor, elems });
    }
    let available_bytes = handle.size_in_used();
    let required_bytes = elems * elem_bytes;
    if required_bytes > available_bytes {
        return Err(LaunchError::BufferTooSmall { tensor, required_bytes, available_bytes });
    }
    Ok(())
}

/// The blocking the INT8 attention kernel runs with on this runtime (its vector tiling's `bq`
/// and `bk`, 16 rows per warp): quantize with it ([`crate::quantize_int8`]), then launch with
/// [`launch_int8`]. `v_elem` is the element type of V and O.
pub fn int8_blocking<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    v_elem: ElemType,
    options: &LaunchOptions,
) -> Result<Int8Blocking, LaunchError> {
    args.validate()?;
    let tiles = int8_tiles(client, args, v_elem, options)?;
    Ok(Int8Blocking { block_q: tiles.bq, block_k: tiles.bk, warps: tiles.bq / 16 })
}

pub(crate) fn int8_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    v_elem: ElemType,
    options: &LaunchOptions,
) -> Result<FmaVecTiles, LaunchError> {
    if matches!(options.variant, Variant::PortableFmaScalar | Variant::Cmma | Variant::Mma) {
        return Err(LaunchError::VariantUnavailable {
            variant: options.variant.name(),
            reason: "INT8 Q/K run on the vectorized FMA kernel only".into(),
        });
    }
    let tiles = fma_vec_tiles(client, args, v_elem, options)
        .map_err(|reason| LaunchError::VariantUnavailable { variant: "portable_fma_vec_int8", reason })?;
    if !tiles.bq.is_multiple_of(16) {
        return Err(LaunchError::InvalidTiles {
            tiles: tiles.to_string(),
            reason: "INT8 scales are laid out for 16-row warps: bq must be a multiple of 16".into(),
        });
    }
    Ok(tiles)
}

/// Attention on INT8 Q and K from [`crate::quantize_int8`] (quantized with `quant`, which
/// must use [`int8_blocking`]'s `block_q` and `block_k`), V in `v_elem` (f16 or f32), O in
/// `v_elem`, LSE f32 `[batch, q_heads, q_len]` when `args.write_lse` (the unsmoothed logits'
/// LSE: the prepass's shift is added back). `args.scale` is the softmax scale the prepass
/// folded into the Q scales.
#[allow(clippy::too_many_arguments)]
pub fn launch_int8<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    v_elem: ElemType,
    options: &LaunchOptions,
    quant: &Int8Quant,
    ops: &Int8Operands,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    check_quant_args(args, quant)?;
    check_elem_supported(client, v_elem)?;
    if v_elem == ElemType::Bf16 {
        return Err(LaunchError::UnsupportedElemType { elem: v_elem, runtime: "the INT8 kernel (f16 or f32 V)" });
    }
    // Q/K extents in bytes (the codes), V/O in elements of v_elem.
    let extents = args.extents();
    check_extent("q codes", extents[0].1, 1, &ops.q_codes)?;
    check_extent("k codes", extents[1].1, 1, &ops.k_codes)?;
    check_extent("v", extents[2].1, v_elem.size_bytes() as u64, v)?;
    check_extent("o", extents[3].1, v_elem.size_bytes() as u64, o)?;
    let (q_scales_len, k_scales_len) = quant.blocking.scales_len(args, quant.granularity);
    check_extent("q scales", q_scales_len, 4, &ops.q_scales)?;
    check_extent("k scales", k_scales_len, 4, &ops.k_scales)?;
    match (args.write_lse, lse) {
        (true, Some(handle)) => check_extent("lse", args.lse_len(), 4, handle)?,
        (false, None) => {}
        _ => {
            return Err(LaunchError::InvalidProblem { reason: "an lse buffer must be given exactly when write_lse is set".into() })
        }
    }
    let shift_lse = quant.smooth_k && args.write_lse;
    if shift_lse {
        match &ops.lse_shift {
            Some(h) => check_extent("lse shift", args.lse_len(), 4, h)?,
            None => {
                return Err(LaunchError::InvalidProblem { reason: "K was smoothed but the operands hold no LSE shift".into() })
            }
        }
    }

    let tiles = int8_tiles(client, args, v_elem, options)?;
    let blocking = quant.blocking;
    if blocking.block_q != tiles.bq || blocking.block_k != tiles.bk {
        return Err(LaunchError::InvalidProblem {
            reason: format!(
                "the INT8 scales were laid out for block_q {} / block_k {}, the kernel's tiles are {tiles}",
                blocking.block_q, blocking.block_k
            ),
        });
    }
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let cube_count = (args.q_len.div_ceil(tiles.bq), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;
    let plane_reduce = plane_reduce_ok(client, options, tiles.tc);
    let cfg = FmaVecConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
        // The INT8 kernel stages K/V its own way.
        tile_checked: false,
        prefetch: false,
    };
    let icfg = Int8Config { granularity: quant.granularity, warps: blocking.warps as usize, shift_lse };
    let dims = if d == dv { format!("d{d}") } else { format!("d{d}v{dv}") };
    let granularity = match quant.granularity {
        crate::Int8Granularity::PerBlock => "block",
        crate::Int8Granularity::PerWarp => "warp",
        crate::Int8Granularity::PerThread => "thread",
    };
    let info = LaunchInfo {
        kernel: format!("portable_fma_vec_int8_{granularity}_{}_{dims}_{tiles}", elem_name(v_elem)),
        variant: Variant::PortableFma,
        cube_count,
        units_per_cube: tiles.units(),
        shared_memory_bytes: tiles.smem_bytes(d, dv, v_elem.size_bytes() as u32) as usize,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
        launched: cube_count.0 > 0 && cube_count.1 > 0 && cube_count.2 > 0,
    };
    if !info.launched {
        return Ok(info);
    }
    log::debug!("launching {} {:?} {:?} for {:?}", info.kernel, cfg, icfg, args);

    let width = fma_vec_width() as usize;
    let vectors = |handle: &Handle, elems: u64| {
        // SAFETY: checked above to cover `elems` elements; whole vectors inside rows.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(width).max(1)) }
    };
    let floats = |handle: &Handle, len: u64| {
        // SAFETY: checked above to hold `len` floats.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (len as usize).max(1)) }
    };
    let shift = match (&ops.lse_shift, shift_lse) {
        (Some(h), true) => floats(h, args.lse_len()),
        _ => floats(&client.empty(4), 1),
    };
    let (lse_handle, lse_elems) = lse_binding(client, args, lse);
    // Logits arrive in log2 units: the softmax's exp((s - m)·scale) with scale = ln 2 is
    // 2^(s - m), and its LSE m·ln 2 + ln l.
    let shape = shape_arg::<R>(&AttentionArgs { scale: core::f32::consts::LN_2, ..*args });
    let scale_shape = Int8ShapeLaunch::new(args.kv_heads, blocking.q_blocks(args.q_len), blocking.k_blocks(args.kv_len));
    let count = CubeCount::Static(cube_count.0, cube_count.1, cube_count.2);
    let dim = CubeDim::new_1d(tiles.units());
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were
            // checked to cover the strided extents and the scale layouts.
            unsafe {
                fwd_portable_fma_vec_int8::launch_unchecked::<$e, $s, R>(
                    client,
                    count,
                    dim,
                    width,
                    vectors(&ops.q_codes, extents[0].1),
                    vectors(&ops.k_codes, extents[1].1),
                    floats(&ops.q_scales, q_scales_len),
                    floats(&ops.k_scales, k_scales_len),
                    shift,
                    vectors(v, extents[2].1),
                    vectors(o, extents[3].1),
                    ArrayArg::from_raw_parts(lse_handle, lse_elems as usize),
                    shape,
                    scale_shape,
                    cfg,
                    icfg,
                )
            }
        };
    }
    match (v_elem, tiles.stage_f32) {
        (ElemType::F32, _) => go!(f32, f32),
        (ElemType::F16, true) => go!(f16, f32),
        (ElemType::F16, false) => go!(f16, f16),
        (ElemType::Bf16, _) => unreachable!("refused above"),
    }
    Ok(info)
}

/// The vectorized FMA kernel when the problem allows it, else the scalar one.
#[allow(clippy::too_many_arguments)]
fn launch_fma_any<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    match fma_vec_tiles(client, args, elem, options) {
        Ok(tiles) => launch_fma_vec(client, args, elem, options, tiles, q, k, v, o, lse),
        Err(reason) => {
            if options.fma_vec_tiles.is_some() {
                return Err(LaunchError::VariantUnavailable { variant: "portable_fma_vec", reason });
            }
            log::debug!("vectorized FMA kernel not used: {reason}");
            launch_fma(client, args, elem, options, q, k, v, o, lse)
        }
    }
}

/// The vectorized FMA kernel's tiling for this problem, or why it cannot run it.
pub(crate) fn fma_vec_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<FmaVecTiles, String> {
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    check_vector_layout(args)?;
    let tiles = match options.fma_vec_tiles {
        Some(t) => {
            t.validate(d, dv).map_err(|e| e.to_string())?;
            t
        }
        None => select_fma_vec_tiles(d, dv, bytes, hw.max_shared_memory_size, hw.max_units_per_cube)
            .ok_or_else(|| "no vector tiling fits".to_string())?,
    };
    let smem = tiles.smem_bytes(d, dv, bytes) as usize;
    if smem > hw.max_shared_memory_size {
        return Err(format!("{tiles} needs {smem} bytes of shared memory, {} available", hw.max_shared_memory_size));
    }
    if tiles.units() > hw.max_units_per_cube {
        return Err(format!("{tiles} needs {} units per cube", tiles.units()));
    }
    Ok(tiles)
}

/// Why the 4-wide vector kernels (`fma_vec`, `fma_half`) cannot read these tensors, if they
/// cannot: every head dim and stride must be a multiple of 4, and no tensor empty (an empty
/// tensor's stand-in buffer holds one element, not one vector).
fn check_vector_layout(args: &AttentionArgs) -> Result<(), String> {
    let mut all = vec![args.head_dim, args.v_head_dim];
    for strides in [args.q_strides, args.k_strides, args.v_strides, args.o_strides] {
        all.extend(strides);
    }
    if all.iter().any(|x| x % fma_vec_width() != 0) {
        return Err("a head dim or stride is not a multiple of 4".into());
    }
    if args.extents().iter().any(|&(_, elems)| elems < fma_vec_width() as u64) {
        return Err("an empty tensor".into());
    }
    Ok(())
}

const fn fma_vec_width() -> u32 {
    crate::kernel::fma_vec::W as u32
}

#[allow(clippy::too_many_arguments)]
fn launch_fma_vec<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    tiles: FmaVecTiles,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    let cube_count = (args.q_len.div_ceil(tiles.bq), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;
    let plane_reduce = plane_reduce_ok(client, options, tiles.tc);
    let loads = options.kv_loads.unwrap_or_default();
    let cfg = FmaVecConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
        tile_checked: loads == KvLoads::TileChecked,
        prefetch: loads == KvLoads::Prefetch,
    };
    let dims = if d == dv { format!("d{d}") } else { format!("d{d}v{dv}") };
    let info = LaunchInfo {
        kernel: format!("portable_fma_vec_{}_{dims}_{tiles}{}", elem_name(elem), loads.suffix()),
        variant: Variant::PortableFma,
        cube_count,
        units_per_cube: tiles.units(),
        shared_memory_bytes: tiles.smem_bytes(d, dv, bytes) as usize,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
        launched: cube_count.0 > 0 && cube_count.1 > 0 && cube_count.2 > 0,
    };
    if !info.launched {
        return Ok(info);
    }
    log::debug!("launching {} {:?} for {:?}", info.kernel, cfg, args);

    let width = fma_vec_width() as usize;
    let extents = args.extents();
    let vectors = |handle: &Handle, elems: u64| {
        // SAFETY: `check_buffers` proved the handle covers `elems` elements; the kernel reads
        // and writes whole vectors inside rows, and every row start is a multiple of 4.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(width).max(1)) }
    };
    let (lse_handle, lse_elems) = lse_binding(client, args, lse);
    let count = CubeCount::Static(cube_count.0, cube_count.1, cube_count.2);
    let dim = CubeDim::new_1d(tiles.units());
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were
            // checked to cover the strided extents.
            unsafe {
                fwd_portable_fma_vec::launch_unchecked::<$e, $s, R>(
                    client,
                    count,
                    dim,
                    width,
                    vectors(q, extents[0].1),
                    vectors(k, extents[1].1),
                    vectors(v, extents[2].1),
                    vectors(o, extents[3].1),
                    ArrayArg::from_raw_parts(lse_handle, lse_elems as usize),
                    shape_arg(args),
                    cfg,
                )
            }
        };
    }
    match (elem, tiles.stage_f32) {
        (ElemType::F32, _) => go!(f32, f32),
        (ElemType::F16, true) => go!(f16, f32),
        (ElemType::F16, false) => go!(f16, f16),
        (ElemType::Bf16, true) => go!(bf16, f32),
        (ElemType::Bf16, false) => go!(bf16, bf16),
    }
    Ok(info)
}

/// Whether the packed-f16 kernel gives K and V separate stages: as asked, else where they fit.
pub(crate) fn half_split_kv(tiles: &FmaVecTiles, d: u32, dv: u32, options: &LaunchOptions, max_shared: usize) -> bool {
    options.split_kv.unwrap_or(tiles.smem_bytes_half_split(d, dv) as usize <= max_shared)
}

fn half_smem(tiles: &FmaVecTiles, d: u32, dv: u32, split_kv: bool) -> usize {
    if split_kv {
        tiles.smem_bytes_half_split(d, dv) as usize
    } else {
        tiles.smem_bytes_half(d, dv) as usize
    }
}

/// The packed-f16 FMA kernel's tiling for these arguments and `options.accumulation` (not
/// f32), or why it cannot run them: f16 inputs, the FMA family (or `Auto`), a two-stage chunk
/// that divides the head dim, 4-aligned head dims and strides, a tiling that fits. Its `bq` /
/// `bk` are the query block and KV tile the CPU emulation must follow.
pub fn half_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<FmaVecTiles, LaunchError> {
    let unavailable = |reason: String| LaunchError::VariantUnavailable { variant: "portable_fma_half", reason };
    if elem != ElemType::F16 {
        return Err(unavailable(format!("f16 accumulation needs f16 inputs, not {elem:?}")));
    }
    if !matches!(options.variant, Variant::Auto | Variant::PortableFma) {
        return Err(LaunchError::VariantUnavailable {
            variant: options.variant.name(),
            reason: "it accumulates in f32 only; f16 accumulation runs on the packed-f16 FMA kernel".into(),
        });
    }
    let (d, dv) = (args.head_dim, args.v_head_dim);
    if let QkAccumulation::TwoStage { chunk } = options.accumulation.qk {
        if chunk == 0 || !d.is_multiple_of(chunk) {
            return Err(LaunchError::InvalidProblem {
                reason: format!("the two-stage chunk {chunk} does not divide the head dim {d}"),
            });
        }
    }
    check_vector_layout(args).map_err(unavailable)?;
    let hw = &client.properties().hardware;
    let tiles = match options.fma_vec_tiles {
        Some(t) => {
            t.validate(d, dv)?;
            if t.stage_f32 {
                return Err(LaunchError::InvalidTiles { tiles: t.to_string(), reason: "the packed-f16 kernel stages in f16".into() });
            }
            t
        }
        None => select_fma_half_tiles(d, dv, hw.max_shared_memory_size, hw.max_units_per_cube)
            .ok_or_else(|| unavailable("no tiling fits".into()))?,
    };
    let split_kv = half_split_kv(&tiles, d, dv, options, hw.max_shared_memory_size);
    let smem = half_smem(&tiles, d, dv, split_kv);
    if smem > hw.max_shared_memory_size {
        return Err(LaunchError::SharedMemoryExceeded {
            kernel: format!("portable_fma_half_{tiles}{}", if split_kv { "_split" } else { "" }),
            required: smem,
            available: hw.max_shared_memory_size,
        });
    }
    if tiles.units() > hw.max_units_per_cube {
        return Err(LaunchError::TooManyUnits {
            kernel: format!("portable_fma_half_{tiles}"),
            required: tiles.units(),
            available: hw.max_units_per_cube,
        });
    }
    Ok(tiles)
}

#[allow(clippy::too_many_arguments)]
fn launch_fma_half<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    options: &LaunchOptions,
    tiles: FmaVecTiles,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let cube_count = (args.q_len.div_ceil(tiles.bq), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;
    let plane_reduce = plane_reduce_ok(client, options, tiles.tc);
    let acc = options.accumulation;
    // A stale max lets p reach 2^8: a tile's f16 P·V sum could overflow (see fma_half.rs).
    let lazy_rescale = options.lazy_rescale && !acc.pv_f16;
    let loads = options.kv_loads.unwrap_or_default();
    let cfg = FmaVecConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale,
        plane_reduce,
        tile_checked: loads == KvLoads::TileChecked,
        prefetch: loads == KvLoads::Prefetch,
    };
    let split_kv = half_split_kv(&tiles, d, dv, options, hw.max_shared_memory_size);
    let half = HalfConfig { qk_chunk: acc.qk_chunk(d) as usize, pv_f16: acc.pv_f16, split_kv };
    let dims = if d == dv { format!("d{d}") } else { format!("d{d}v{dv}") };
    let qk = match acc.qk {
        QkAccumulation::F32 => String::new(),
        QkAccumulation::F16 => "_qk16".into(),
        QkAccumulation::TwoStage { chunk } => format!("_qk2s{chunk}"),
    };
    let pv = if acc.pv_f16 { "_pv16" } else { "" };
    let info = LaunchInfo {
        kernel: format!(
            "portable_fma_half{qk}{pv}_{dims}_{tiles}{}{}",
            loads.suffix(),
            if split_kv { "_split" } else { "" }
        ),
        variant: Variant::PortableFma,
        cube_count,
        units_per_cube: tiles.units(),
        shared_memory_bytes: half_smem(&tiles, d, dv, split_kv),
        lazy_rescale,
        plane_reduce,
        launched: cube_count.0 > 0 && cube_count.1 > 0 && cube_count.2 > 0,
    };
    if !info.launched {
        return Ok(info);
    }
    log::debug!("launching {} {:?} {:?} for {:?}", info.kernel, cfg, half, args);

    let width = fma_vec_width() as usize;
    let extents = args.extents();
    let vectors = |handle: &Handle, elems: u64| {
        // SAFETY: as in `launch_fma_vec`: `check_buffers` proved the extents, rows are 4-aligned.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(width).max(1)) }
    };
    let (lse_handle, lse_elems) = lse_binding(client, args, lse);
    // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were checked to
    // cover the strided extents.
    unsafe {
        fwd_portable_fma_half::launch_unchecked::<f16, R>(
            client,
            CubeCount::Static(cube_count.0, cube_count.1, cube_count.2),
            CubeDim::new_1d(tiles.units()),
            width,
            vectors(q, extents[0].1),
            vectors(k, extents[1].1),
            vectors(v, extents[2].1),
            vectors(o, extents[3].1),
            ArrayArg::from_raw_parts(lse_handle, lse_elems as usize),
            shape_arg(args),
            cfg,
            half,
        )
    }
    Ok(info)
}

#[allow(clippy::too_many_arguments)]
fn launch_fma<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let props = client.properties();
    let hw = &props.hardware;
    // Shared-memory stages hold the input element type.
    let stage_bytes = elem.size_bytes() as u32;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let tiles = fma_scalar_tiles(client, args, elem, options)?;

    let kernel = fma_kernel_name(d, dv, &tiles);
    let smem = tiles.smem_bytes(d, dv, stage_bytes) as usize;
    if smem > hw.max_shared_memory_size {
        return Err(LaunchError::SharedMemoryExceeded { kernel, required: smem, available: hw.max_shared_memory_size });
    }
    if tiles.units() > hw.max_units_per_cube {
        return Err(LaunchError::TooManyUnits { kernel, required: tiles.units(), available: hw.max_units_per_cube });
    }

    let cube_count = (args.q_len.div_ceil(tiles.bq), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;

    let plane_reduce = plane_reduce_ok(client, options, tiles.tc);

    let cfg = FmaConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
    };

    let info = LaunchInfo {
        kernel,
        variant: Variant::PortableFma,
        cube_count,
        units_per_cube: tiles.units(),
        shared_memory_bytes: smem,
        lazy_rescale: options.lazy_rescale,
        plane_reduce,
        launched: cube_count.0 > 0 && cube_count.1 > 0 && cube_count.2 > 0,
    };
    if !info.launched {
        log::debug!("{}: empty problem, nothing launched", info.kernel);
        return Ok(info);
    }
    log::debug!("launching {} {:?} for {:?}", info.kernel, cfg, args);

    let extents = args.extents();
    let array = |handle: &Handle, elems: u64| {
        // SAFETY: `check_buffers` proved the handle holds at least `elems` elements, and the
        // kernel never indexes past the extent of the strided view.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), elems.max(1) as usize) }
    };
    let (lse_handle, lse_elems) = lse_binding(client, args, lse);

    let shape = shape_arg(args);

    let count = CubeCount::Static(cube_count.0, cube_count.1, cube_count.2);
    let dim = CubeDim::new_1d(tiles.units());
    macro_rules! go {
        ($e:ty) => {
            // SAFETY: every global index is bounds-checked in the kernel against q_len/kv_len,
            // and the buffers were checked to cover the strided extents above.
            unsafe {
                fwd_portable_fma::launch_unchecked::<$e, R>(
                    client,
                    count,
                    dim,
                    array(q, extents[0].1),
                    array(k, extents[1].1),
                    array(v, extents[2].1),
                    array(o, extents[3].1),
                    ArrayArg::from_raw_parts(lse_handle, lse_elems as usize),
                    shape,
                    cfg,
                )
            }
        };
    }
    match elem {
        ElemType::F32 => go!(f32),
        ElemType::F16 => go!(f16),
        ElemType::Bf16 => go!(bf16),
    }
    Ok(info)
}

/// Row reductions may use plane shuffles only when the runtime has them, the caller allows
/// them, and the `tc` units of a row fit in every plane.
fn plane_reduce_ok<R: Runtime>(client: &ComputeClient<R>, options: &LaunchOptions, tc: u32) -> bool {
    options.allow_plane_ops
        && client.features().plane.contains(Plane::Ops)
        && client.properties().hardware.plane_size_min >= tc
}

/// The LSE binding: the caller's buffer, or (the kernels always bind one) a 1-element scratch.
fn lse_binding<R: Runtime>(client: &ComputeClient<R>, args: &AttentionArgs, lse: Option<&Handle>) -> (Handle, u64) {
    let handle = match lse {
        Some(handle) => handle.clone(),
        None => client.empty(4),
    };
    (handle, if args.write_lse { args.lse_len() } else { 1 })
}

fn shape_arg<R: Runtime>(args: &AttentionArgs) -> AttnShapeLaunch<R> {
    AttnShapeLaunch::new(
        args.q_len,
        args.kv_len,
        args.group_size(),
        args.q_heads,
        args.q_strides[0],
        args.q_strides[1],
        args.q_strides[2],
        args.k_strides[0],
        args.k_strides[1],
        args.k_strides[2],
        args.v_strides[0],
        args.v_strides[1],
        args.v_strides[2],
        args.o_strides[0],
        args.o_strides[1],
        args.o_strides[2],
        args.scale,
        f32::NEG_INFINITY,
    )
}

/// Checks the grid against the runtime limit.
pub(crate) fn check_grid(cube_count: (u32, u32, u32), max: (u32, u32, u32)) -> Result<(), LaunchError> {
    if cube_count.0 > max.0 || cube_count.1 > max.1 || cube_count.2 > max.2 {
        return Err(LaunchError::TooManyCubes { x: cube_count.0, y: cube_count.1, z: cube_count.2, max });
    }
    Ok(())
}

/// Widest global load (in elements, up to 16 bytes) that every row start of Q, K and V is
/// aligned to: the head dims and all (batch, head, seq) strides must be multiples of it.
fn load_vector_width(args: &AttentionArgs, elem: ElemType) -> usize {
    let max = 16 / elem.size_bytes() as u32;
    let mut all = vec![args.head_dim, args.v_head_dim];
    all.extend(args.q_strides);
    all.extend(args.k_strides);
    all.extend(args.v_strides);
    let mut width = max;
    while width > 1 && all.iter().any(|&x| x % width != 0) {
        width /= 2;
    }
    width as usize
}

/// The end of a matrix-unit launch (cmma, mma), after the tiling and the config: the launch
/// record (returned without launching on an empty grid), then Q, K, V bound as `vec`-wide
/// vectors, O and LSE as elements, and the kernel launched for the element type (f16 / bf16;
/// f32 inputs are refused). The kernel guards every global index by q_len / kv_len.
macro_rules! launch_matrix_kernel {
    ($kernel_fn:ident, $name:literal, $variant:expr, $client:expr, $args:expr, $elem:expr, $options:expr,
     $units:expr, $smem:expr, $cube_count:expr, $vec:expr, $cfg:expr, $kernel:expr,
     $q:expr, $k:expr, $v:expr, $o:expr, $lse:expr) => {{
        let (client, args, vec, cube_count) = ($client, $args, $vec, $cube_count);
        let info = LaunchInfo {
            kernel: $kernel,
            variant: $variant,
            cube_count,
            units_per_cube: $units,
            shared_memory_bytes: $smem,
            lazy_rescale: $options.lazy_rescale,
            plane_reduce: true,
            launched: cube_count.0 > 0 && cube_count.1 > 0 && cube_count.2 > 0,
        };
        if !info.launched {
            return Ok(info);
        }
        log::debug!("launching {} {:?} for {:?}", info.kernel, $cfg, args);
        let extents = args.extents();
        let vectors = |handle: &Handle, elems: u64| {
            // SAFETY: `check_buffers` proved the handle covers `elems` elements; the kernel reads
            // whole vectors inside rows, and every row start is a multiple of `vec`.
            unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(vec).max(1)) }
        };
        let (lse_handle, lse_elems) = lse_binding(client, args, $lse);
        let count = CubeCount::Static(cube_count.0, cube_count.1, cube_count.2);
        let dim = CubeDim::new_1d($units);
        macro_rules! go {
            ($e:ty) => {
                // SAFETY: every buffer was checked against the extents above, and the kernel
                // guards its global indices by q_len / kv_len.
                unsafe {
                    $kernel_fn::launch_unchecked::<$e, _>(
                        client,
                        count,
                        dim,
                        vec,
                        vectors($q, extents[0].1),
                        vectors($k, extents[1].1),
                        vectors($v, extents[2].1),
                        ArrayArg::from_raw_parts($o.clone(), extents[3].1.max(1) as usize),
                        ArrayArg::from_raw_parts(lse_handle, lse_elems as usize),
                        shape_arg(args),
                        $cfg,
                    )
                }
            };
        }
        match $elem {
            ElemType::F16 => go!(f16),
            ElemType::Bf16 => go!(bf16),
            ElemType::F32 => {
                return Err(LaunchError::VariantUnavailable { variant: $name, reason: "f32 inputs".into() })
            }
        }
        Ok(info)
    }};
}

#[allow(clippy::too_many_arguments)]
fn launch_cmma<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    let tiles = resolve_cmma_tiles(client, args, elem, options)?;
    let dims = if d == dv { format!("d{d}") } else { format!("d{d}v{dv}") };
    let kernel = format!("cmma_{}_{dims}_bq{}_bk{}", elem_name(elem), tiles.bq(), tiles.bk);
    let smem = tiles.smem_bytes(d, dv, bytes) as usize;
    if smem > hw.max_shared_memory_size {
        return Err(LaunchError::SharedMemoryExceeded { kernel, required: smem, available: hw.max_shared_memory_size });
    }
    let cube_count = (args.q_len.div_ceil(tiles.bq()), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;

    let vec = load_vector_width(args, elem);
    let cfg = CmmaConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        warps: tiles.warps as usize,
        bk: tiles.bk as usize,
        vec,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: options.lazy_rescale,
    };
    debug_assert!(cfg.buffers_aligned(bytes as usize));
    debug_assert_eq!(cfg.smem_bytes(bytes as usize), smem, "tiling formula vs kernel buffers");
    launch_matrix_kernel!(fwd_cmma, "cmma", Variant::Cmma, client, args, elem, options, tiles.units(), smem, cube_count, vec, cfg, kernel, q, k, v, o, lse)
}

#[allow(clippy::too_many_arguments)]
fn launch_mma<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let hw = &client.properties().hardware;
    let (d, dv) = (args.head_dim, args.v_head_dim);
    let bytes = elem.size_bytes() as u32;
    let tiles = resolve_mma_tiles(client, args, elem, options)?;
    let dims = if d == dv { format!("d{d}") } else { format!("d{d}v{dv}") };
    let kernel = format!("mma_{}_{dims}_{tiles}", elem_name(elem));
    let smem = tiles.smem_bytes(d, dv, bytes) as usize;
    if smem > hw.max_shared_memory_size {
        return Err(LaunchError::SharedMemoryExceeded { kernel, required: smem, available: hw.max_shared_memory_size });
    }
    if tiles.units() > hw.max_units_per_cube {
        return Err(LaunchError::TooManyUnits { kernel, required: tiles.units(), available: hw.max_units_per_cube });
    }
    let cube_count = (args.q_len.div_ceil(tiles.bq()), args.q_heads, args.batch);
    check_grid(cube_count, hw.max_cube_count)?;

    let vec = load_vector_width(args, elem);
    let cfg = MmaFwdConfig {
        head_dim: d as usize,
        v_head_dim: dv as usize,
        warps: tiles.warps as usize,
        mt: tiles.mt as usize,
        bk: tiles.bk as usize,
        vec,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: options.lazy_rescale,
    };
    debug_assert_eq!(cfg.smem_bytes(bytes as usize), smem, "tiling formula vs kernel buffers");
    launch_matrix_kernel!(fwd_mma, "mma", Variant::Mma, client, args, elem, options, tiles.units(), smem, cube_count, vec, cfg, kernel, q, k, v, o, lse)
}

fn elem_name(elem: ElemType) -> &'static str {
    match elem {
        ElemType::F32 => "f32",
        ElemType::F16 => "f16",
        ElemType::Bf16 => "bf16",
    }
}

fn fma_kernel_name(d: u32, dv: u32, tiles: &FmaTiles) -> String {
    let dims = if d == dv {
        format!("d{d}")
    } else {
        format!("d{d}v{dv}")
    };
    format!("portable_fma_{dims}_bq{}_bk{}", tiles.bq, tiles.bk)
}
