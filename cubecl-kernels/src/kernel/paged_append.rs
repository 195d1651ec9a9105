//! `append_kv` on the device: new keys and values written into a paged cache's pools through
//! its block table (`crate::decode::PagedCache`'s layout: pools `[num_pages, page_size,
//! kv_heads, dim]`, the table buffer holding the block table then the sequences' lengths).
//!
//! Token `t` of sequence `b` goes to position `seq_lens[b] + t`: row `pos mod page_size` of
//! page `block_table[b][pos / page_size]`. The rows are copied as 32-bit words, whatever the
//! element type (a K/V row of any supported head dim is a whole number of words). A position
//! past the table's columns, or whose entry is not a page of the pool, writes nothing (the host
//! validates the table first; this keeps a bad one inside the buffers). The lengths are not
//! updated here: they are the caller's.

use cubecl::prelude::*;

/// The runtime arguments of one append.
#[derive(CubeType, CubeLaunch)]
pub struct AppendArgs {
    pub new_tokens: u32,
    pub page_shift: u32,
    pub max_pages: u32,
    pub num_pages: u32,
    /// Where the lengths start in the table buffer (`batch · max_pages`).
    pub lens_at: u32,
    /// 32-bit words of one pool row (all KV heads) of K and of V.
    pub k_words: u32,
    pub v_words: u32,
}

/// One cube per (token, sequence): grid `(new_tokens, batch)`; its units copy the token's K row
/// words, then its V row words. `new_k` / `new_v` are `[batch, new_tokens, kv_heads, dim]`.
#[cube(launch_unchecked)]
pub fn paged_append(
    k_pool: &mut Array<u32>,
    v_pool: &mut Array<u32>,
    new_k: &Array<u32>,
    new_v: &Array<u32>,
    table: &Array<u32>,
    args: &AppendArgs,
) {
    let t = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let pos = table[args.lens_at as usize + b] as usize + t;
    let shift = args.page_shift as usize;
    let column = pos >> shift;
    if column < args.max_pages as usize {
        let page = table[b * args.max_pages as usize + column] as usize;
        if page < args.num_pages as usize {
            let row = (page << shift) | (pos & ((1usize << shift) - 1));
            let token = b * args.new_tokens as usize + t;
            copy_row(k_pool, new_k, row, token, args.k_words as usize);
            copy_row(v_pool, new_v, row, token, args.v_words as usize);
        }
    }
}

/// Words `[0, words)` of source row `token` to pool row `row`, spread over the cube's units.
#[cube]
fn copy_row(pool: &mut Array<u32>, src: &Array<u32>, row: usize, token: usize, words: usize) {
    let units = CUBE_DIM as usize;
    let steps = words.div_ceil(units);
    for step in 0..steps {
        let i = step * units + UNIT_POS as usize;
        if i < words {
            pool[row * words + i] = src[token * words + i];
        }
    }
}
