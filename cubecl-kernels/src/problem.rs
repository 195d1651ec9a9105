//! The problem as the caller states it: shapes, strides, element type. No device data.

use crate::error::LaunchError;

/// Element type of Q, K, V and O. Accumulation is f32 unless [`Accumulation`] says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    F32,
    F16,
    Bf16,
}

impl ElemType {
    pub const fn size_bytes(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::F16 | ElemType::Bf16 => 2,
        }
    }

    pub(crate) fn storage(self) -> cubecl::ir::StorageType {
        use cubecl::ir::{ElemType as IrElem, FloatKind};
        let kind = match self {
            ElemType::F32 => FloatKind::F32,
            ElemType::F16 => FloatKind::F16,
            ElemType::Bf16 => FloatKind::BF16,
        };
        IrElem::Float(kind).into()
    }
}

/// How Q·Kᵀ is accumulated (f16 inputs only, except `F32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QkAccumulation {
    /// f32 accumulators: the accurate default.
    #[default]
    F32,
    /// f16 accumulators over the whole head dim.
    F16,
    /// f16 accumulation over `chunk` head-dim indices, each chunk's partial added into f32.
    /// `chunk` must divide the head dim.
    TwoStage { chunk: u32 },
}

/// Where a kernel may accumulate in f16 (the facade's `Precision::F16 { qk, pv }` modes); the
/// default is f32 everywhere. Only the packed-f16 FMA kernel (`fma_half.rs`) accumulates in
/// f16, so anything but the default needs f16 inputs and the FMA family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Accumulation {
    pub qk: QkAccumulation,
    /// P·V accumulated in f16 within each KV tile, added into the f32 accumulator per tile.
    pub pv_f16: bool,
}

impl Accumulation {
    /// f32 everywhere.
    pub fn is_f32(&self) -> bool {
        *self == Accumulation::default()
    }

    /// The f16 partial-sum span of Q·Kᵀ for a head dim (0: f32 accumulation).
    pub fn qk_chunk(&self, head_dim: u32) -> u32 {
        match self.qk {
            QkAccumulation::F32 => 0,
            QkAccumulation::F16 => head_dim,
            QkAccumulation::TwoStage { chunk } => chunk,
        }
    }
}

/// Head dims with a tile entry; anything else is refused before launch.
pub const SUPPORTED_HEAD_DIMS: &[u32] = &[32, 64, 96, 128, 256];

/// Shapes and strides of one forward attention call.
///
/// Strides are in elements, ordered (batch, head, seq); the head-dim stride must be 1. BHSD and
/// BSHD layouts (and any other with a unit innermost stride) are both expressed this way, so the
/// kernel never needs a copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionArgs {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub q_len: u32,
    pub kv_len: u32,
    pub head_dim: u32,
    pub v_head_dim: u32,
    /// Bottom-right aligned: query `i` sees key `j` iff `j <= i + kv_len - q_len`.
    pub causal: bool,
    /// Softmax scale applied to Q·Kᵀ (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    pub q_strides: [u32; 3],
    pub k_strides: [u32; 3],
    pub v_strides: [u32; 3],
    pub o_strides: [u32; 3],
    /// Write the natural-log LSE as f32 `[batch, q_heads, q_len]`.
    pub write_lse: bool,
}

/// Strides of a contiguous `[batch, heads, seq, dim]` tensor.
pub const fn bhsd_strides(heads: u32, seq: u32, dim: u32) -> [u32; 3] {
    [heads * seq * dim, seq * dim, dim]
}

/// Strides of a contiguous `[batch, seq, heads, dim]` tensor.
pub const fn bshd_strides(heads: u32, seq: u32, dim: u32) -> [u32; 3] {
    [seq * heads * dim, dim, heads * dim]
}

impl AttentionArgs {
    /// Contiguous BHSD problem with the conventional `1/sqrt(d)` scale.
    pub fn bhsd(
        batch: u32,
        q_heads: u32,
        kv_heads: u32,
        q_len: u32,
        kv_len: u32,
        head_dim: u32,
        causal: bool,
    ) -> Self {
        Self {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            v_head_dim: head_dim,
            causal,
            scale: 1.0 / (head_dim as f32).sqrt(),
            q_strides: bhsd_strides(q_heads, q_len, head_dim),
            k_strides: bhsd_strides(kv_heads, kv_len, head_dim),
            v_strides: bhsd_strides(kv_heads, kv_len, head_dim),
            o_strides: bhsd_strides(q_heads, q_len, head_dim),
            write_lse: false,
        }
    }

