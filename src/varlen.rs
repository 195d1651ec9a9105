//! Variable-length batches: sequences of different lengths packed token-major, FlashAttention's
//! varlen convention. Q is `[total_q, q_heads, head_dim]`, K and V are `[total_k, kv_heads,
//! dim]`, O is `[total_q, q_heads, v_head_dim]`; sequence `b` owns Q/O rows `cu_seqlens_q[b] ..
//! cu_seqlens_q[b + 1]` and K/V rows `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]`. The LSE is
//! `[q_heads, total_q]` (FlashAttention-2's varlen `softmax_lse`).
//!
//! The problem's `batch` is the number of sequences and its `q_len` / `kv_len` the longest of
//! them ([`crate::AttentionProblem::varlen`] sets all three); masks, the window and ALiBi measure
//! positions against each sequence's own lengths (bottom-right causal alignment per sequence, as
//! FlashAttention's). Tensor shapes and strides are those of one batch entry of `total` rows in
//! [`crate::Layout::Bshd`]: `[1, total_q, q_heads, head_dim]`.
//!
//! [`VarLen`] holds the offsets as host data (as [`crate::PagedKv`] holds its block table), so a
//! plan validates them before anything runs: a kernel can trust that every row it reads lies
//! inside its buffers.

use std::sync::Arc;

use crate::error::{Error, Result};

/// Cumulative sequence lengths of a packed batch (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarLen {
    /// `[batch + 1]`: `0`, then the running sum of the query lengths.
    pub cu_seqlens_q: Arc<[i32]>,
    /// `[batch + 1]`: `0`, then the running sum of the key lengths.
    pub cu_seqlens_k: Arc<[i32]>,
}

impl VarLen {
    /// Offsets as FlashAttention takes them (`cu_seqlens_q`, `cu_seqlens_k`, `batch + 1`
    /// entries each, starting at 0, non-decreasing).
    pub fn new(cu_seqlens_q: impl Into<Arc<[i32]>>, cu_seqlens_k: impl Into<Arc<[i32]>>) -> Self {
        VarLen { cu_seqlens_q: cu_seqlens_q.into(), cu_seqlens_k: cu_seqlens_k.into() }
    }

    /// Offsets from per-sequence lengths: `q_lens[b]` queries attend to `k_lens[b]` keys.
    /// Lengths that overflow `i32` saturate and are refused by validation.
    pub fn from_lengths(q_lens: &[usize], k_lens: &[usize]) -> Self {
        let cumulative = |lens: &[usize]| -> Arc<[i32]> {
            let mut total = 0i64;
            std::iter::once(0)
                .chain(lens.iter().map(|&n| {
                    total = total.saturating_add(n.min(i64::MAX as usize) as i64);
                    total.min(i32::MAX as i64) as i32
                }))
                .collect()
        };
        VarLen { cu_seqlens_q: cumulative(q_lens), cu_seqlens_k: cumulative(k_lens) }
    }

