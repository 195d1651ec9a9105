//! INT8 quantization prepass of Q and K (SageAttention style), host side: validation, buffers,
//! launches. The recipe is the CPU codec's (`quattn::codec::int8`), bit for bit:
//!
//! - `scale = amax / 127` (a correctly rounded f32 division) over the elements sharing it;
//!   `amax == 0` gives `scale = 1`. Code `clamp(rne(x / scale), -127, 127)` with a correctly
//!   rounded quotient. The stored Q scale is `scale * (softmax_scale * log2 e)` (one f32
//!   multiply after the codes are computed), so `dot · (q_scale · k_scale)` is the base-2 logit.
//! - Q scales per Q head, `[batch, q_heads, nqb]` (per block), `[.., nqb, warps]` (per warp),
//!   `[.., nqb, warps, 8]` (per thread: rows `g` and `g + 8` of each warp's 16 rows share
//!   group `g`); `nqb = ceil(q_len / block_q)`. K scales per KV head `[batch, kv_heads, nkb]`,
//!   one per `block_k` keys. A group with no existing row has scale 1 (folded for Q).
//! - Smoothing: `μ[b, kv_h, c]` = mean of K over the keys (f32, summed in a fixed order, per
//!   chunk of keys in one kernel then over the chunks in a second: it may differ from the CPU's
//!   f64 mean by a few f32 roundings), `K − μ` (one f32 subtraction) is
//!   quantized, and `lse_shift[b, h, i] = softmax_scale · Σ_c q[c]·μ[c]` (f32 `[batch, q_heads,
//!   q_len]`; each of the 8 lanes of a row sums its strided channels in order, then the lanes are
//!   added in lane order) is what the attention adds back to its LSE.
//!
//! Codes are bytes at the **same element offsets** as the source (same strides), packed
//! little-endian 4 per `u32` word (WGSL has no 8-bit type): the same buffer read as bytes is an
//! int8 tensor with the source's strides. Head dim and strides must be multiples of 4, so a word
//! never straddles two rows. Bytes of the buffer that belong to no row are left unwritten.
//!
//! Inputs are assumed finite (the CPU codec refuses non-finite values; a kernel cannot).

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_core::{AttentionShape, Dtype, Int8Blocking, Int8Granularity};

use crate::error::LaunchError;
use crate::kernel::quant::{
    k_mean_finish, k_mean_partial, quantize_rows, QuantConfig, QuantShapeLaunch, MEAN_CHUNK, MEAN_UNITS, QUANT_UNITS,
};
use crate::launch::{check_dtype_supported, check_extent, check_grid};
use crate::problem::Args;

/// Elements of the Q and K scale tensors of `blocking` for this problem.
pub(crate) fn scales_len(blocking: &Int8Blocking, args: &Args, granularity: Int8Granularity) -> (u64, u64) {
    let q = args.batch as u64
        * args.q_heads as u64
        * blocking.q_blocks(args.q_len as usize) as u64
        * blocking.q_slots(granularity) as u64;
    let k = args.batch as u64 * args.kv_heads as u64 * blocking.k_blocks(args.kv_len as usize) as u64;
    (q, k)
}

/// What the prepass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Int8Quant {
    pub granularity: Int8Granularity,
    pub blocking: Int8Blocking,
    /// Subtract the per-channel mean of K before quantizing it (and return the LSE shift).
    pub smooth_k: bool,
}

/// Device outputs of [`quantize_int8`] (the host codec's counterpart is the facade's
/// `codec::int8::Int8Operands`).
#[derive(Debug, Clone)]
pub struct Int8DeviceOperands {
    /// The prepass that produced them.
    pub quant: Int8Quant,
    /// Q codes: int8 bytes at Q's element offsets (same strides), 4 per `u32` word.
    pub q_codes: Handle,
    /// K codes, likewise at K's offsets.
    pub k_codes: Handle,
    /// f32 Q scales (folded), layout in the module docs.
    pub q_scales: Handle,
    /// f32 K scales `[batch, kv_heads, ceil(kv_len / block_k)]`.
    pub k_scales: Handle,
    /// f32 `μ` `[batch, kv_heads, head_dim]`, when smoothing.
    pub k_mean: Option<Handle>,
    /// f32 `[batch, q_heads, q_len]`, when smoothing: add to the LSE of the smoothed logits.
    pub lse_shift: Option<Handle>,
}

/// `softmax_scale · log2 e`, folded into the stored Q scales (the same f32 product as the CPU
/// codec's caller computes).
pub fn q_scale_fold(softmax_scale: f32) -> f32 {
    softmax_scale * core::f32::consts::LOG2_E
}

