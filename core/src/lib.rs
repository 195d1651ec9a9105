//! The types every layer of quattn shares, defined once: element types ([`Dtype`]), tensor
//! strides ([`Strides`], [`Layout`]), the shape of one attention call as kernels see it
//! ([`AttentionShape`]), the accumulation modes of the 16-bit float paths ([`QkAccum`],
//! [`PvAccum`], [`Accumulation`]) and the INT8 scale layout ([`Int8Granularity`],
//! [`Int8Blocking`]).
//!
//! The kernel crates (`quattn-cubecl`, `quattn-native`) and the facade (`quattn`) depend on this
//! crate and on nothing of each other's, so the dependency graph stays a tree. No device code
//! and no heavy dependency lives here.

use std::fmt;

#[cfg(feature = "serde")]
use serde::Serialize;

/// Element type of a float tensor (Q, K, V, O).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

    pub const fn size_bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// `f32`, `f16` or `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Memory layout of a contiguous 4-d attention tensor; the head dimension is innermost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum Layout {
    /// `[batch, heads, seq, head_dim]`.
    #[default]
    Bhsd,
    /// `[batch, seq, heads, head_dim]` (the layout of most model code).
    Bshd,
}

/// Element strides of a `[batch, heads, seq, head_dim]` view whose head-dim stride is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub struct Strides {
    pub batch: usize,
    pub head: usize,
    pub seq: usize,
}

impl Strides {
    /// The strides of a contiguous tensor in `layout`.
    pub const fn new(layout: Layout, heads: usize, seq: usize, dim: usize) -> Self {
        match layout {
            Layout::Bhsd => Strides { batch: heads * seq * dim, head: seq * dim, seq: dim },
            Layout::Bshd => Strides { batch: seq * heads * dim, head: dim, seq: heads * dim },
        }
    }

    /// Offset of element `(b, h, s, 0)`.
    #[inline]
    pub const fn offset(&self, b: usize, h: usize, s: usize) -> usize {
        b * self.batch + h * self.head + s * self.seq
    }

    /// Elements a `[batch, heads, seq, dim]` view with these strides spans: the index of its
    /// last element plus one (0 for an empty view). `None` on overflow.
    pub fn extent(&self, batch: usize, heads: usize, seq: usize, dim: usize) -> Option<usize> {
        if batch == 0 || heads == 0 || seq == 0 || dim == 0 {
            return Some(0);
        }
        (batch - 1)
            .checked_mul(self.batch)?
            .checked_add((heads - 1).checked_mul(self.head)?)?
            .checked_add((seq - 1).checked_mul(self.seq)?)?
            .checked_add(dim)
    }

    /// As `[batch, head, seq]`.
    pub const fn to_array(self) -> [usize; 3] {
        [self.batch, self.head, self.seq]
    }
}

/// One attention forward call as a kernel sees it: sizes, strides of every tensor, causal mask,
/// softmax scale, whether the LSE is written. The facade's `AttentionProblem` resolves to this
/// (layout and default scale applied); the kernel crates take it as their launch description.
///
/// Causal masking is bottom-right aligned: query `i` sees key `j` iff `j <= i + kv_len - q_len`.
/// Q head `h` reads KV head `h / (q_heads / kv_heads)`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub struct AttentionShape {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub causal: bool,
    /// Softmax scale applied to Q·Kᵀ.
    pub scale: f32,
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
    /// Write the natural-log LSE as f32 `[batch, q_heads, q_len]`.
    pub write_lse: bool,
}

impl AttentionShape {
    /// Contiguous tensors in `layout`, scale `1/sqrt(head_dim)`, `v_head_dim = head_dim`, no LSE.
    pub fn contiguous(
        layout: Layout,
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        q_len: usize,
        kv_len: usize,
        head_dim: usize,
        causal: bool,
    ) -> Self {
        AttentionShape {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            v_head_dim: head_dim,
            causal,
            scale: 1.0 / (head_dim as f32).sqrt(),
            q: Strides::new(layout, q_heads, q_len, head_dim),
            k: Strides::new(layout, kv_heads, kv_len, head_dim),
            v: Strides::new(layout, kv_heads, kv_len, head_dim),
            o: Strides::new(layout, q_heads, q_len, head_dim),
            write_lse: false,
        }
    }

    /// Query heads sharing one KV head (1 = MHA, `q_heads` = MQA).
    pub fn group_size(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }

    /// Elements Q, K, V and O span with their strides, in that order. `None` on overflow.
    pub fn extents(&self) -> Option<[usize; 4]> {
        Some([
            self.q.extent(self.batch, self.q_heads, self.q_len, self.head_dim)?,
            self.k.extent(self.batch, self.kv_heads, self.kv_len, self.head_dim)?,
            self.v.extent(self.batch, self.kv_heads, self.kv_len, self.v_head_dim)?,
            self.o.extent(self.batch, self.q_heads, self.q_len, self.v_head_dim)?,
        ])
    }

