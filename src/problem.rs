//! [`AttentionProblem`]: the shapes of one attention call, no data.

use crate::error::{Error, Result, TensorName};

pub use quattn_core::{AttentionShape, Layout, Strides};

/// Explicit element strides of Q, K, V and O, for tensors that are not contiguous in one
/// [`Layout`] (views, slices of a larger buffer, packed QKV). The head dimension is always
/// contiguous (stride 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorStrides {
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
}

/// Largest number of elements in one tensor the library accepts: offsets must fit the 32-bit
/// indices the GPU kernels use.
pub const MAX_TENSOR_ELEMS: usize = (u32::MAX as usize) / 2;

/// The shape of one attention forward call: `O = softmax(scale · Q Kᵀ + mask) V`.
///
/// * Grouped-query / multi-query attention: `q_heads` must be a multiple of `kv_heads`; Q head
///   `h` reads KV head `h / (q_heads / kv_heads)`.
/// * Causal masking is bottom-right aligned (FlashAttention-2 convention): query `i` sees key
///   `j` iff `j <= i + kv_len - q_len`. When `q_len > kv_len` the first rows see no key at all;
///   their output is 0 and their LSE is `-inf`.
/// * The LSE is the natural log of the softmax denominator of the *scaled* logits, shape
///   `[batch, q_heads, q_len]` (always this order, whatever the layout).
/// * NaN and ±inf inputs poison exactly the rows whose softmax sees them (O and LSE NaN); see
///   the [NaN policy](crate::nonfinite).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionProblem {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub causal: bool,
    /// Softmax scale; `None` means `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    pub layout: Layout,
    /// Per-tensor strides overriding `layout`'s contiguous ones (`None`: contiguous).
    pub strides: Option<TensorStrides>,
    pub return_lse: bool,
}

impl AttentionProblem {
    /// Self-attention shape: `kv_heads = heads`, `kv_len = seq`, `v_head_dim = head_dim`,
    /// non-causal, default scale, BHSD, no LSE. Refine with the builder methods.
    pub fn new(batch: usize, heads: usize, seq: usize, head_dim: usize) -> Self {
        AttentionProblem {
            batch,
            q_heads: heads,
            kv_heads: heads,
            q_len: seq,
            kv_len: seq,
            head_dim,
            v_head_dim: head_dim,
            causal: false,
            scale: None,
            layout: Layout::Bhsd,
            strides: None,
            return_lse: false,
        }
    }
    pub fn kv_heads(mut self, kv_heads: usize) -> Self {
        self.kv_heads = kv_heads;
        self
    }
    pub fn kv_len(mut self, kv_len: usize) -> Self {
        self.kv_len = kv_len;
        self
    }
    pub fn v_head_dim(mut self, v_head_dim: usize) -> Self {
        self.v_head_dim = v_head_dim;
        self
    }
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// Explicit strides for every tensor (see [`TensorStrides`]); [`AttentionProblem::validate`]
    /// checks that O's rows do not overlap and that every extent fits.
    pub fn strides(mut self, strides: TensorStrides) -> Self {
        self.strides = Some(strides);
        self
    }
    pub fn with_lse(mut self, return_lse: bool) -> Self {
        self.return_lse = return_lse;
        self
    }

    /// The softmax scale in effect.
    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Q heads per KV head.
    pub fn group_size(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }

    /// KV head read by Q head `h`.
    #[inline]
    pub fn kv_head_of(&self, q_head: usize) -> usize {
        q_head / self.group_size()
    }

    /// Number of keys query row `i` sees (all of them when not causal).
    #[inline]
    pub fn visible_keys(&self, i: usize) -> usize {
        if !self.causal {
            return self.kv_len;
        }
        // j <= i + kv_len - q_len  <=>  j < i + 1 + kv_len - q_len
        (i + 1 + self.kv_len).saturating_sub(self.q_len).min(self.kv_len)
    }

