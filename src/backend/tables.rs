//! Device copies of a problem's host tables (a paged cache's block table and lengths, a
//! variable-length batch's offsets), kept across calls. The tables are immutable `Arc`s, so the
//! `Arc`s a buffer's words came from identify its contents: a call whose plan holds the same
//! `Arc`s reads the buffer as it is. The cache holds clones of those `Arc`s, which keeps their
//! allocations alive: a different table can never take a cached one's address, so pointer
//! identity never mistakes new contents for old. A table with equal contents in a different
//! `Arc` is uploaded again (comparing contents would cost what the copy costs).

use std::sync::Arc;

use crate::AttentionProblem;

/// A problem's tables by identity, in the order a kernel reads them from one buffer: the first
/// table's words, then the second's.
#[derive(Debug, Clone)]
pub(crate) enum TableKey {
    /// A paged cache: the block table, then the sequence lengths.
    Paged { block_table: Arc<[i32]>, seq_lens: Arc<[i32]> },
    /// A variable-length batch: `cu_seqlens_q`, then `cu_seqlens_k`.
    Varlen { cu_seqlens_q: Arc<[i32]>, cu_seqlens_k: Arc<[i32]> },
}

impl TableKey {
    /// The tables `p`'s kernels read (a paged cache's before a variable-length batch's, as the
    /// launches choose), `None` for a problem without any.
    pub(crate) fn of(p: &AttentionProblem) -> Option<TableKey> {
        match (&p.paged, &p.varlen) {
            (Some(pg), _) => Some(TableKey::Paged { block_table: pg.block_table.clone(), seq_lens: pg.seq_lens.clone() }),
            (None, Some(vl)) => Some(TableKey::Varlen { cu_seqlens_q: vl.cu_seqlens_q.clone(), cu_seqlens_k: vl.cu_seqlens_k.clone() }),
            (None, None) => None,
        }
    }

    /// The two tables, in buffer order.
    pub(crate) fn parts(&self) -> [&Arc<[i32]>; 2] {
        match self {
            TableKey::Paged { block_table, seq_lens } => [block_table, seq_lens],
            TableKey::Varlen { cu_seqlens_q, cu_seqlens_k } => [cu_seqlens_q, cu_seqlens_k],
        }
    }

    /// Words of both tables.
    pub(crate) fn len(&self) -> usize {
        let [a, b] = self.parts();
        a.len() + b.len()
    }

    /// The buffer's words from word `from` on.
    pub(crate) fn words_from(&self, from: usize) -> Vec<i32> {
        let [a, b] = self.parts();
        a.iter().chain(b.iter()).skip(from).copied().collect()
    }

    /// Same kind and the same first table (the same allocation).
    fn same_head(&self, other: &TableKey) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other) && Arc::ptr_eq(self.parts()[0], other.parts()[0])
    }

    /// Same kind and both tables the same allocations.
    pub(crate) fn same(&self, other: &TableKey) -> bool {
        self.same_head(other) && Arc::ptr_eq(self.parts()[1], other.parts()[1])
    }
}

/// What a call copies into the table buffer before its launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upload {
    /// The buffer holds these tables.
    Nothing,
    /// The buffer holds the first table: the words from `from` on (the second table; a decode
    /// step's grown lengths over the same block table).
    Tail { from: usize },
    /// Every word, into the buffer as it is.
    All,
    /// A larger buffer, then every word.
    Grow,
}

/// Which tables one device buffer holds.
#[derive(Debug, Default)]
pub(crate) struct TableCache {
    held: Option<TableKey>,
}

impl TableCache {
    /// What a call reading `key` copies into a buffer of `capacity` words (0: no buffer).
    pub(crate) fn upload(&self, key: &TableKey, capacity: usize) -> Upload {
        if capacity < key.len() {
            return Upload::Grow;
        }
        match &self.held {
            _ if self.holds(key) => Upload::Nothing,
            Some(held) if held.same_head(key) => Upload::Tail { from: key.parts()[0].len() },
            _ => Upload::All,
        }
    }

    /// Whether the buffer holds `key`'s tables.
    pub(crate) fn holds(&self, key: &TableKey) -> bool {
        self.held.as_ref().is_some_and(|held| held.same(key))
    }

    /// The buffer's contents are unknown (before a copy, which may fail part way).
    pub(crate) fn forget(&mut self) {
        self.held = None;
    }

