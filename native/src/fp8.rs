//! Argument checks shared by the native FP8 families (`wgmma_fp8`, `mma_fp8`): both take e4m3
//! codes in (batch, head, seq) strides with per-tensor or per-head descales and the same grid.

use quattn_core::{DescaleGranularity, Strides};

use crate::error::{NativeError, Result};

/// The checks every native FP8 launch shares. `keys_i32` is the longest key row the device
/// indexes in i32 (the family's padded Vᵀ row); `empty_kv` says whether `kv_len == 0` is legal.
/// Code strides (Q, K, V) must be multiples of 16 elements (16-byte copies of 8-bit rows), O's of
/// 8 (16-byte stores of 16-bit elements).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_args(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    empty_kv: bool,
    keys_i32: usize,
    scale: f32,
    descale: DescaleGranularity,
    strides: [&Strides; 4],
) -> Result<()> {
    let bad = |m: String| Err(NativeError::InvalidArgs(m));
    if descale == DescaleGranularity::PerBlock {
        return bad("per-block descales are not supported by this family (per tensor or per head)".into());
    }
    if batch == 0 || q_heads == 0 || kv_heads == 0 || q_len == 0 || (kv_len == 0 && !empty_kv) {
        return bad(format!("empty problem: batch {batch}, heads {q_heads}/{kv_heads}, lengths {q_len}/{kv_len}"));
    }
    if !q_heads.is_multiple_of(kv_heads) {
        return bad(format!("q_heads {q_heads} not a multiple of kv_heads {kv_heads}"));
    }
    if q_len > i32::MAX as usize || keys_i32 > i32::MAX as usize {
        return bad("sequence length exceeds i32".into());
    }
    if q_heads > 65535 || batch > 65535 {
        return bad(format!("batch {batch} / heads {q_heads} exceed the grid limit 65535"));
    }
    if !(scale.is_finite() && scale > 0.0) {
        return bad(format!("softmax scale must be finite and > 0, got {scale}"));
    }
    for ((name, s), align) in ["q", "k", "v", "o"].into_iter().zip(strides).zip([16, 16, 16, 8]) {
        if [s.batch, s.head, s.seq].iter().any(|&x| x % align != 0) {
            return bad(format!("{name} strides {s:?} must be multiples of {align} elements"));
        }
    }
    Ok(())
}