/// Quantizes Q and K (both `dtype`, in `shape`'s sizes and strides; V and O strides are ignored)
/// as the module docs say. Launches one to four kernels on the client's stream and returns
/// the new device buffers; everything is validated before anything is enqueued.
pub fn quantize_int8<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: Dtype,
    quant: &Int8Quant,
    q: &Handle,
    k: &Handle,
) -> Result<Int8DeviceOperands, LaunchError> {
    let args = &Args::new(shape)?;
    check_quant_args(args, quant)?;
    check_dtype_supported(client, dtype)?;
    let extents = args.extents();
    let bytes = dtype.size_bytes() as u64;
    check_extent("q", extents[0].1, bytes, q)?;
    check_extent("k", extents[1].1, bytes, k)?;
    let hw = &client.properties().hardware;
    let blocking = quant.blocking;
    let q_grid = (grid_len(blocking.q_blocks(args.q_len as usize))?, args.q_heads, args.batch);
    let k_grid = (grid_len(blocking.k_blocks(args.kv_len as usize))?, args.kv_heads, args.batch);
    check_grid(q_grid, hw.max_cube_count)?;
    check_grid(k_grid, hw.max_cube_count)?;
    let mean_chunks = mean_chunks(args.kv_len);
    check_grid((mean_chunks, args.kv_heads, args.batch), hw.max_cube_count)?;
    check_grid((mean_finish_cubes(args), 1, 1), hw.max_cube_count)?;
    let units = QUANT_UNITS.max(MEAN_UNITS) as u32;
    if units > hw.max_units_per_cube {
        return Err(LaunchError::TooManyUnits {
            kernel: "quantize_int8".into(),
            required: units,
            available: hw.max_units_per_cube,
        });
    }

    let (q_scales_len, k_scales_len) = scales_len(&blocking, args, quant.granularity);
    let buffer = |bytes: u64| client.empty((bytes as usize).max(4));
    let d = args.head_dim as usize;
    let out = Int8DeviceOperands {
        quant: *quant,
        q_codes: buffer(extents[0].1),
        k_codes: buffer(extents[1].1),
        q_scales: buffer(4 * q_scales_len),
        k_scales: buffer(4 * k_scales_len),
        k_mean: quant
            .smooth_k
            .then(|| buffer(4 * (args.batch as u64 * args.kv_heads as u64 * d as u64))),
        lse_shift: quant.smooth_k.then(|| buffer(4 * args.lse_len())),
    };
    log::debug!("quantize_int8 {quant:?} {dtype} for {args:?}");

    macro_rules! go {
        ($e:ty) => {
            launch_prepass::<$e, R>(client, args, quant, q, k, &out, q_grid, k_grid)
        };
    }
    match dtype {
        Dtype::F32 => go!(f32),
        Dtype::F16 => go!(f16),
        Dtype::Bf16 => go!(bf16),
    }
    Ok(out)
}

/// A grid extent from a block count.
fn grid_len(blocks: usize) -> Result<u32, LaunchError> {
    u32::try_from(blocks).map_err(|_| LaunchError::TooLarge { what: "INT8 block count", value: blocks })
}

/// Cubes of the K-mean partial sums along the key sequence (one per [`MEAN_CHUNK`] keys).
fn mean_chunks(kv_len: u32) -> u32 {
    kv_len.div_ceil(MEAN_CHUNK as u32)
}

/// Cubes of the K-mean finishing pass: one unit per 4 channels of each (batch, kv head).
fn mean_finish_cubes(args: &Args) -> u32 {
    let outputs = args.batch as u64 * args.kv_heads as u64 * (args.head_dim as u64 / 4);
    outputs.div_ceil(MEAN_UNITS as u64).min(u32::MAX as u64) as u32
}

