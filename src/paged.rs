//! Paged KV cache: K and V live in a pool of fixed-size pages, `[num_pages, page_size, kv_heads,
//! head_dim]` (vLLM's and FlashAttention's layout), and each sequence of the batch reads its keys
//! through its row of a block table `[batch, max_pages]` of page indices: key `j` of sequence `b`
//! is row `j % page_size` of page `block_table[b][j / page_size]`. Each sequence has its own
//! length (`seq_lens[b]`); the problem's `kv_len` is the longest of them, and masks and ALiBi
//! measure positions against the sequence's own length (bottom-right causal alignment per
//! sequence).
//!
//! [`PagedKv`] holds the page geometry, the block table and the lengths (host data, as the sinks
//! and ALiBi slopes are), so a [`crate::Plan`] of a paged problem validates every block-table
//! entry a sequence reads before anything runs. [`PagedKv::append`] writes new keys and values
//! into the pages (the CPU `append_kv`); entries past a sequence's pages are never read and may
//! hold anything (`-1` marks an unallocated page by convention).
//!
//! The block table and the lengths are immutable `Arc`s: a new block table (pages added,
//! reordered or freed) is a new [`PagedKv`], and [`PagedKv::append`] returns one with new
//! lengths over the same block table. The GPU backends keep the last tables they copied to the
//! device (per stream on CUDA) and skip the copy while the calls' plans hold the same `Arc`s
//! (clones of a plan or of a `PagedKv` share them), which makes the layers of one decode step
//! one copy; over the same block table with new lengths, the CUDA backend copies the lengths
//! alone. Tables in other `Arc`s are copied again, even with equal contents. Variable-length
//! offsets ([`crate::VarLen`]) are kept the same way.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::tensor::Element;

/// The page sizes every paged kernel takes: powers of two from 16 to 256 keys.
pub const PAGE_SIZES: [usize; 5] = [16, 32, 64, 128, 256];

/// A paged K/V cache's geometry and block table (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedKv {
    /// Keys per page; one of [`PAGE_SIZES`].
    pub page_size: usize,
    /// Pages in the K pool (and in the V pool).
    pub num_pages: usize,
    /// Columns of the block table: the most pages one sequence may hold.
    pub max_pages: usize,
    /// `[batch, max_pages]`, row-major: page indices into the pools.
    pub block_table: Arc<[i32]>,
    /// `[batch]`: keys each sequence holds.
    pub seq_lens: Arc<[i32]>,
}

impl PagedKv {
    /// A cache of `num_pages` pages of `page_size` keys, read through `block_table` (`batch`
    /// rows of `block_table.len() / batch` entries; `batch = seq_lens.len()`).
    pub fn new(page_size: usize, num_pages: usize, block_table: impl Into<Arc<[i32]>>, seq_lens: impl Into<Arc<[i32]>>) -> Self {
        let (block_table, seq_lens): (Arc<[i32]>, Arc<[i32]>) = (block_table.into(), seq_lens.into());
        let max_pages = if seq_lens.is_empty() { 0 } else { block_table.len() / seq_lens.len() };
        PagedKv { page_size, num_pages, max_pages, block_table, seq_lens }
    }

    /// Sequences (rows of the block table).
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    /// Keys of sequence `b` (0 for a batch entry past the table; validated at plan time).
    #[inline]
    pub fn seq_len(&self, b: usize) -> usize {
        self.seq_lens.get(b).map_or(0, |&n| n.max(0) as usize)
    }

    /// The longest sequence.
    pub fn max_seq_len(&self) -> usize {
        (0..self.batch()).map(|b| self.seq_len(b)).max().unwrap_or(0)
    }

    /// The pool row (`page · page_size + slot`) holding key `j` of sequence `b`. Only valid for
    /// `j < seq_len(b)` of a validated cache.
    #[inline]
    pub fn slot(&self, b: usize, j: usize) -> usize {
        let page = self.block_table[b * self.max_pages + j / self.page_size] as usize;
        page * self.page_size + j % self.page_size
    }

    /// Element offset of key `j` of sequence `b`, KV head `h`, in a pool of `kv_heads` heads of
    /// `dim` elements.
    #[inline]
    pub fn offset(&self, b: usize, h: usize, j: usize, kv_heads: usize, dim: usize) -> usize {
        (self.slot(b, j) * kv_heads + h) * dim
    }

    /// Elements of one pool of `kv_heads` heads of `dim` elements.
    pub fn pool_elems(&self, kv_heads: usize, dim: usize) -> usize {
        self.num_pages.saturating_mul(self.page_size).saturating_mul(kv_heads).saturating_mul(dim)
    }

    /// The pool's shape, `[num_pages, page_size, kv_heads, dim]`.
    pub fn pool_shape(&self, kv_heads: usize, dim: usize) -> [usize; 4] {
        [self.num_pages, self.page_size, kv_heads, dim]
    }

    /// Checks the cache against a problem of `batch` sequences whose `kv_len` must be the
    /// longest sequence (see [`PagedKv::validate_table`]).
    pub(crate) fn validate(&self, batch: usize, kv_len: usize) -> Result<()> {
        self.validate_table(batch, 0)?;
        if self.max_seq_len() != kv_len {
            return Err(Error::InvalidPagedKv {
                reason: format!(
                    "the problem's kv_len {kv_len} is not the longest sequence ({}); AttentionProblem::paged_kv sets it",
                    self.max_seq_len()
                ),
            });
        }
        Ok(())
    }

