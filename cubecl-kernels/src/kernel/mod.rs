//! Device code: one file per kernel variant, plus what they share (the runtime shape, the
//! masking constants, the key ranges of a query tile).

// Inside `#[cube]` code, nested `if`s separate comptime from runtime conditions, and runtime
// integers have no `div_ceil`/`is_multiple_of`: the lints' rewrites would not expand.
#![allow(clippy::collapsible_if, clippy::manual_div_ceil, clippy::manual_is_multiple_of)]

use cubecl::prelude::*;

pub(crate) mod cmma;
pub(crate) mod decode;
pub(crate) mod decode_mma;
pub(crate) mod decode_mma_fp4;
pub(crate) mod decode_rows;
pub(crate) mod fma_half;
pub(crate) mod fma_vec;
pub(crate) mod fma_vec_fp8;
pub(crate) mod fma_vec_fp4;
pub(crate) mod fma_vec_int8;
pub(crate) mod fma_vec_mods;
pub(crate) mod mma;
pub(crate) mod mma_fp8;
#[cfg(all(test, feature = "cuda"))]
pub(crate) mod offline_cuda;
pub(crate) mod paged_append;
pub(crate) mod quant;
pub(crate) mod quant_fp4;

/// A client on the default wgpu adapter for the kernels' device tests (llvmpipe in CI, where
/// its absence is a failure); `None`, with a note, where this machine has no adapter.
#[cfg(test)]
pub(crate) fn wgpu_test_client() -> Option<ComputeClient<cubecl::wgpu::WgpuRuntime>> {
    let instance = wgpu::Instance::default();
    if cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all())).is_empty() {
        assert!(std::env::var_os("CI").is_none(), "no wgpu adapter under CI");
        println!("SKIPPED: no wgpu adapter");
        return None;
    }
    Some(cubecl::wgpu::WgpuRuntime::client(&cubecl::wgpu::WgpuDevice::DefaultDevice))
}

/// Row max of rows that have seen no key yet. Finite on purpose: WGSL has no infinity literal
/// and llvmpipe does not follow IEEE for `inf - inf`, so the kernel never computes with
/// infinities. Real scores are assumed to stay above `MASK_THRESHOLD`.
pub(crate) const NO_MAX: f32 = -1.0e30;
/// Masked scores are set to `NO_MAX`; anything below this is treated as masked.
pub(crate) const MASK_THRESHOLD: f32 = -1.0e29;
/// FA4 uses 8 in the log2 domain (a factor of 256 of headroom); we work in the natural-log
/// domain, so 8·ln 2.
pub(crate) const LAZY_RESCALE_THRESHOLD: f32 = 5.545_177;

/// Runtime shape of one launch. Strides are (batch, head, seq) in elements.
#[derive(CubeType, CubeLaunch)]
pub struct AttnShape {
    /// Query rows; in a variable-length launch, whose sequences bring their own lengths, the
    /// Q rows of the whole batch (`total_q`, the row stride of its LSE).
    pub q_len: u32,
    pub kv_len: u32,
    /// Query heads per KV head (GQA/MQA mapping).
    pub group: u32,
    pub q_heads: u32,
    pub q_s0: u32,
    pub q_s1: u32,
    pub q_s2: u32,
    pub k_s0: u32,
    pub k_s1: u32,
    pub k_s2: u32,
    pub v_s0: u32,
    pub v_s1: u32,
    pub v_s2: u32,
    pub o_s0: u32,
    pub o_s1: u32,
    pub o_s2: u32,
    /// Softmax scale (natural-log domain).
    pub scale: f32,
    /// LSE of rows that see no key. Passed in because WGSL cannot spell `-inf`.
    pub lse_empty: f32,
}

/// One sequence of a packed variable-length batch: its Q/O rows `[q_start, q_start + q_len)`
/// and K/V rows `[k_start, k_start + kv_len)` of token-major tensors, read from the cumulative
/// sequence lengths by [`seq_span`].
#[derive(CubeType, Clone, Copy)]
pub struct SeqSpan {
    pub q_start: usize,
    pub q_len: usize,
    pub k_start: usize,
    pub kv_len: usize,
}