    /// Elements of the LSE, `batch · q_heads · q_len`.
    pub fn lse_len(&self) -> usize {
        self.batch * self.q_heads * self.q_len
    }

    /// FLOPs of one forward pass, FlashAttention's count (the one every TFLOP/s figure of the
    /// project and of its peers' scripts uses): two matmuls at 2 FLOPs per multiply-add,
    /// `4 · batch · q_heads · q_len · kv_len · d` with `d` the mean of the two head dims, halved
    /// when causal.
    pub fn flops(&self) -> f64 {
        let d = (self.head_dim + self.v_head_dim) as f64 / 2.0;
        let full = 4.0 * self.batch as f64 * self.q_heads as f64 * self.q_len as f64 * self.kv_len as f64 * d;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }
}

/// How Q·Kᵀ is accumulated in the 16-bit float modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum QkAccum {
    /// f32 accumulators: the accurate default.
    #[default]
    F32,
    /// f16 accumulators over the whole head dim: full rate where f32 accumulation runs at half
    /// rate, about 1e-3 relative score error.
    F16,
    /// f16 accumulation over [`TWO_STAGE_CHUNK`] head-dim indices, each chunk's partial folded
    /// into f32: most of the F16 speed with error that grows per chunk, not per head dim.
    TwoStage,
}

/// Head-dim span of each f16 partial sum of [`QkAccum::TwoStage`], on every kernel and in the
/// emulation.
pub const TWO_STAGE_CHUNK: usize = 32;

/// How P·V is accumulated in the 16-bit float modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum PvAccum {
    /// f32 accumulators across the whole key sequence.
    #[default]
    F32,
    /// f16 accumulation within one KV tile, folded into f32 once per tile.
    F16PerTile,
}

/// Both accumulation choices of a 16-bit float mode; the default is f32 everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub struct Accumulation {
    pub qk: QkAccum,
    pub pv: PvAccum,
}

impl Accumulation {
    /// f32 everywhere.
    pub fn is_f32(&self) -> bool {
        *self == Accumulation::default()
    }

    /// The f16 partial-sum span of Q·Kᵀ at `head_dim` (0: f32 accumulation).
    pub fn qk_chunk(&self, head_dim: usize) -> usize {
        match self.qk {
            QkAccum::F32 => 0,
            QkAccum::F16 => head_dim,
            QkAccum::TwoStage => TWO_STAGE_CHUNK.min(head_dim),
        }
    }
}

/// Which query rows share one INT8 scale for Q (K always has one scale per block of keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum Int8Granularity {
    /// One scale per block of `block_q` query rows (one CTA / cube).
    #[default]
    PerBlock,
    /// One scale per warp's `block_q / warps` consecutive rows.
    PerWarp,
    /// One scale per lane quad of a 16-row MMA fragment: rows `g` and `g + 8` of each 16 rows.
    PerThread,
}

impl Int8Granularity {
    pub const ALL: [Int8Granularity; 3] = [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread];

    /// `block`, `warp` or `thread`.
    pub const fn tag(self) -> &'static str {
        match self {
            Int8Granularity::PerBlock => "block",
            Int8Granularity::PerWarp => "warp",
            Int8Granularity::PerThread => "thread",
        }
    }
}

/// Rows of one MMA fragment in the per-thread scale model, and the lane quads (row groups) in it.
pub const INT8_MMA_M: usize = 16;
pub const INT8_THREAD_GROUPS: usize = 8;

/// The tile shape INT8 scales are laid out for; the kernel that reads them must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub struct Int8Blocking {
    /// Query rows per block (one CTA / cube).
    pub block_q: usize,
    /// Keys per K scale (one KV tile).
    pub block_k: usize,
    /// Warps splitting a query block into `block_q / warps` consecutive rows each.
    pub warps: usize,
}

/// The native IMMA kernel's tile: 128 query rows over 8 warps, 64 keys per K scale.
impl Default for Int8Blocking {
    fn default() -> Self {
        Int8Blocking { block_q: 128, block_k: 64, warps: 8 }
    }
}

impl Int8Blocking {
    /// Rows owned by one warp.
    pub const fn rows_per_warp(&self) -> usize {
        self.block_q / if self.warps == 0 { 1 } else { self.warps }
    }

    /// `ceil(q_len / block_q)`.
    pub const fn q_blocks(&self, q_len: usize) -> usize {
        q_len.div_ceil(self.block_q)
    }