    /// Contiguous BSHD problem with the conventional `1/sqrt(d)` scale.
    pub fn bshd(
        batch: u32,
        q_heads: u32,
        kv_heads: u32,
        q_len: u32,
        kv_len: u32,
        head_dim: u32,
        causal: bool,
    ) -> Self {
        Self {
            q_strides: bshd_strides(q_heads, q_len, head_dim),
            k_strides: bshd_strides(kv_heads, kv_len, head_dim),
            v_strides: bshd_strides(kv_heads, kv_len, head_dim),
            o_strides: bshd_strides(q_heads, q_len, head_dim),
            ..Self::bhsd(batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal)
        }
    }

    /// Query heads sharing one KV head (1 = MHA, q_heads = MQA).
    pub fn group_size(&self) -> u32 {
        self.q_heads / self.kv_heads.max(1)
    }

    /// Useful FLOPs of the forward pass (2 matmuls, 2 flops per MAC), counting only the
    /// (query, key) pairs the causal mask keeps. Shared by benchmarks so TFLOP/s agree.
    pub fn flops(&self) -> f64 {
        let pairs = if self.causal {
            let off = self.kv_len as i64 - self.q_len as i64;
            (0..self.q_len as i64)
                .map(|i| (i + off + 1).clamp(0, self.kv_len as i64) as f64)
                .sum::<f64>()
        } else {
            self.q_len as f64 * self.kv_len as f64
        };
        2.0 * pairs
            * (self.head_dim + self.v_head_dim) as f64
            * self.batch as f64
            * self.q_heads as f64
    }

    /// Shape checks that need no device. Buffer extents are checked at launch.
    pub fn validate(&self) -> Result<(), LaunchError> {
        let invalid = |reason: String| Err(LaunchError::InvalidProblem { reason });
        if !SUPPORTED_HEAD_DIMS.contains(&self.head_dim)
            || !SUPPORTED_HEAD_DIMS.contains(&self.v_head_dim)
        {
            return Err(LaunchError::UnsupportedHeadDim {
                head_dim: self.head_dim,
                v_head_dim: self.v_head_dim,
                supported: SUPPORTED_HEAD_DIMS,
            });
        }
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return invalid(format!(
                "q_heads ({}) must be a positive multiple of kv_heads ({})",
                self.q_heads, self.kv_heads
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return invalid(format!("scale must be finite and positive, got {}", self.scale));
        }
        Ok(())
    }

    /// Elements spanned by a `[batch, heads, seq, dim]` view with the given strides: the index
    /// of its last element plus one (0 when the view is empty).
    pub(crate) fn extent(strides: [u32; 3], batch: u32, heads: u32, seq: u32, dim: u32) -> u64 {
        if batch == 0 || heads == 0 || seq == 0 || dim == 0 {
            return 0;
        }
        (batch as u64 - 1) * strides[0] as u64
            + (heads as u64 - 1) * strides[1] as u64
            + (seq as u64 - 1) * strides[2] as u64
            + dim as u64
    }

    /// (name, extent in elements) of Q, K, V, O.
    pub(crate) fn extents(&self) -> [(&'static str, u64); 4] {
        [
            (
                "q",
                Self::extent(self.q_strides, self.batch, self.q_heads, self.q_len, self.head_dim),
            ),
            (
                "k",
                Self::extent(self.k_strides, self.batch, self.kv_heads, self.kv_len, self.head_dim),
            ),
            (
                "v",
                Self::extent(
                    self.v_strides,
                    self.batch,
                    self.kv_heads,
                    self.kv_len,
                    self.v_head_dim,
                ),
            ),
            (
                "o",
                Self::extent(
                    self.o_strides,
                    self.batch,
                    self.q_heads,
                    self.q_len,
                    self.v_head_dim,
                ),
            ),
        ]
    }

    pub(crate) fn lse_len(&self) -> u64 {
        self.batch as u64 * self.q_heads as u64 * self.q_len as u64
    }
}