    /// A supported page size, a block table of `batch` rows, lengths within the table, and every
    /// entry a sequence reads (the pages covering its `seq_len` keys, plus `extra` keys about to
    /// be appended) inside the pool.
    pub(crate) fn validate_table(&self, batch: usize, extra: usize) -> Result<()> {
        if !PAGE_SIZES.contains(&self.page_size) {
            return Err(Error::UnsupportedPageSize { page_size: self.page_size, supported: PAGE_SIZES.to_vec() });
        }
        let bad = |reason: String| Err(Error::InvalidPagedKv { reason });
        if self.num_pages == 0 {
            return bad("the pool has no page (num_pages 0)".into());
        }
        if self.seq_lens.len() != batch {
            return bad(format!("{} sequence lengths for a batch of {batch}", self.seq_lens.len()));
        }
        if self.max_pages == 0 || self.block_table.len() != batch * self.max_pages {
            return bad(format!(
                "the block table holds {} entries: it must be [batch {batch}, max_pages] with max_pages >= 1",
                self.block_table.len()
            ));
        }
        // The kernels index pool rows with 32-bit integers.
        if self.num_pages as u128 * self.page_size as u128 > i32::MAX as u128 {
            return Err(Error::TooLarge {
                what: "pool rows (num_pages x page_size)",
                value: self.num_pages as u128 * self.page_size as u128,
                limit: i32::MAX as u128,
                path: "a paged KV cache".into(),
            });
        }
        for (b, &n) in self.seq_lens.iter().enumerate() {
            if n < 0 {
                return bad(format!("sequence {b} has length {n}"));
            }
            let need = n as usize + extra;
            let cap = self.max_pages.saturating_mul(self.page_size).min(i32::MAX as usize);
            if need > cap {
                return bad(format!(
                    "sequence {b} needs {need} keys, more than its {} pages of {} hold ({cap})",
                    self.max_pages, self.page_size
                ));
            }
            for p in 0..need.div_ceil(self.page_size) {
                let entry = self.block_table[b * self.max_pages + p];
                if entry < 0 || entry as usize >= self.num_pages {
                    return Err(Error::BlockTableEntry { sequence: b, index: p, entry, num_pages: self.num_pages });
                }
            }
        }
        Ok(())
    }

    /// `append_kv`: writes `new_tokens` new keys and values per sequence at positions
    /// `seq_len(b) ..` through the block table, and returns the cache with the lengths grown.
    /// `k_new` is `[batch, new_tokens, kv_heads, head_dim]` (and `v_new` with `v_head_dim`);
    /// the pools are `[num_pages, page_size, kv_heads, dim]`. Every page the new positions fall
    /// in must be in the table and the pool ([`Error::BlockTableEntry`], [`Error::InvalidPagedKv`]
    /// when the table has too few columns); nothing is written when any is missing.
    #[allow(clippy::too_many_arguments)]
    pub fn append<T: Element + Copy>(
        &self,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        k_pages: &mut [T],
        v_pages: &mut [T],
        k_new: &[T],
        v_new: &[T],
        new_tokens: usize,
    ) -> Result<PagedKv> {
        use crate::error::TensorName;
        let batch = self.batch();
        self.check_append(kv_heads, head_dim, v_head_dim, new_tokens)?;
        for (tensor, expected, got) in [
            (TensorName::K, self.pool_elems(kv_heads, head_dim), k_pages.len()),
            (TensorName::V, self.pool_elems(kv_heads, v_head_dim), v_pages.len()),
            (TensorName::K, batch * new_tokens * kv_heads * head_dim, k_new.len()),
            (TensorName::V, batch * new_tokens * kv_heads * v_head_dim, v_new.len()),
        ] {
            if expected != got {
                return Err(Error::BufferLength { tensor, expected, got });
            }
        }
        for b in 0..batch {
            for t in 0..new_tokens {
                let j = self.seq_len(b) + t;
                for h in 0..kv_heads {
                    let src = ((b * new_tokens + t) * kv_heads + h) * head_dim;
                    k_pages[self.offset(b, h, j, kv_heads, head_dim)..][..head_dim].copy_from_slice(&k_new[src..][..head_dim]);
                    let src = ((b * new_tokens + t) * kv_heads + h) * v_head_dim;
                    v_pages[self.offset(b, h, j, kv_heads, v_head_dim)..][..v_head_dim].copy_from_slice(&v_new[src..][..v_head_dim]);
                }
            }
        }
        Ok(self.grown(new_tokens))
    }

    /// The checks of an append of `new_tokens` keys per sequence, before any buffer: no zero
    /// size, every page the new positions fall in is in the table and the pool, and no two
    /// appended keys share a pool row (the result would depend on the order of the writes).
    pub(crate) fn check_append(&self, kv_heads: usize, head_dim: usize, v_head_dim: usize, new_tokens: usize) -> Result<()> {
        let batch = self.batch();
        for (name, v) in [("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim), ("v_head_dim", v_head_dim)] {
            if v == 0 {
                return Err(Error::ZeroSize { name });
            }
        }
        self.validate_table(batch, new_tokens)?;
        let mut written = std::collections::HashSet::new();
        for b in 0..batch {
            for t in 0..new_tokens {
                let slot = self.slot(b, self.seq_len(b) + t);
                if !written.insert(slot) {
                    return Err(Error::InvalidPagedKv {
                        reason: format!("sequence {b} appends key {} into pool row {slot}, which another appended key also takes", self.seq_len(b) + t),
                    });
                }
            }
        }
        Ok(())
    }

    /// The cache with every sequence `new_tokens` keys longer.
    pub(crate) fn grown(&self, new_tokens: usize) -> PagedKv {
        let seq_lens: Vec<i32> = (0..self.batch()).map(|b| (self.seq_len(b) + new_tokens) as i32).collect();
        PagedKv { seq_lens: seq_lens.into(), ..self.clone() }
    }
}