    pub fn q_shape(&self) -> [usize; 4] {
        self.dims(self.q_heads, self.q_len, self.head_dim)
    }
    pub fn k_shape(&self) -> [usize; 4] {
        self.dims(self.kv_heads, self.kv_len, self.head_dim)
    }
    pub fn v_shape(&self) -> [usize; 4] {
        self.dims(self.kv_heads, self.kv_len, self.v_head_dim)
    }
    pub fn o_shape(&self) -> [usize; 4] {
        self.dims(self.q_heads, self.q_len, self.v_head_dim)
    }
    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.q_heads, self.q_len]
    }

    fn dims(&self, heads: usize, seq: usize, dim: usize) -> [usize; 4] {
        match self.layout {
            Layout::Bhsd => [self.batch, heads, seq, dim],
            Layout::Bshd => [self.batch, seq, heads, dim],
        }
    }

    /// The strides of every tensor in effect: the explicit ones, else `layout`'s contiguous ones.
    pub fn tensor_strides(&self) -> TensorStrides {
        self.strides.unwrap_or(TensorStrides {
            q: Strides::new(self.layout, self.q_heads, self.q_len, self.head_dim),
            k: Strides::new(self.layout, self.kv_heads, self.kv_len, self.head_dim),
            v: Strides::new(self.layout, self.kv_heads, self.kv_len, self.v_head_dim),
            o: Strides::new(self.layout, self.q_heads, self.q_len, self.v_head_dim),
        })
    }
    pub fn q_strides(&self) -> Strides {
        self.tensor_strides().q
    }
    pub fn k_strides(&self) -> Strides {
        self.tensor_strides().k
    }
    pub fn v_strides(&self) -> Strides {
        self.tensor_strides().v
    }
    pub fn o_strides(&self) -> Strides {
        self.tensor_strides().o
    }

    /// The problem as kernels take it: sizes, the strides in effect, the softmax scale in effect.
    pub fn shape(&self) -> AttentionShape {
        let s = self.tensor_strides();
        AttentionShape {
            batch: self.batch,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            q_len: self.q_len,
            kv_len: self.kv_len,
            head_dim: self.head_dim,
            v_head_dim: self.v_head_dim,
            causal: self.causal,
            scale: self.softmax_scale(),
            q: s.q,
            k: s.k,
            v: s.v,
            o: s.o,
            write_lse: self.return_lse,
        }
    }

    /// Elements a Q buffer must hold: the span of Q's strides (the dense count when contiguous).
    pub fn q_len_elems(&self) -> usize {
        self.extent(self.q_strides(), self.q_heads, self.q_len, self.head_dim)
    }
    pub fn k_len_elems(&self) -> usize {
        self.extent(self.k_strides(), self.kv_heads, self.kv_len, self.head_dim)
    }
    pub fn v_len_elems(&self) -> usize {
        self.extent(self.v_strides(), self.kv_heads, self.kv_len, self.v_head_dim)
    }
    pub fn o_len_elems(&self) -> usize {
        self.extent(self.o_strides(), self.q_heads, self.q_len, self.v_head_dim)
    }

    /// Saturates on overflow; [`AttentionProblem::validate`] refuses such problems first.
    fn extent(&self, s: Strides, heads: usize, seq: usize, dim: usize) -> usize {
        s.extent(self.batch, heads, seq, dim).unwrap_or(usize::MAX)
    }
    pub fn lse_len_elems(&self) -> usize {
        self.batch * self.q_heads * self.q_len
    }

    /// Checks the problem on its own (device-independent rules).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("batch", self.batch),
            ("q_heads", self.q_heads),
            ("kv_heads", self.kv_heads),
            ("q_len", self.q_len),
            ("kv_len", self.kv_len),
            ("head_dim", self.head_dim),
            ("v_head_dim", self.v_head_dim),
        ] {
            if v == 0 {
                return Err(Error::ZeroSize { name });
            }
        }
        if self.q_heads % self.kv_heads != 0 {
            return Err(Error::GqaRatio { q_heads: self.q_heads, kv_heads: self.kv_heads });
        }
        if let Some(scale) = self.scale {
            if !scale.is_finite() {
                return Err(Error::NonFiniteScale { scale });
            }
            if scale <= 0.0 {
                return Err(Error::NonPositiveScale { scale });
            }
        }
        for (what, dims) in [
            ("Q elements", [self.batch, self.q_heads, self.q_len, self.head_dim]),
            ("K elements", [self.batch, self.kv_heads, self.kv_len, self.head_dim]),
            ("V elements", [self.batch, self.kv_heads, self.kv_len, self.v_head_dim]),
            ("O elements", [self.batch, self.q_heads, self.q_len, self.v_head_dim]),
        ] {
            let n = dims.iter().map(|&d| d as u128).product::<u128>();
            if n > MAX_TENSOR_ELEMS as u128 {
                return Err(Error::TooLarge { what, value: n, limit: MAX_TENSOR_ELEMS as u128 });
            }
        }
        if self.strides.is_some() {
            self.validate_strides()?;
        }
        Ok(())
    }

    /// Explicit strides: every extent fits the kernels' index range, and O, which is written,
    /// has no two (batch, head, row) positions sharing an element. Inputs may alias (a zero
    /// batch stride shares one K/V across the batch).
    fn validate_strides(&self) -> Result<()> {
        let s = self.tensor_strides();
        for (tensor, st, heads, seq, dim) in [
            (TensorName::Q, s.q, self.q_heads, self.q_len, self.head_dim),
            (TensorName::K, s.k, self.kv_heads, self.kv_len, self.head_dim),
            (TensorName::V, s.v, self.kv_heads, self.kv_len, self.v_head_dim),
            (TensorName::Output, s.o, self.q_heads, self.q_len, self.v_head_dim),
        ] {
            match st.extent(self.batch, heads, seq, dim) {
                Some(n) if n <= MAX_TENSOR_ELEMS => {}
                n => {
                    return Err(Error::InvalidStrides {
                        tensor,
                        strides: st,
                        reason: format!(
                            "the tensor spans {} elements, above the limit of {MAX_TENSOR_ELEMS}",
                            n.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                        ),
                    })
                }
            }
        }
        // Non-overlap of O: sorted by stride, each axis must step past everything the smaller
        // axes span (axes of size 1 never step).
        let mut axes: Vec<(usize, usize)> =
            [(s.o.batch, self.batch), (s.o.head, self.q_heads), (s.o.seq, self.q_len)].into_iter().filter(|a| a.1 > 1).collect();
        axes.sort();
        let mut span = self.v_head_dim;
        for (stride, n) in axes {
            if stride < span {
                return Err(Error::InvalidStrides {
                    tensor: TensorName::Output,
                    strides: s.o,
                    reason: format!("rows overlap: a stride of {stride} steps inside the {span} elements the smaller axes span"),
                });
            }
            span = stride * (n - 1) + span;
        }
        Ok(())
    }

    /// Checks host buffer lengths against the problem.
    pub fn check_lengths(&self, q: usize, k: usize, v: usize) -> Result<()> {
        for (tensor, expected, got) in [
            (TensorName::Q, self.q_len_elems(), q),
            (TensorName::K, self.k_len_elems(), k),
            (TensorName::V, self.v_len_elems(), v),
        ] {
            if expected != got {
                return Err(Error::BufferLength { tensor, expected, got });
            }
        }
        Ok(())
    }

    /// Checks explicit tensor shapes (as a caller holding shaped tensors would pass them).
    pub fn check_shapes(&self, q: &[usize], k: &[usize], v: &[usize]) -> Result<()> {
        for (tensor, expected, got) in [
            (TensorName::Q, self.q_shape(), q),
            (TensorName::K, self.k_shape(), k),
            (TensorName::V, self.v_shape(), v),
        ] {
            if expected.as_slice() != got {
                return Err(Error::ShapeMismatch { tensor, expected: expected.to_vec(), got: got.to_vec() });
            }
        }
        Ok(())
    }

    /// Builds the problem from Q, K, V shapes in `layout` (head dim last), so shape errors are
    /// caught where tensors meet the library.
    pub fn from_shapes(layout: Layout, q: &[usize], k: &[usize], v: &[usize], causal: bool) -> Result<Self> {
        let rank4 = |t: TensorName, s: &[usize]| -> Result<[usize; 4]> {
            <[usize; 4]>::try_from(s).map_err(|_| Error::Rank { tensor: t, expected: 4, got: s.to_vec() })
        };
        let (q, k, v) = (rank4(TensorName::Q, q)?, rank4(TensorName::K, k)?, rank4(TensorName::V, v)?);
        let split = |s: [usize; 4]| match layout {
            Layout::Bhsd => (s[0], s[1], s[2], s[3]),
            Layout::Bshd => (s[0], s[2], s[1], s[3]),
        };
        let (b, hq, sq, d) = split(q);
        let (_, hk, sk, _) = split(k);
        let (_, _, _, dv) = split(v);
        let p = AttentionProblem {
            batch: b,
            q_heads: hq,
            kv_heads: hk,
            q_len: sq,
            kv_len: sk,
            head_dim: d,
            v_head_dim: dv,
            causal,
            scale: None,
            layout,
            strides: None,
            return_lse: false,
        };
        p.validate()?;
        p.check_shapes(&q, &k, &v)?;
        Ok(p)
    }
}