/// Shape rules of the prepass (beyond those of [`Args::new`]).
pub(crate) fn check_quant_args(args: &Args, quant: &Int8Quant) -> Result<(), LaunchError> {
    quant.blocking.check(quant.granularity).map_err(|reason| LaunchError::InvalidProblem { reason })?;
    let mut all = vec![args.head_dim];
    all.extend(args.q_strides);
    all.extend(args.k_strides);
    if all.iter().any(|x| x % 4 != 0) {
        return Err(LaunchError::InvalidProblem {
            reason: format!(
                "INT8 codes are packed 4 per word: head_dim ({}) and the Q/K strides ({:?}, {:?}) must be multiples of 4",
                args.head_dim, args.q_strides, args.k_strides
            ),
        });
    }
    if args.head_dim as usize / 4 > MEAN_UNITS {
        return Err(LaunchError::InvalidProblem {
            reason: format!(
                "head_dim {} exceeds the prepass's {}",
                args.head_dim,
                4 * MEAN_UNITS
            ),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn launch_prepass<E: Float + CubeElement, R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    quant: &Int8Quant,
    q: &Handle,
    k: &Handle,
    out: &Int8DeviceOperands,
    q_grid: (u32, u32, u32),
    k_grid: (u32, u32, u32),
) {
    let d = args.head_dim as usize;
    let extents = args.extents();
    let blocking = quant.blocking;
    let vectors = |handle: &Handle, elems: u64| {
        // SAFETY: the caller checked that the handle covers `elems` elements; every row start
        // is a multiple of 4 and rows are read whole.
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(4).max(1)) }
    };
    let words = |handle: &Handle, elems: u64| {
        // SAFETY: the buffer was allocated with `elems` bytes (at least 4).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(4).max(1)) }
    };
    let floats = |handle: &Handle, len: u64| {
        // SAFETY: allocated with `4 * len` bytes (at least 4).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (len as usize).max(1)) }
    };
    let scratch = || client.empty(16);
    let mean_len = args.batch as u64 * args.kv_heads as u64 * d as u64;
    let (q_scales_len, k_scales_len) = scales_len(&blocking, args, quant.granularity);

    if let Some(mean) = &out.k_mean {
        if args.kv_len > 0 && args.batch > 0 && args.kv_heads > 0 {
            // Partial sums per chunk of keys, then their sum in chunk order.
            let chunks = mean_chunks(args.kv_len);
            let partial_len = mean_len * chunks as u64;
            let partial = client.empty(4 * partial_len as usize);
            let partial_arg = || {
                // SAFETY: `batch * kv_heads * chunks * d` floats, read as vectors of 4.
                unsafe { ArrayArg::from_raw_parts(partial.clone(), partial_len as usize / 4) }
            };
            // SAFETY: indices stay below kv_len rows of K and the partial-sum layout.
            unsafe {
                k_mean_partial::launch_unchecked::<E, R>(
                    client,
                    CubeCount::Static(chunks, args.kv_heads, args.batch),
                    CubeDim::new_1d(MEAN_UNITS as u32),
                    4,
                    vectors(k, extents[1].1),
                    partial_arg(),
                    args.kv_len,
                    args.k_strides[0],
                    args.k_strides[1],
                    args.k_strides[2],
                    d,
                )
            };
            let outputs = (mean_len / 4) as u32;
            // SAFETY: unit i < outputs reads `chunks` partial vectors of its (batch, head) and
            // writes mean vector i.
            unsafe {
                k_mean_finish::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(mean_finish_cubes(args), 1, 1),
                    CubeDim::new_1d(MEAN_UNITS as u32),
                    4,
                    partial_arg(),
                    ArrayArg::from_raw_parts(mean.clone(), (mean_len as usize).div_ceil(4).max(1)),
                    args.kv_len,
                    chunks,
                    outputs,
                    d,
                )
            };
        }
    }
    let mean_arg = || match &out.k_mean {
        // SAFETY: `batch * kv_heads * d` floats, read as vectors of 4.
        Some(mean) => unsafe {
            ArrayArg::from_raw_parts(mean.clone(), (mean_len as usize).div_ceil(4).max(1))
        },
        None => unsafe { ArrayArg::from_raw_parts(scratch(), 1) },
    };

    if k_grid.0 > 0 && k_grid.1 > 0 && k_grid.2 > 0 {
        let cfg = QuantConfig {
            head_dim: d,
            rows: blocking.block_k as usize,
            warps: 1,
            granularity: Int8Granularity::PerBlock,
            subtract_mean: quant.smooth_k,
            write_shift: false,
        };
        let shape = QuantShapeLaunch::new(
            args.kv_len,
            args.kv_heads,
            k_grid.0,
            args.k_strides[0],
            args.k_strides[1],
            args.k_strides[2],
            1,
            args.kv_heads,
            1.0,
            1.0,
        );
        // SAFETY: every row index is guarded by kv_len; codes and scales were allocated for
        // K's extent and the scale layout.
        unsafe {
            quantize_rows::launch_unchecked::<E, R>(
                client,
                CubeCount::Static(k_grid.0, k_grid.1, k_grid.2),
                CubeDim::new_1d(QUANT_UNITS as u32),
                4,
                vectors(k, extents[1].1),
                words(&out.k_codes, extents[1].1),
                floats(&out.k_scales, k_scales_len),
                mean_arg(),
                ArrayArg::from_raw_parts(scratch(), 1),
                shape,
                cfg,
            )
        };
    }

    if q_grid.0 > 0 && q_grid.1 > 0 && q_grid.2 > 0 {
        let cfg = QuantConfig {
            head_dim: d,
            rows: blocking.block_q as usize,
            warps: blocking.warps as usize,
            granularity: quant.granularity,
            subtract_mean: false,
            write_shift: quant.smooth_k,
        };
        let shape = QuantShapeLaunch::new(
            args.q_len,
            args.q_heads,
            q_grid.0,
            args.q_strides[0],
            args.q_strides[1],
            args.q_strides[2],
            args.group_size(),
            args.kv_heads,
            q_scale_fold(args.scale),
            args.scale,
        );
        let shift = match &out.lse_shift {
            // SAFETY: `batch * q_heads * q_len` floats.
            Some(h) => unsafe {
                ArrayArg::from_raw_parts(h.clone(), (args.lse_len() as usize).max(1))
            },
            None => unsafe { ArrayArg::from_raw_parts(scratch(), 1) },
        };
        // SAFETY: as for K; the shift is indexed by (batch, head, row < q_len).
        unsafe {
            quantize_rows::launch_unchecked::<E, R>(
                client,
                CubeCount::Static(q_grid.0, q_grid.1, q_grid.2),
                CubeDim::new_1d(QUANT_UNITS as u32),
                4,
                vectors(q, extents[0].1),
                words(&out.q_codes, extents[0].1),
                floats(&out.q_scales, q_scales_len),
                mean_arg(),
                shift,
                shape,
                cfg,
            )
        };
    }
}
