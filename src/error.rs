//! The one error type of the facade. Every invalid input gets its own variant that names the
//! problem; nothing in the library panics on bad input.

use crate::{Device, Precision, Strategy};

/// Which tensor an error talks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorName {
    Q,
    K,
    V,
    Output,
    Lse,
}

impl std::fmt::Display for TensorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TensorName::Q => "Q",
            TensorName::K => "K",
            TensorName::V => "V",
            TensorName::Output => "O",
            TensorName::Lse => "LSE",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("dimension `{name}` is zero: every size of an attention problem must be at least 1")]
    ZeroSize { name: &'static str },

    #[error("GQA ratio is not an integer: q_heads = {q_heads} is not a multiple of kv_heads = {kv_heads}")]
    GqaRatio { q_heads: usize, kv_heads: usize },

    #[error("softmax scale {scale} is not a finite number")]
    NonFiniteScale { scale: f32 },

    /// Every kernel tracks the running maximum of the raw scores, which is the maximum of the
    /// scaled scores only when the scale is positive; so every plan refuses the rest, the same
    /// way on every backend.
    #[error("softmax scale {scale} is not positive: pass |scale| and negate Q for a negative one (scale·Q·Kᵀ = |scale|·(−Q)·Kᵀ); a zero scale is uniform attention over the visible keys")]
    NonPositiveScale { scale: f32 },

    /// A score modifier's parameter is outside what the modifier means (a window extent below
    /// -1, a non-finite softcap, a per-head array of the wrong length or with NaN).
    #[error("score modifier `{modifier}` is invalid: {reason}")]
    InvalidModifier { modifier: &'static str, reason: String },

    /// A kernel family that does not implement a score modifier; `Strategy::Auto` passes over
    /// it to a family that does.
    #[error("{kernel} does not implement the {feature} score modifier (the CPU backend, the portable FMA kernel and the native wgmma and HMMA kernels do)")]
    UnsupportedFeature { feature: &'static str, kernel: String },

    /// A paged KV cache's page size that no paged kernel takes.
    #[error("page size {page_size} is not supported (supported: {supported:?})")]
    UnsupportedPageSize { page_size: usize, supported: Vec<usize> },

    /// A block-table entry a sequence reads that is not a page of the pool.
    #[error("block table entry [{sequence}][{index}] = {entry} is not a page of the pool (0 <= entry < {num_pages})")]
    BlockTableEntry { sequence: usize, index: usize, entry: i32, num_pages: usize },

    /// A kernel family that does not read paged KV caches; `Strategy::Auto` passes over it.
    #[error("{kernel} does not read a paged KV cache (the CPU backend and the native and portable decode families do)")]
    UnsupportedPagedKv { kernel: String },

    /// A paged KV cache whose block table, lengths or geometry do not fit together or the problem.
    #[error("paged KV cache is inconsistent: {reason}")]
    InvalidPagedKv { reason: String },

    /// A kernel family that does not take variable-length (packed) batches; `Strategy::Auto`
    /// passes over it.
    #[error("{kernel} does not take variable-length batches (the CPU backend, the portable FMA kernel and the native wgmma and HMMA kernels do)")]
    UnsupportedVarLen { kernel: String },

    /// Variable-length offsets that are not `batch + 1` non-decreasing entries from 0, or that do
    /// not fit the problem.
    #[error("variable-length batch is inconsistent: {reason}")]
    InvalidVarLen { reason: String },

    #[error("{tensor} shape mismatch: expected {expected:?}, got {got:?}")]
    ShapeMismatch { tensor: TensorName, expected: Vec<usize>, got: Vec<usize> },

    #[error("{tensor} must have rank {expected} ([batch, heads, seq, head_dim] or [batch, seq, heads, head_dim]), got shape {got:?}")]
    Rank { tensor: TensorName, expected: usize, got: Vec<usize> },

    #[error("{tensor} strides {strides:?} are invalid: {reason}")]
    InvalidStrides { tensor: TensorName, strides: crate::Strides, reason: String },

    #[error("{tensor} is {got}, the plan computes on {expected}")]
    Dtype { tensor: TensorName, expected: crate::Dtype, got: crate::Dtype },

    #[error("{tensor} lives on {got}, the session runs on {expected}")]
    WrongDevice { tensor: TensorName, expected: String, got: String },

    #[error("{tensor} buffer holds {got} elements, the problem needs {expected}")]
    BufferLength { tensor: TensorName, expected: usize, got: usize },

    #[error("head_dim {head_dim} is not supported by {path} (supported: {supported:?})")]
    UnsupportedHeadDim { head_dim: usize, path: String, supported: Vec<usize> },

    #[error("v_head_dim {v_head_dim} differs from head_dim {head_dim}, which {path} does not support")]
    UnsupportedVHeadDim { head_dim: usize, v_head_dim: usize, path: String },

    /// A tensor spans more elements than a path indexes: `path` names it (a kernel family, or
    /// every path for the address-space limit) and `limit` is its largest span.
    #[error("problem too large for {path}: {what} = {value} exceeds {limit}")]
    TooLarge { what: &'static str, value: u128, limit: u128, path: String },

    #[error("precision {precision} is not supported on {device}: {reason}")]
    UnsupportedPrecision { precision: Precision, device: String, reason: String },

    #[error("strategy {strategy:?} is not available on {device}: {reason}")]
    UnsupportedStrategy { strategy: Strategy, device: String, reason: String },

    #[error("device {device:?} is not available: {reason}")]
    DeviceUnavailable { device: Device, reason: String },

    #[error("quattn was built without the `{feature}` feature, needed for {what}")]
    NotCompiledWith { feature: &'static str, what: &'static str },

    #[error("invalid quantization parameter: {0}")]
    Quantization(String),

    #[error("{tensor} descales are invalid: {reason}")]
    Descales { tensor: TensorName, reason: String },

    #[error("plan `{kernel}` cannot run through this entry point: {reason}")]
    EntryPoint { kernel: String, reason: String },

    #[error("kernel `{kernel}` failed: {reason}")]
    Kernel { kernel: String, reason: String },

    #[error("LSE value {value} at row {index} is not a log-sum-exp: it must be finite, or -inf for a row that saw no key")]
    InvalidLse { index: usize, value: f32 },
    /// A finite input the plan's element type cannot hold; the NaN policy (`nonfinite`) keeps
    /// this apart from inputs that are NaN or infinite to begin with.
    #[error("{tensor}[{index}] = {value} overflows {dtype}, the element type the plan computes on: scale the inputs down or plan a precision with a wider type")]
    InputOverflow { tensor: TensorName, index: usize, value: f32, dtype: crate::Dtype },

    /// Rows whose inputs are all finite came out non-finite: an intermediate value (an f16
    /// accumulator, a score) overflowed the arithmetic of the mode.
    #[error("kernel `{kernel}` overflowed in {rows} row(s) whose inputs are all finite (first: batch {batch}, head {head}, row {row}): the intermediate values of {precision} (f16 accumulators, f32 scores) cannot hold the magnitude of these inputs")]
    Overflow { kernel: String, precision: Precision, rows: usize, batch: usize, head: usize, row: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
