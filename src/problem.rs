//! [`AttentionProblem`]: the shapes of one attention call and its score modifiers, no tensor
//! data.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Result, TensorName};
use crate::paged::PagedKv;
use crate::varlen::VarLen;

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

/// Largest number of elements one tensor may span on any path: its size in f32 bytes must fit
/// `isize`, the most one allocation can hold. Each kernel family has its own limit, this one or
/// [`MAX_TENSOR_ELEMS_32BIT`] ([`crate::Family::max_tensor_elems`]), checked when a plan walks
/// the dispatch table, so that `Strategy::Auto` passes over a family that cannot index the
/// problem.
pub const MAX_TENSOR_ELEMS: usize = isize::MAX as usize / 4;

/// The limit of the kernel families whose offsets are 32-bit signed integers: `2^31 - 1`
/// elements spanned by Q, K, V or O (strides included).
pub const MAX_TENSOR_ELEMS_32BIT: usize = i32::MAX as usize;

/// The path of [`MAX_TENSOR_ELEMS`] in [`Error::TooLarge`].
const ADDRESS_SPACE: &str = "every path (a tensor's f32 bytes must fit isize)";

/// Where query row `i` sits among the keys when `q_len != kv_len`: the row's aligned position
/// `a(i)` that causal masking, the sliding window and ALiBi measure key distances from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CausalAlign {
    /// `a(i) = i + kv_len - q_len`: the last query row is the last key (FlashAttention-2/3's
    /// convention, and what a decode step against a KV cache means). The default.
    #[default]
    BottomRight,
    /// `a(i) = i`: the first query row is the first key (torch SDPA's `is_causal=True`, which
    /// builds `torch.ones(L, S).tril(diagonal=0)`).
    TopLeft,
}

impl CausalAlign {
    /// `bottom-right` or `top-left`, as the CLI spells them.
    pub const fn name(self) -> &'static str {
        match self {
            CausalAlign::BottomRight => "bottom-right",
            CausalAlign::TopLeft => "top-left",
        }
    }
}

/// A sliding window, FlashAttention's `window_size=(left, right)`: query row `i` sees key `j`
/// iff `a(i) - left <= j <= a(i) + right` ([`CausalAlign`] gives `a(i)`). `-1` is unbounded on
/// that side; any other negative extent is refused at plan time. With `causal` the right extent
/// is at most 0 (causal masking and the window both apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    pub left: i64,
    pub right: i64,
}

impl Window {
    /// The extent as a bound: `None` when unbounded (`-1`).
    fn bound(x: i64) -> Option<u64> {
        (x >= 0).then_some(x as u64)
    }
    pub fn left_bound(&self) -> Option<u64> {
        Self::bound(self.left)
    }
    pub fn right_bound(&self) -> Option<u64> {
        Self::bound(self.right)
    }
}