    /// The buffer holds `key`'s words.
    pub(crate) fn hold(&mut self, key: TableKey) {
        self.held = Some(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PagedKv, VarLen};

    fn paged(table: Vec<i32>, lens: Vec<i32>) -> AttentionProblem {
        AttentionProblem::new(lens.len(), 4, 1, 64).paged_kv(PagedKv::new(16, 8, table, lens))
    }

    /// A cache that copied `p`'s tables into a fresh buffer, and their key.
    fn after(p: &AttentionProblem) -> (TableCache, TableKey) {
        let key = TableKey::of(p).unwrap();
        let mut cache = TableCache::default();
        assert_eq!(cache.upload(&key, 0), Upload::Grow);
        cache.hold(key.clone());
        (cache, key)
    }

    #[test]
    fn the_same_arcs_skip_the_copy() {
        let p = paged(vec![3, 1, 0, 2], vec![20, 17]);
        let (cache, key) = after(&p);
        assert_eq!(key.len(), 6);
        assert_eq!(key.words_from(0), [3, 1, 0, 2, 20, 17]);
        // A clone of the problem (a plan's copy) shares the Arcs.
        let again = TableKey::of(&p.clone()).unwrap();
        assert_eq!(cache.upload(&again, 6), Upload::Nothing);
        assert_eq!(cache.upload(&again, 100), Upload::Nothing);
    }

    #[test]
    fn equal_contents_in_new_arcs_are_copied() {
        let (cache, _) = after(&paged(vec![3, 1, 0, 2], vec![20, 17]));
        let twin = TableKey::of(&paged(vec![3, 1, 0, 2], vec![20, 17])).unwrap();
        assert_eq!(cache.upload(&twin, 6), Upload::All);
        // A different page order over the same pool.
        let reordered = TableKey::of(&paged(vec![1, 3, 2, 0], vec![20, 17])).unwrap();
        assert_eq!(cache.upload(&reordered, 6), Upload::All);
    }

    #[test]
    fn new_lengths_over_the_same_block_table_copy_the_lengths() {
        let p = paged(vec![3, 1, 0, 2], vec![20, 17]);
        let (mut cache, _) = after(&p);
        let pg = p.paged.clone().unwrap();
        let grown = TableKey::of(&p.clone().paged_kv(pg.grown(1))).unwrap();
        assert_eq!(cache.upload(&grown, 6), Upload::Tail { from: 4 });
        assert_eq!(grown.words_from(4), [21, 18]);
        cache.hold(grown.clone());
        assert_eq!(cache.upload(&grown, 6), Upload::Nothing);
        // The old lengths again are a new tail too.
        assert_eq!(cache.upload(&TableKey::of(&p).unwrap(), 6), Upload::Tail { from: 4 });
    }

    #[test]
    fn switching_between_paged_and_varlen_copies() {
        let p = paged(vec![3, 1, 0, 2], vec![20, 17]);
        let (cache, paged_key) = after(&p);
        let pg = p.paged.clone().unwrap();
        // Offsets in the very Arcs of the paged tables are still another kind of table.
        let v = AttentionProblem::new(1, 4, 1, 64).varlen(VarLen::new(pg.block_table.clone(), pg.seq_lens.clone()));
        let vkey = TableKey::of(&v).unwrap();
        assert_eq!(cache.upload(&vkey, 6), Upload::All);
        let mut cache = TableCache::default();
        cache.hold(vkey.clone());
        assert_eq!(cache.upload(&vkey, 6), Upload::Nothing);
        assert_eq!(cache.upload(&paged_key, 6), Upload::All);
        // Varlen offsets sharing cu_seqlens_q: only cu_seqlens_k is copied.
        let vl = v.varlen.clone().unwrap();
        let k_only = VarLen::new(vl.cu_seqlens_q.clone(), vec![0, 5]);
        let kkey = TableKey::Varlen { cu_seqlens_q: k_only.cu_seqlens_q.clone(), cu_seqlens_k: k_only.cu_seqlens_k.clone() };
        assert_eq!(cache.upload(&kkey, 6), Upload::Tail { from: 4 });
        assert_eq!(kkey.words_from(4), [0, 5]);
    }

    #[test]
    fn longer_tables_reallocate() {
        let p = paged(vec![3, 1, 0, 2], vec![20, 17]);
        let (cache, key) = after(&p);
        assert_eq!(cache.upload(&key, 5), Upload::Grow);
        // More sequences over the same block-table Arc: the lengths no longer fit.
        let pg = p.paged.clone().unwrap();
        let wider = TableKey::Paged { block_table: pg.block_table.clone(), seq_lens: vec![20, 17, 3].into() };
        assert_eq!(cache.upload(&wider, 6), Upload::Grow);
        assert_eq!(cache.upload(&wider, 7), Upload::Tail { from: 4 });
        // A forgotten buffer is copied whole.
        let mut cache = cache;
        cache.forget();
        assert_eq!(cache.upload(&key, 6), Upload::All);
    }

    #[test]
    fn problems_without_tables_have_no_key() {
        assert!(TableKey::of(&AttentionProblem::new(2, 4, 1, 64)).is_none());
    }
}