    /// `ceil(kv_len / block_k)`.
    pub const fn k_blocks(&self, kv_len: usize) -> usize {
        kv_len.div_ceil(self.block_k)
    }

    /// Q scales per query block.
    pub const fn q_slots(&self, granularity: Int8Granularity) -> usize {
        match granularity {
            Int8Granularity::PerBlock => 1,
            Int8Granularity::PerWarp => self.warps,
            Int8Granularity::PerThread => self.warps * INT8_THREAD_GROUPS,
        }
    }

    /// Why this blocking cannot carry `granularity`'s scales, if it cannot.
    pub fn check(&self, granularity: Int8Granularity) -> Result<(), String> {
        if self.block_q == 0 || self.block_k == 0 || self.warps == 0 {
            return Err(format!("INT8 blocking has a zero size: {self:?}"));
        }
        if !self.block_q.is_multiple_of(self.warps) {
            return Err(format!("INT8 block_q {} is not a multiple of warps {}", self.block_q, self.warps));
        }
        if granularity == Int8Granularity::PerThread && self.rows_per_warp() != INT8_MMA_M {
            return Err(format!(
                "per-thread INT8 scales follow a {INT8_MMA_M}-row MMA fragment per warp, but block_q / warps = {}",
                self.rows_per_warp()
            ));
        }
        Ok(())
    }
}

/// The two OCP FP8 formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits, finite only (max 448), NaN = S.1111.111.
    #[default]
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, IEEE-like (max 57344, inf and NaN).
    E5M2,
}

impl Fp8Format {
    pub const fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }

    /// The largest finite value.
    pub const fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Granularity of the FP8 descale factors of Q, K and V. The descale tensors of a tensor with
/// `heads` heads and `len` rows per head: `PerTensor` `[1]`; `PerHead` `[batch, heads]`;
/// `PerBlock` `[batch, heads, ceil(len / block_rows)]`, row `i` in block `i / block_rows`
/// (Q: `block_rows` = the kernel's query tile; K and V: its key tile). Q descales are per Q
/// head, K and V descales per KV head (GQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(Serialize))]
pub enum DescaleGranularity {
    /// One f32 descale per tensor.
    #[default]
    PerTensor,
    /// One f32 descale per (batch, head).
    PerHead,
    /// One f32 descale per (batch, head, block of rows).
    PerBlock,
}

impl DescaleGranularity {
    /// Number of descales of a tensor of `batch × heads × len` rows with blocks of `block_rows`.
    pub const fn count(self, batch: usize, heads: usize, len: usize, block_rows: usize) -> usize {
        match self {
            DescaleGranularity::PerTensor => 1,
            DescaleGranularity::PerHead => batch * heads,
            DescaleGranularity::PerBlock => batch * heads * len.div_ceil(if block_rows == 0 { 1 } else { block_rows }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_extents() {
        let s = Strides::new(Layout::Bshd, 4, 10, 64);
        assert_eq!(s, Strides { batch: 2560, head: 64, seq: 256 });
        assert_eq!(s.extent(2, 4, 10, 64), Some(2 * 2560));
        assert_eq!(s.extent(0, 4, 10, 64), Some(0));
        assert_eq!(Strides { batch: usize::MAX, head: 1, seq: 1 }.extent(3, 1, 1, 1), None);
    }

    #[test]
    fn flops_follow_flash_attention_count() {
        let mut sh = AttentionShape::contiguous(Layout::Bhsd, 2, 3, 1, 5, 7, 8, false);
        assert_eq!(sh.flops(), 4.0 * 2.0 * 3.0 * 5.0 * 7.0 * 8.0);
        sh.causal = true;
        assert_eq!(sh.flops(), 2.0 * 2.0 * 3.0 * 5.0 * 7.0 * 8.0);
    }

    #[test]
    fn int8_blocking_checks() {
        let b = Int8Blocking { block_q: 128, block_k: 64, warps: 8 };
        assert!(b.check(Int8Granularity::PerThread).is_ok());
        assert_eq!(b.q_slots(Int8Granularity::PerThread), 64);
        assert!(Int8Blocking { warps: 4, ..b }.check(Int8Granularity::PerThread).is_err());
        assert!(Int8Blocking { warps: 3, ..b }.check(Int8Granularity::PerBlock).is_err());
        assert!(Int8Blocking { block_k: 0, ..b }.check(Int8Granularity::PerBlock).is_err());
    }

    #[test]
    fn two_stage_chunk_never_exceeds_head_dim() {
        let a = Accumulation { qk: QkAccum::TwoStage, pv: PvAccum::F32 };
        assert_eq!(a.qk_chunk(128), 32);
        assert_eq!(a.qk_chunk(16), 16);
        assert_eq!(Accumulation::default().qk_chunk(128), 0);
    }
}