/// The shape of one attention forward call: `O = softmax(mods(scale · Q Kᵀ) + mask) V`.
///
/// * Grouped-query / multi-query attention: `q_heads` must be a multiple of `kv_heads`; Q head
///   `h` reads KV head `h / (q_heads / kv_heads)`.
/// * Causal masking: query `i` sees key `j` iff `j <= a(i)`, where `a(i)` is the row's aligned
///   position ([`CausalAlign`]; bottom-right by default, the FlashAttention-2 convention:
///   `a(i) = i + kv_len - q_len`). Rows that see no key at all (with bottom-right alignment,
///   the first rows when `q_len > kv_len`; with a window, rows whose window holds no key) have
///   output 0 and LSE `-inf`.
/// * Score modifiers (README "Score modifiers"), applied to the scaled logit
///   `s = scale · q·k` in this order: softcap `s = cap · tanh(s / cap)`, ALiBi
///   `s -= slope[h] · |a(i) - j|`, then the mask (causal, [`Window`]). Attention sinks add
///   `exp(sink[h])` to the softmax denominator only: `O = Σ p_j v_j / (Σ p_j + exp(sink))`,
///   `LSE = ln(Σ exp(s_j) + exp(sink))`; a row that sees no key stays O = 0, LSE = `-inf`.
///   The per-head arrays (sinks, ALiBi slopes) live in the problem, so a [`crate::Plan`]
///   carries everything that changes the result; the CPU backend, the portable FMA kernel
///   and the native wgmma and HMMA kernels (f16/bf16, f32 accumulation) implement modifiers,
///   every other kernel refuses them at plan time ([`Error::UnsupportedFeature`]).
/// * The LSE is the natural log of the softmax denominator of the *scaled* logits, shape
///   `[batch, q_heads, q_len]` (always this order, whatever the layout).
/// * NaN and ±inf inputs poison exactly the rows whose softmax sees them (O and LSE NaN); see
///   the [NaN policy](crate::nonfinite).
#[derive(Debug, Clone, PartialEq)]
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
    /// Where the rows sit among the keys for causal masking, the window and ALiBi.
    pub causal_align: CausalAlign,
    /// Sliding window (`None`: every key, up to the causal mask).
    pub window: Option<Window>,
    /// Softcap `cap` of `cap · tanh(s / cap)` on the scaled logits (`None`: none).
    pub softcap: Option<f32>,
    /// Attention-sink logits, one per Q head (natural-log domain, compared with the scaled
    /// logits); `-inf` is a sink that takes no mass.
    pub sinks: Option<Arc<[f32]>>,
    /// ALiBi slopes, one per Q head: the logit of key `j` for row `i` gets
    /// `-slope · |a(i) - j|` (FlashAttention's `alibi_slopes` convention).
    pub alibi_slopes: Option<Arc<[f32]>>,
    /// K and V in a paged cache read through a block table (`None`: K and V are tensors of
    /// `layout` / `strides`). See [`crate::paged`].
    pub paged: Option<PagedKv>,
    /// Sequences of different lengths packed token-major (`None`: every sequence has `q_len`
    /// queries and `kv_len` keys). See [`crate::varlen`].
    pub varlen: Option<VarLen>,
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
            causal_align: CausalAlign::BottomRight,
            window: None,
            softcap: None,
            sinks: None,
            alibi_slopes: None,
            paged: None,
            varlen: None,
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
    pub fn causal_align(mut self, align: CausalAlign) -> Self {
        self.causal_align = align;
        self
    }
    /// FlashAttention's `window_size=(left, right)`; `-1` is unbounded (see [`Window`]).
    pub fn window(mut self, left: i64, right: i64) -> Self {
        self.window = Some(Window { left, right });
        self
    }
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }
    /// One sink logit per Q head.
    pub fn sinks(mut self, sinks: impl Into<Arc<[f32]>>) -> Self {
        self.sinks = Some(sinks.into());
        self
    }
    /// One ALiBi slope per Q head.
    pub fn alibi_slopes(mut self, slopes: impl Into<Arc<[f32]>>) -> Self {
        self.alibi_slopes = Some(slopes.into());
        self
    }

    /// K and V in a paged cache ([`crate::paged`]): the pools are `[num_pages, page_size,
    /// kv_heads, head_dim]` (V with `v_head_dim`), and `kv_len` becomes the longest sequence;
    /// each sequence sees its own `seq_lens[b]` keys. Q and O keep the problem's layout.
    pub fn paged_kv(mut self, paged: PagedKv) -> Self {
        self.kv_len = paged.max_seq_len();
        self.paged = Some(paged);
        self
    }

    /// Packed sequences of different lengths ([`crate::varlen`]): `batch` becomes the number
    /// of sequences, `q_len` / `kv_len` the longest ones and `layout` [`Layout::Bshd`] (Q is
    /// `[1, total_q, q_heads, head_dim]`, K/V `[1, total_k, kv_heads, dim]`, the LSE
    /// `[1, q_heads, total_q]`); each sequence's masks measure against its own lengths.
    pub fn varlen(mut self, varlen: VarLen) -> Self {
        self.batch = varlen.batch();
        self.q_len = varlen.max_q_len();
        self.kv_len = varlen.max_k_len();
        self.layout = Layout::Bshd;
        self.varlen = Some(varlen);
        self
    }

    /// The problem as sequence `b` sees it: with a paged cache or a variable-length batch,
    /// `q_len` / `kv_len` are that sequence's lengths (masks and ALiBi measure positions against
    /// them); otherwise the problem itself.
    pub fn sequence(&self, b: usize) -> Cow<'_, AttentionProblem> {
        let (q_len, kv_len) = match (&self.varlen, &self.paged) {
            (Some(vl), _) => (vl.q_len(b), vl.k_len(b)),
            (None, Some(pg)) => (self.q_len, pg.seq_len(b)),
            (None, None) => return Cow::Borrowed(self),
        };
        if (q_len, kv_len) == (self.q_len, self.kv_len) {
            Cow::Borrowed(self)
        } else {
            Cow::Owned(AttentionProblem { q_len, kv_len, ..self.clone() })
        }
    }

    /// Whether query row `i` of sequence `b` exists (a variable-length batch's shorter
    /// sequences have fewer than `q_len` rows).
    #[inline]
    pub fn has_q_row(&self, b: usize, i: usize) -> bool {
        match &self.varlen {
            Some(vl) => i < vl.q_len(b),
            None => i < self.q_len,
        }
    }

    /// `(batch index, row)` of query row `i` of sequence `b` in Q and O: `(b, i)`, or for a
    /// variable-length batch `(0, packed row)`.
    #[inline]
    pub fn q_position(&self, b: usize, i: usize) -> (usize, usize) {
        match &self.varlen {
            Some(vl) => (0, vl.q_row(b, i)),
            None => (b, i),
        }
    }

    /// `(batch index, row)` of key `j` of sequence `b` in K and V (not for paged caches).
    #[inline]
    pub fn k_position(&self, b: usize, j: usize) -> (usize, usize) {
        match &self.varlen {
            Some(vl) => (0, vl.k_row(b, j)),
            None => (b, j),
        }
    }

    /// Index of row `(b, h, i)` in the LSE: `(b · q_heads + h) · q_len + i`, or for a
    /// variable-length batch `h · total_q + packed row`.
    #[inline]
    pub fn lse_index(&self, b: usize, h: usize, i: usize) -> usize {
        match &self.varlen {
            Some(vl) => h * vl.total_q() + vl.q_row(b, i),
            None => (b * self.q_heads + h) * self.q_len + i,
        }
    }

    /// Batch entries and rows per head the tensors hold: `(batch, q_len, kv_len)`, or for a
    /// variable-length batch `(1, total_q, total_k)`.
    pub fn tensor_rows(&self) -> (usize, usize, usize) {
        match &self.varlen {
            Some(vl) => (1, vl.total_q(), vl.total_k()),
            None => (self.batch, self.q_len, self.kv_len),
        }
    }

    /// The standard ALiBi slopes of `heads` heads, `2^(-8 (h+1) / heads)` (Press et al.; exact
    /// for a power-of-two head count, the geometric sequence the paper uses).
    pub fn standard_alibi_slopes(heads: usize) -> Vec<f32> {
        (0..heads).map(|h| (-8.0 * (h + 1) as f64 / heads as f64).exp2() as f32).collect()
    }

    /// The score modifiers set on this problem, by name (empty: plain attention). Top-left
    /// alignment counts as one only where it changes the result (causal, a window, or ALiBi
    /// with `q_len != kv_len` in some sequence: a paged cache's or a variable-length batch's
    /// sequences have lengths of their own).
    pub fn modifiers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.window.is_some() {
            m.push("sliding window");
        }
        if self.softcap.is_some() {
            m.push("softcap");
        }
        if self.sinks.is_some() {
            m.push("attention sinks");
        }
        if self.alibi_slopes.is_some() {
            m.push("ALiBi");
        }
        if self.causal_align == CausalAlign::TopLeft && self.has_unequal_lengths() && (self.causal || !m.is_empty()) {
            m.push("top-left causal alignment");
        }
        m
    }

    /// Whether some sequence has `q_len != kv_len`, where bottom-right and top-left alignment
    /// differ.
    fn has_unequal_lengths(&self) -> bool {
        match (&self.varlen, &self.paged) {
            (Some(vl), _) => (0..vl.batch()).any(|b| vl.q_len(b) != vl.k_len(b)),
            (None, Some(pg)) => self.q_len != self.kv_len || (0..pg.batch()).any(|b| pg.seq_len(b) != self.q_len),
            (None, None) => self.q_len != self.kv_len,
        }
    }

    /// Whether any score modifier is set (see [`AttentionProblem::modifiers`]).
    pub fn has_modifiers(&self) -> bool {
        !self.modifiers().is_empty()
    }

    /// `a(i) + q_len`, the aligned position of row `i` shifted so that it is never negative
    /// (bottom-right: `a(i) = i + kv_len - q_len`; top-left: `a(i) = i`).
    #[inline]
    fn aligned_plus_q_len(&self, i: usize) -> u64 {
        match self.causal_align {
            CausalAlign::BottomRight => (i + self.kv_len) as u64,
            CausalAlign::TopLeft => (i + self.q_len) as u64,
        }
    }

    /// The signed distance `a(i) - j` that ALiBi and the window measure.
    #[inline]
    pub fn aligned_distance(&self, i: usize, j: usize) -> i64 {
        self.aligned_plus_q_len(i) as i64 - (j + self.q_len) as i64
    }

    /// The right extent in effect: the window's, at most 0 when causal; `None` when unbounded.
    pub fn right_extent(&self) -> Option<u64> {
        // Causal caps the window's right extent at 0 (no key after a(i)).
        if self.causal {
            return Some(0);
        }
        self.window.and_then(|w| w.right_bound())
    }

    /// The left extent in effect; `None` when unbounded.
    pub fn left_extent(&self) -> Option<u64> {
        self.window.and_then(|w| w.left_bound())
    }

    /// Whether query row `i` sees key `j`: the single definition of the mask (causal, window,
    /// alignment); [`AttentionProblem::visible_range`] is its contiguous form.
    #[inline]
    pub fn sees(&self, i: usize, j: usize) -> bool {
        if j >= self.kv_len {
            return false;
        }
        let d = self.aligned_distance(i, j); // a(i) - j
        self.right_extent().is_none_or(|r| -d <= r as i64) && self.left_extent().is_none_or(|l| d <= l as i64)
    }

    /// The keys query row `i` sees: always one contiguous range (empty when none).
    #[inline]
    pub fn visible_range(&self, i: usize) -> Range<usize> {
        let a = self.aligned_plus_q_len(i); // a(i) + q_len
        let q = self.q_len as u64;
        let kv = self.kv_len as u64;
        // j <= a(i) + r  <=>  j + q_len <= a + r  <=>  j < a + r + 1 - q_len
        let hi = match self.right_extent() {
            Some(r) => (a + r + 1).saturating_sub(q).min(kv),
            None => kv,
        };
        // j >= a(i) - l  <=>  j + q_len + l >= a
        let lo = match self.left_extent() {
            Some(l) => a.saturating_sub(l + q).min(kv),
            None => 0,
        };
        lo as usize..(hi.max(lo)) as usize
    }

    /// The scaled logit after the score modifiers (softcap, then ALiBi) for row `i` of Q head
    /// `h` and key `j`, from `s = scale · q·k` (f32, as the CPU kernel computes).
    #[inline]
    pub fn modify_score(&self, s: f32, h: usize, i: usize, j: usize) -> f32 {
        let mut s = s;
        if let Some(cap) = self.softcap {
            s = cap * (s / cap).tanh();
        }
        if let Some(slopes) = &self.alibi_slopes {
            // Validated to one slope per head at plan time; a head past them gets none.
            s -= slopes.get(h).copied().unwrap_or(0.0) * self.aligned_distance(i, j).unsigned_abs() as f32;
        }
        s
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

    /// Number of keys query row `i` sees ([`AttentionProblem::visible_range`]'s length).
    #[inline]
    pub fn visible_keys(&self, i: usize) -> usize {
        self.visible_range(i).len()
    }

    pub fn q_shape(&self) -> [usize; 4] {
        let (b, tq, _) = self.tensor_rows();
        self.dims(b, self.q_heads, tq, self.head_dim)
    }
    /// K's shape; with a paged cache, the pool's `[num_pages, page_size, kv_heads, head_dim]`.
    pub fn k_shape(&self) -> [usize; 4] {
        let (b, _, tk) = self.tensor_rows();
        match &self.paged {
            Some(pg) => pg.pool_shape(self.kv_heads, self.head_dim),
            None => self.dims(b, self.kv_heads, tk, self.head_dim),
        }
    }
    pub fn v_shape(&self) -> [usize; 4] {
        let (b, _, tk) = self.tensor_rows();
        match &self.paged {
            Some(pg) => pg.pool_shape(self.kv_heads, self.v_head_dim),
            None => self.dims(b, self.kv_heads, tk, self.v_head_dim),
        }
    }
    pub fn o_shape(&self) -> [usize; 4] {
        let (b, tq, _) = self.tensor_rows();
        self.dims(b, self.q_heads, tq, self.v_head_dim)
    }
    /// `[batch, q_heads, q_len]`; for a variable-length batch `[1, q_heads, total_q]`.
    pub fn lse_shape(&self) -> [usize; 3] {
        let (b, tq, _) = self.tensor_rows();
        [b, self.q_heads, tq]
    }

    /// A tensor's shape of `batch` entries of `seq` rows.
    fn dims(&self, batch: usize, heads: usize, seq: usize, dim: usize) -> [usize; 4] {
        match self.layout {
            Layout::Bhsd => [batch, heads, seq, dim],
            Layout::Bshd => [batch, seq, heads, dim],
        }
    }

    /// The strides of every tensor in effect: the explicit ones, else `layout`'s contiguous ones.
    pub fn tensor_strides(&self) -> TensorStrides {
        let (_, tq, tk) = self.tensor_rows();
        self.strides.unwrap_or(TensorStrides {
            q: Strides::new(self.layout, self.q_heads, tq, self.head_dim),
            k: Strides::new(self.layout, self.kv_heads, tk, self.head_dim),
            v: Strides::new(self.layout, self.kv_heads, tk, self.v_head_dim),
            o: Strides::new(self.layout, self.q_heads, tq, self.v_head_dim),
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
        let (_, tq, _) = self.tensor_rows();
        self.extent(self.q_strides(), self.q_heads, tq, self.head_dim)
    }
    /// Elements a K buffer must hold (with a paged cache: the pool).
    pub fn k_len_elems(&self) -> usize {
        match &self.paged {
            Some(pg) => pg.pool_elems(self.kv_heads, self.head_dim),
            None => self.extent(self.k_strides(), self.kv_heads, self.tensor_rows().2, self.head_dim),
        }
    }
    pub fn v_len_elems(&self) -> usize {
        match &self.paged {
            Some(pg) => pg.pool_elems(self.kv_heads, self.v_head_dim),
            None => self.extent(self.v_strides(), self.kv_heads, self.tensor_rows().2, self.v_head_dim),
        }
    }
    pub fn o_len_elems(&self) -> usize {
        let (_, tq, _) = self.tensor_rows();
        self.extent(self.o_strides(), self.q_heads, tq, self.v_head_dim)
    }

    /// The tensor that spans the most elements (strides included) and that span: what a kernel
    /// family's offset range must cover ([`crate::Family::max_tensor_elems`]).
    pub fn largest_tensor(&self) -> (&'static str, usize) {
        [
            ("Q elements", self.q_len_elems()),
            ("K elements", self.k_len_elems()),
            ("V elements", self.v_len_elems()),
            ("O elements", self.o_len_elems()),
        ]
        .into_iter()
        .fold(("Q elements", 0), |a, b| if b.1 > a.1 { b } else { a })
    }

    /// Saturates on overflow; [`AttentionProblem::validate`] refuses such problems first.
    fn extent(&self, s: Strides, heads: usize, seq: usize, dim: usize) -> usize {
        s.extent(self.tensor_rows().0, heads, seq, dim).unwrap_or(usize::MAX)
    }
    pub fn lse_len_elems(&self) -> usize {
        let (b, tq, _) = self.tensor_rows();
        b * self.q_heads * tq
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
        if let Some(vl) = &self.varlen {
            self.validate_varlen(vl)?;
        }
        let (b, tq, tk) = self.tensor_rows();
        for (what, dims) in [
            ("Q elements", [b, self.q_heads, tq, self.head_dim]),
            ("K elements", [b, self.kv_heads, tk, self.head_dim]),
            ("V elements", [b, self.kv_heads, tk, self.v_head_dim]),
            ("O elements", [b, self.q_heads, tq, self.v_head_dim]),
        ] {
            let n = dims.iter().map(|&d| d as u128).product::<u128>();
            if n > MAX_TENSOR_ELEMS as u128 {
                return Err(Error::TooLarge { what, value: n, limit: MAX_TENSOR_ELEMS as u128, path: ADDRESS_SPACE.into() });
            }
        }
        if self.strides.is_some() {
            self.validate_strides()?;
        }
        if let Some(pg) = &self.paged {
            self.validate_paged(pg)?;
        }
        self.validate_modifiers()
    }

    /// A variable-length batch: its own rules ([`VarLen`]), the packed BSHD layout without
    /// explicit strides, and K/V as tensors (a paged cache holds its own per-sequence lengths).
    fn validate_varlen(&self, vl: &VarLen) -> Result<()> {
        vl.validate(self.batch, self.q_len, self.kv_len)?;
        let bad = |reason: &str| Err(Error::InvalidVarLen { reason: reason.into() });
        if self.strides.is_some() {
            return bad("explicit strides with a variable-length batch: Q/K/V/O are packed [total, heads, dim]");
        }
        if self.layout != Layout::Bshd {
            return bad("a variable-length batch is packed token-major (Layout::Bshd); AttentionProblem::varlen sets it");
        }
        if self.paged.is_some() {
            return bad("a variable-length batch with a paged KV cache: pass the key lengths through PagedKv's seq_lens");
        }
        Ok(())
    }

    /// A paged cache: its own rules ([`PagedKv`]), pools within the index range, and no
    /// explicit strides (the pools' layout is fixed; Q and O take `layout`).
    fn validate_paged(&self, pg: &PagedKv) -> Result<()> {
        pg.validate(self.batch, self.kv_len)?;
        if self.strides.is_some() {
            return Err(Error::InvalidPagedKv {
                reason: "explicit strides with a paged cache: the pools are [num_pages, page_size, kv_heads, head_dim] and Q/O take the problem's layout".into(),
            });
        }
        for (what, dim) in [("K pool elements", self.head_dim), ("V pool elements", self.v_head_dim)] {
            let n = pg.num_pages as u128 * pg.page_size as u128 * self.kv_heads as u128 * dim as u128;
            // The paged decode kernel indexes the pools with 32-bit offsets.
            if n > MAX_TENSOR_ELEMS_32BIT as u128 {
                return Err(Error::TooLarge { what, value: n, limit: MAX_TENSOR_ELEMS_32BIT as u128, path: "a paged KV cache".into() });
            }
        }
        Ok(())
    }

    /// The score modifiers: extents `-1` or non-negative, a finite positive softcap, per-head
    /// arrays of `q_heads` entries (sinks finite or `-inf`, slopes finite).
    fn validate_modifiers(&self) -> Result<()> {
        let bad = |modifier: &'static str, reason: String| Err(Error::InvalidModifier { modifier, reason });
        if let Some(w) = self.window {
            for (side, x) in [("left", w.left), ("right", w.right)] {
                if x < -1 {
                    return bad("sliding window", format!("{side} extent {x}: an extent is -1 (unbounded) or at least 0"));
                }
                if x > u32::MAX as i64 / 2 {
                    return bad("sliding window", format!("{side} extent {x} exceeds {}: pass -1 for unbounded", u32::MAX / 2));
                }
            }
        }
        if let Some(cap) = self.softcap {
            if !cap.is_finite() || cap <= 0.0 {
                return bad("softcap", format!("cap {cap} is not a finite positive number"));
            }
        }
        for (modifier, values, allow_neg_inf) in
            [("attention sinks", &self.sinks, true), ("ALiBi slopes", &self.alibi_slopes, false)]
        {
            let Some(values) = values else { continue };
            if values.len() != self.q_heads {
                return bad(modifier, format!("{} values for {} Q heads: pass one per Q head", values.len(), self.q_heads));
            }
            if let Some((h, x)) =
                values.iter().enumerate().find(|(_, x)| !(x.is_finite() || (allow_neg_inf && **x == f32::NEG_INFINITY)))
            {
                let allowed = if allow_neg_inf { "finite or -inf" } else { "finite" };
                return bad(modifier, format!("head {h} has {x}: every value must be {allowed}"));
            }
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
                            "the tensor spans {} elements, above the limit of {MAX_TENSOR_ELEMS} ({ADDRESS_SPACE})",
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
            causal_align: CausalAlign::BottomRight,
            window: None,
            softcap: None,
            sinks: None,
            alibi_slopes: None,
            paged: None,
            varlen: None,
        };
        p.validate()?;
        p.check_shapes(&q, &k, &v)?;
        Ok(p)
    }
}