/// The span of sequence `b`: `cu_q` and `cu_k` hold the batch's non-decreasing offsets from 0.
/// A decreasing pair reads as an empty sequence rather than wrapping around.
#[cube]
pub(crate) fn seq_span(cu_q: &Array<u32>, cu_k: &Array<u32>, b: usize) -> SeqSpan {
    let q_start = cu_q[b];
    let q_end = cu_q[b + 1];
    let k_start = cu_k[b];
    let k_end = cu_k[b + 1];
    SeqSpan {
        q_start: q_start as usize,
        q_len: select(q_end > q_start, q_end - q_start, 0u32) as usize,
        k_start: k_start as usize,
        kv_len: select(k_end > k_start, k_end - k_start, 0u32) as usize,
    }
}

/// Query rows of the cube's sequence: the shape's, or the packed sequence's.
#[cube]
pub(crate) fn seq_q_len(shape: &AttnShape, seq: &ComptimeOption<SeqSpan>) -> usize {
    #[comptime]
    match seq {
        ComptimeOption::Some(s) => s.q_len,
        ComptimeOption::None => shape.q_len as usize,
    }
}

/// Keys of the cube's sequence: the shape's, or the packed sequence's.
#[cube]
pub(crate) fn seq_kv_len(shape: &AttnShape, seq: &ComptimeOption<SeqSpan>) -> usize {
    #[comptime]
    match seq {
        ComptimeOption::Some(s) => s.kv_len,
        ComptimeOption::None => shape.kv_len as usize,
    }
}

/// Offset of the cube's sequence in Q or O: `batch · batch_stride`, or (packed) its first row
/// `q_start · row_stride`.
#[cube]
pub(crate) fn seq_q_offset(batch: usize, batch_stride: u32, row_stride: u32, seq: &ComptimeOption<SeqSpan>) -> usize {
    #[comptime]
    match seq {
        ComptimeOption::Some(s) => s.q_start * row_stride as usize,
        ComptimeOption::None => batch * batch_stride as usize,
    }
}

/// Offset of the cube's sequence in K or V: `batch · batch_stride`, or (packed) its first row
/// `k_start · row_stride`.
#[cube]
pub(crate) fn seq_k_offset(batch: usize, batch_stride: u32, row_stride: u32, seq: &ComptimeOption<SeqSpan>) -> usize {
    #[comptime]
    match seq {
        ComptimeOption::Some(s) => s.k_start * row_stride as usize,
        ComptimeOption::None => batch * batch_stride as usize,
    }
}

/// Index of row `row`'s LSE: `[batch, q_heads, q_len]`, or (packed) `[q_heads, total_q]` with
/// `total_q` in the shape's `q_len` (a launch parameter: no register held through the loop).
#[cube]
pub(crate) fn seq_lse_index(
    shape: &AttnShape,
    seq: &ComptimeOption<SeqSpan>,
    batch: usize,
    head: usize,
    q_len: usize,
    row: usize,
) -> usize {
    #[comptime]
    match seq {
        ComptimeOption::Some(s) => head * shape.q_len as usize + s.q_start + row,
        ComptimeOption::None => (batch * shape.q_heads as usize + head) * q_len + row,
    }
}

/// Key tiles of the query rows `[q0, q0+bq)`, as `(num_full, num_tiles)`: tiles `[0, num_full)`
/// are visible to every row and need no mask; tiles `[num_full, num_tiles)` are cut by the
/// causal diagonal or by the end of the keys; later tiles are above the diagonal and skipped.
#[cube]
pub(crate) fn cube_key_ranges(
    q0: usize,
    q_len: usize,
    kv_len: usize,
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] causal: bool,
) -> (usize, usize) {
    let mut kv_end = kv_len;
    let mut full_keys = kv_len;
    if causal {
        // Bottom-right: row i sees keys j <= i + kv_len - q_len. The last row of the tile sees
        // keys < q_end + kv_len - q_len, the first row keys < q0 + 1 + kv_len - q_len; kept in
        // unsigned arithmetic.
        let q_end = min(q0 + bq, q_len);
        let last_vis = q_end + kv_len;
        let first_vis = q0 + 1 + kv_len;
        kv_end = select(last_vis > q_len, min(last_vis - q_len, kv_len), 0);
        full_keys = select(first_vis > q_len, min(first_vis - q_len, kv_len), 0);
    }
    (full_keys / bk, (kv_end + bk - 1) / bk)
}

/// Whether query `row` sees `key`: inside the keys and, when causal, on or below the
/// bottom-right diagonal (`key <= row + kv_len - q_len`, kept in unsigned arithmetic).
#[cube]
pub(crate) fn is_visible(row: usize, key: usize, q_len: usize, kv_len: usize, #[comptime] causal: bool) -> bool {
    let mut visible = key < kv_len;
    if causal {
        visible = visible && key + q_len <= row + kv_len;
    }
    visible
}
