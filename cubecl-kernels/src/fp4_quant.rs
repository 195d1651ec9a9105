//! NVFP4 quantization on the device (host side): validation, buffers, the two launches of
//! `kernel::quant_fp4`. The output is the CPU codec's `Nvfp4Tensor` bit for bit (`packed`,
//! `block_scales`, `tensor_scale`), as [`launch_fp4`](crate::launch_fp4) reads it.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::error::LaunchError;
use crate::kernel::quant_fp4::{nvfp4_quantize_blocks, nvfp4_tensor_scale, scales_from_blocked as blocked_kernel, AMAX_UNITS, BLOCKS_PER_UNIT, BLOCK_UNITS};
use crate::launch::{check_extent, check_grid};

/// Elements per UE4M3 block scale.
const BLOCK: usize = 16;

/// A row-major `[rows, cols]` tensor in NVFP4 on the device.
#[derive(Debug, Clone)]
pub struct Nvfp4DeviceTensor {
    pub rows: usize,
    pub cols: usize,
    /// E2M1 codes, two per byte (element `2i` in the low nibble), `rows · cols / 2` bytes
    /// padded to whole words.
    pub packed: Handle,
    /// UE4M3 codes `[rows, cols / 16]`, padded to whole words.
    pub block_scales: Handle,
    /// One f32.
    pub tensor_scale: Handle,
}

/// Quantizes the f32 `[rows, cols]` row-major tensor in `x` to NVFP4 on the client's stream
/// (two launches; everything is validated before anything is enqueued). Input must be finite:
/// the kernels cannot refuse NaN or infinity as the CPU codec does.
pub fn quantize_nvfp4<R: Runtime>(client: &ComputeClient<R>, x: &Handle, rows: usize, cols: usize) -> Result<Nvfp4DeviceTensor, LaunchError> {
    if !cols.is_multiple_of(BLOCK) {
        return Err(LaunchError::InvalidProblem { reason: format!("NVFP4 needs cols % {BLOCK} == 0, got {cols}") });
    }
    let n = rows.checked_mul(cols).filter(|&n| n <= u32::MAX as usize).ok_or(LaunchError::TooLarge { what: "NVFP4 element count", value: rows.saturating_mul(cols) })?;
    check_extent("x", n as u64, 4, x)?;
    let blocks = n / BLOCK;
    let units = blocks.div_ceil(BLOCKS_PER_UNIT);
    let cubes = units.div_ceil(BLOCK_UNITS) as u32;
    check_grid((cubes.max(1), 1, 1), client.properties().hardware.max_cube_count)?;
    let max_units = client.properties().hardware.max_units_per_cube;
    if AMAX_UNITS as u32 > max_units {
        return Err(LaunchError::TooManyUnits { kernel: "nvfp4_tensor_scale".into(), required: AMAX_UNITS as u32, available: max_units });
    }
    let code_words = blocks * 2;
    let scale_words = units;
    let out = Nvfp4DeviceTensor {
        rows,
        cols,
        packed: client.empty(4 * code_words.max(1)),
        block_scales: client.empty(4 * scale_words.max(1)),
        tensor_scale: client.empty(4),
    };
    log::debug!("quantize_nvfp4 [{rows}, {cols}]");
    // SAFETY: `x` holds `n` floats (checked); the scale cube reads indices below `n` and writes
    // one float.
    unsafe {
        nvfp4_tensor_scale::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(AMAX_UNITS as u32),
            ArrayArg::from_raw_parts(x.clone(), n.max(1)),
            ArrayArg::from_raw_parts(out.tensor_scale.clone(), 1),
            n as u32,
        )
    };
    if blocks > 0 {
        // SAFETY: unit g < units reads blocks 4g.. (below `blocks`, 16 floats each) and writes
        // code words 2b, 2b+1 and scale word g, all allocated above.
        unsafe {
            nvfp4_quantize_blocks::launch_unchecked::<R>(
                client,
                CubeCount::Static(cubes, 1, 1),
                CubeDim::new_1d(BLOCK_UNITS as u32),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(out.tensor_scale.clone(), 1),
                ArrayArg::from_raw_parts(out.packed.clone(), code_words),
                ArrayArg::from_raw_parts(out.block_scales.clone(), scale_words),
                blocks as u32,
            )
        };
    }
    Ok(out)
}