    /// Sequences in the batch (0 for offsets too short to hold one; validation refuses them).
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }

    fn length(cu: &[i32], b: usize) -> usize {
        match (cu.get(b), cu.get(b + 1)) {
            (Some(&a), Some(&e)) if e > a => (e - a) as usize,
            _ => 0,
        }
    }

    fn start(cu: &[i32], b: usize) -> usize {
        cu.get(b).map_or(0, |&a| a.max(0) as usize)
    }

    /// Queries of sequence `b`.
    #[inline]
    pub fn q_len(&self, b: usize) -> usize {
        Self::length(&self.cu_seqlens_q, b)
    }

    /// Keys of sequence `b`.
    #[inline]
    pub fn k_len(&self, b: usize) -> usize {
        Self::length(&self.cu_seqlens_k, b)
    }

    /// The packed row of query `i` of sequence `b`.
    #[inline]
    pub fn q_row(&self, b: usize, i: usize) -> usize {
        Self::start(&self.cu_seqlens_q, b) + i
    }

    /// The packed row of key `j` of sequence `b`.
    #[inline]
    pub fn k_row(&self, b: usize, j: usize) -> usize {
        Self::start(&self.cu_seqlens_k, b) + j
    }

    /// Packed query rows (`total_q`).
    pub fn total_q(&self) -> usize {
        self.cu_seqlens_q.last().map_or(0, |&n| n.max(0) as usize)
    }

    /// Packed key rows (`total_k`).
    pub fn total_k(&self) -> usize {
        self.cu_seqlens_k.last().map_or(0, |&n| n.max(0) as usize)
    }

    /// The longest query sequence.
    pub fn max_q_len(&self) -> usize {
        (0..self.batch()).map(|b| self.q_len(b)).max().unwrap_or(0)
    }

    /// The longest key sequence.
    pub fn max_k_len(&self) -> usize {
        (0..self.batch()).map(|b| self.k_len(b)).max().unwrap_or(0)
    }

    /// The sequence and position of packed key row `t` (`None` past `total_k`).
    pub fn key_of_row(&self, t: usize) -> Option<(usize, usize)> {
        if t >= self.total_k() {
            return None;
        }
        // The last sequence whose start is at or before `t` (empty sequences share starts).
        let b = self.cu_seqlens_k.partition_point(|&s| s as i64 <= t as i64).checked_sub(1)?;
        Some((b, t - Self::start(&self.cu_seqlens_k, b)))
    }

    /// Both offset arrays: `batch + 1` entries each, starting at 0, non-decreasing, and the
    /// problem's `batch` / `q_len` / `kv_len` those [`crate::AttentionProblem::varlen`] set.
    pub(crate) fn validate(&self, batch: usize, q_len: usize, kv_len: usize) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidVarLen { reason });
        for (name, cu) in [("cu_seqlens_q", &self.cu_seqlens_q), ("cu_seqlens_k", &self.cu_seqlens_k)] {
            if cu.len() < 2 {
                return bad(format!("{name} has {} entries: it needs batch + 1 >= 2", cu.len()));
            }
            if cu.len() != batch + 1 {
                return bad(format!("{name} has {} entries for a batch of {batch}: it needs batch + 1", cu.len()));
            }
            if cu[0] != 0 {
                return bad(format!("{name}[0] is {}: the offsets start at 0", cu[0]));
            }
            if let Some(b) = (0..batch).find(|&b| cu[b + 1] < cu[b]) {
                return bad(format!("{name} decreases at sequence {b}: {} then {}", cu[b], cu[b + 1]));
            }
        }
        if self.max_q_len() != q_len || self.max_k_len() != kv_len {
            return bad(format!(
                "the problem's q_len {q_len} / kv_len {kv_len} are not the longest sequences ({} / {}); AttentionProblem::varlen sets them",
                self.max_q_len(),
                self.max_k_len()
            ));
        }
        Ok(())
    }

    /// The offsets as one `i32` buffer, `cu_seqlens_q` then `cu_seqlens_k` (what the device
    /// kernels read).
    pub fn words(&self) -> Vec<i32> {
        self.cu_seqlens_q.iter().chain(self.cu_seqlens_k.iter()).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_round_trip_through_the_offsets() {
        let v = VarLen::from_lengths(&[3, 0, 5, 1], &[4, 2, 0, 7]);
        assert_eq!(&*v.cu_seqlens_q, &[0, 3, 3, 8, 9]);
        assert_eq!(&*v.cu_seqlens_k, &[0, 4, 6, 6, 13]);
        assert_eq!((v.batch(), v.total_q(), v.total_k(), v.max_q_len(), v.max_k_len()), (4, 9, 13, 5, 7));
        assert_eq!((0..4).map(|b| v.q_len(b)).collect::<Vec<_>>(), [3, 0, 5, 1]);
        assert_eq!((v.q_row(2, 4), v.k_row(3, 0)), (7, 6));
        v.validate(4, 5, 7).unwrap();
    }

    #[test]
    fn key_rows_map_back_to_their_sequence_past_empty_ones() {
        let v = VarLen::from_lengths(&[1, 1, 1, 1], &[4, 2, 0, 7]);
        let mut seen = Vec::new();
        for t in 0..v.total_k() {
            let (b, j) = v.key_of_row(t).unwrap();
            assert_eq!(v.k_row(b, j), t);
            assert!(j < v.k_len(b));
            seen.push(b);
        }
        assert_eq!(seen, [0, 0, 0, 0, 1, 1, 3, 3, 3, 3, 3, 3, 3]);
        assert_eq!(v.key_of_row(13), None);
    }

    #[test]
    fn bad_offsets_are_typed_errors() {
        let err = |v: VarLen, batch, q, k| match v.validate(batch, q, k) {
            Err(Error::InvalidVarLen { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(err(VarLen::new([0], [0]), 0, 0, 0).contains("batch + 1 >= 2"));
        assert!(err(VarLen::new([0, 2, 1], [0, 1, 2]), 2, 2, 1).contains("decreases at sequence 1"));
        assert!(err(VarLen::new([1, 2], [0, 2]), 1, 1, 2).contains("start at 0"));
        assert!(err(VarLen::new([0, 2, 4], [0, 2]), 2, 2, 2).contains("cu_seqlens_k has 2 entries for a batch of 2"));
        assert!(err(VarLen::from_lengths(&[2, 3], &[1, 1]), 2, 2, 1).contains("not the longest"));
    }
}
