//! The problem as the kernels index it: quattn-core's [`AttentionShape`] checked and narrowed to
//! the 32-bit sizes and strides the kernels compute with. No device data.

use quattn_core::{AttentionShape, Dtype, Strides};

use crate::error::LaunchError;

/// Head dims with a tile entry; anything else is refused before launch.
pub const SUPPORTED_HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 256];

/// CubeCL's storage type of a float element type.
pub(crate) fn storage(dtype: Dtype) -> cubecl::ir::StorageType {
    use cubecl::ir::{ElemType as IrElem, FloatKind};
    let kind = match dtype {
        Dtype::F32 => FloatKind::F32,
        Dtype::F16 => FloatKind::F16,
        Dtype::Bf16 => FloatKind::BF16,
    };
    IrElem::Float(kind).into()
}

/// An [`AttentionShape`] in the kernels' 32-bit integers, validated: supported head dims,
/// `q_heads` a positive multiple of `kv_heads`, a finite positive scale, every size and stride
/// representable. Strides are `[batch, head, seq]` in elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Args {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub q_len: u32,
    pub kv_len: u32,
    pub head_dim: u32,
    pub v_head_dim: u32,
    pub causal: bool,
    pub scale: f32,
    pub q_strides: [u32; 3],
    pub k_strides: [u32; 3],
    pub v_strides: [u32; 3],
    pub o_strides: [u32; 3],
    pub write_lse: bool,
}

impl Args {
    pub fn new(shape: &AttentionShape) -> Result<Self, LaunchError> {
        let invalid = |reason: String| Err(LaunchError::InvalidProblem { reason });
        if !SUPPORTED_HEAD_DIMS.contains(&shape.head_dim) || !SUPPORTED_HEAD_DIMS.contains(&shape.v_head_dim) {
            return Err(LaunchError::UnsupportedHeadDim {
                head_dim: shape.head_dim,
                v_head_dim: shape.v_head_dim,
                supported: SUPPORTED_HEAD_DIMS,
            });
        }
        if shape.kv_heads == 0 || !shape.q_heads.is_multiple_of(shape.kv_heads) {
            return invalid(format!(
                "q_heads ({}) must be a positive multiple of kv_heads ({})",
                shape.q_heads, shape.kv_heads
            ));
        }
        if !(shape.scale.is_finite() && shape.scale > 0.0) {
            return invalid(format!("scale must be finite and positive, got {}", shape.scale));
        }
        let narrow = |what: &'static str, value: usize| {
            u32::try_from(value).map_err(|_| LaunchError::TooLarge { what, value })
        };
        let strides = |what: &'static str, s: Strides| -> Result<[u32; 3], LaunchError> {
            Ok([narrow(what, s.batch)?, narrow(what, s.head)?, narrow(what, s.seq)?])
        };
        Ok(Args {
            batch: narrow("batch", shape.batch)?,
            q_heads: narrow("q_heads", shape.q_heads)?,
            kv_heads: narrow("kv_heads", shape.kv_heads)?,
            q_len: narrow("q_len", shape.q_len)?,
            kv_len: narrow("kv_len", shape.kv_len)?,
            head_dim: narrow("head_dim", shape.head_dim)?,
            v_head_dim: narrow("v_head_dim", shape.v_head_dim)?,
            causal: shape.causal,
            scale: shape.scale,
            q_strides: strides("q stride", shape.q)?,
            k_strides: strides("k stride", shape.k)?,
            v_strides: strides("v stride", shape.v)?,
            o_strides: strides("o stride", shape.o)?,
            write_lse: shape.write_lse,
        })
    }

    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> u32 {
        self.q_heads / self.kv_heads.max(1)
    }

    /// Elements spanned by a `[batch, heads, seq, dim]` view with the given strides: the index
    /// of its last element plus one (0 when the view is empty).
    fn extent(strides: [u32; 3], batch: u32, heads: u32, seq: u32, dim: u32) -> u64 {
        if batch == 0 || heads == 0 || seq == 0 || dim == 0 {
            return 0;
        }
        (batch as u64 - 1) * strides[0] as u64
            + (heads as u64 - 1) * strides[1] as u64
            + (seq as u64 - 1) * strides[2] as u64
            + dim as u64
    }

    /// (name, extent in elements) of Q, K, V, O.
    pub fn extents(&self) -> [(&'static str, u64); 4] {
        [
            ("q", Self::extent(self.q_strides, self.batch, self.q_heads, self.q_len, self.head_dim)),
            ("k", Self::extent(self.k_strides, self.batch, self.kv_heads, self.kv_len, self.head_dim)),
            ("v", Self::extent(self.v_strides, self.batch, self.kv_heads, self.kv_len, self.v_head_dim)),
            ("o", Self::extent(self.o_strides, self.batch, self.q_heads, self.q_len, self.v_head_dim)),
        ]
    }

    /// (name, extent in elements) of packed token-major Q, K, V, O of a variable-length batch:
    /// `total_q` / `total_k` rows through the head and row strides (the batch strides unused).
    pub fn varlen_extents(&self, total_q: u32, total_k: u32) -> [(&'static str, u64); 4] {
        [
            ("q", Self::extent(self.q_strides, 1, self.q_heads, total_q, self.head_dim)),
            ("k", Self::extent(self.k_strides, 1, self.kv_heads, total_k, self.head_dim)),
            ("v", Self::extent(self.v_strides, 1, self.kv_heads, total_k, self.v_head_dim)),
            ("o", Self::extent(self.o_strides, 1, self.q_heads, total_q, self.v_head_dim)),
        ]
    }

    pub fn lse_len(&self) -> u64 {
        self.batch as u64 * self.q_heads as u64 * self.q_len as u64
    }
}