/// Rows of one block of the 128x4-blocked scale layout.
pub const SCALE_BLOCK_ROWS: usize = 128;
/// Scale columns of one block of that layout.
pub const SCALE_BLOCK_COLS: usize = 4;

/// Bytes a `[rows, cols]` matrix of block-scale codes takes in the 128x4-blocked layout: rows
/// padded to 128 and columns to 4.
pub fn blocked_scale_bytes(rows: usize, cols: usize) -> usize {
    rows.div_ceil(SCALE_BLOCK_ROWS) * SCALE_BLOCK_ROWS * cols.div_ceil(SCALE_BLOCK_COLS) * SCALE_BLOCK_COLS
}

/// Byte offset of scale code `(r, c)` of a matrix with `cols` scale columns in the 128x4-blocked
/// layout that NVIDIA's block-scaled MMAs read their scale factors in (cuBLAS's and CUTLASS's
/// layout for NVFP4 and MXFP4 operands): the matrix is cut into blocks of 128 rows by 4 columns,
/// stored one after another along the columns, then along the rows (512 bytes each); inside a
/// block, row `r` and column `c` sit at `(r % 32) · 16 + (r / 32) · 4 + c`.
pub fn blocked_scale_offset(r: usize, c: usize, cols: usize) -> usize {
    let col_blocks = cols.div_ceil(SCALE_BLOCK_COLS);
    ((r / SCALE_BLOCK_ROWS) * col_blocks + c / SCALE_BLOCK_COLS) * (SCALE_BLOCK_ROWS * SCALE_BLOCK_COLS)
        + (r % 32) * 16
        + ((r % SCALE_BLOCK_ROWS) / 32) * 4
        + c % SCALE_BLOCK_COLS
}

/// Converts a `[rows, cols]` matrix of scale codes from the 128x4-blocked layout
/// ([`blocked_scale_offset`]; `src` holds [`blocked_scale_bytes`] bytes) to row-major bytes
/// (`rows · cols`, padded to whole words), the layout the portable 4-bit kernels read, on the
/// client's stream. One launch; sizes are checked before it is enqueued.
pub fn scales_from_blocked<R: Runtime>(client: &ComputeClient<R>, src: &Handle, rows: usize, cols: usize) -> Result<Handle, LaunchError> {
    let blocked = blocked_scale_bytes(rows, cols);
    let n = rows.checked_mul(cols).ok_or(LaunchError::TooLarge { what: "scale count", value: usize::MAX })?;
    check_extent("blocked scales", blocked.div_ceil(4) as u64, 4, src)?;
    if n > u32::MAX as usize {
        return Err(LaunchError::TooLarge { what: "scale count", value: n });
    }
    let words = n.div_ceil(4);
    let dst = client.empty(4 * words.max(1));
    if words == 0 {
        return Ok(dst);
    }
    const UNITS: usize = 256;
    let cubes = words.div_ceil(UNITS) as u32;
    check_grid((cubes, 1, 1), client.properties().hardware.max_cube_count)?;
    log::debug!("scales_from_blocked [{rows}, {cols}]");
    // SAFETY: `src` holds the blocked layout's whole words (checked), every offset computed for
    // (r < rows, c < cols) lies inside it; unit w < words writes word w of `dst`.
    unsafe {
        blocked_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            ArrayArg::from_raw_parts(src.clone(), blocked.div_ceil(4)),
            ArrayArg::from_raw_parts(dst.clone(), words),
            rows as u32,
            cols as u32,
        )
    };
    Ok(dst)
}
