// append_kv: writes new keys and values into the pools of a paged KV cache.
//
// Pools: 16-bit [num_pages, page_size, kv_heads, D] (V with DV). New rows: 16-bit [batch,
// new_tokens, kv_heads, D] (V with DV). Token t of sequence b goes to position
// pos = seq_lens[b] + t, i.e. row pos % page_size of page block_table[b][pos / page_size]. A
// position past the table's columns or whose entry is not a page of the pool writes nothing and
// sets *status to 1 (the host validates first; the flag makes a bad table visible instead of a
// write outside the pools). The lengths are not updated here: the caller owns them.
//
// Grid: x = token, y = sequence; 128 threads copy the token's kv_heads rows of K, then of V, in
// 16-byte pieces (D and DV multiples of 8, pointers 16-byte aligned).
#include "common.cuh"

struct AppendKvParams {
    u64 k_pool, v_pool;
    u64 k_new, v_new;
    u64 block_table, seq_lens;  // i32 [batch, max_pages], i32 [batch]
    u64 status;                 // u32, set to 1 on a missing page
    int batch, new_tokens, kv_heads, head_dim, v_head_dim;
    int page_size, max_pages, num_pages;
};

// `rows` rows of `dim` 16-bit elements from `src` (one row per KV head, contiguous) to the pool
// row `pool_row` of every KV head.
__device__ __forceinline__ void cta_copy_heads(unsigned short* pool, const unsigned short* src, i64 pool_row, int kv_heads, int dim) {
    const int chunks = dim / 8;
    for (int idx = threadIdx.x; idx < kv_heads * chunks; idx += blockDim.x) {
        const int h = idx / chunks, c = idx % chunks;
        const uint4 x = *reinterpret_cast<const uint4*>(src + (i64)h * dim + c * 8);
        *reinterpret_cast<uint4*>(pool + (pool_row * kv_heads + h) * dim + c * 8) = x;
    }
}

extern "C" __global__ void __launch_bounds__(128) append_kv(const AppendKvParams p) {
    const int t = blockIdx.x;
    const int b = blockIdx.y;
    const int pos = reinterpret_cast<const int*>(p.seq_lens)[b] + t;
    const int lp = pos / p.page_size;
    const int page = (pos >= 0 && lp < p.max_pages) ? reinterpret_cast<const int*>(p.block_table)[(i64)b * p.max_pages + lp] : -1;
    if (page < 0 || page >= p.num_pages) {
        if (threadIdx.x == 0) atomicExch(reinterpret_cast<u32*>(p.status), 1u);
        return;
    }
    const i64 row = (i64)page * p.page_size + pos % p.page_size;
    const i64 token = (i64)b * p.new_tokens + t;
    cta_copy_heads(reinterpret_cast<unsigned short*>(p.k_pool), reinterpret_cast<const unsigned short*>(p.k_new) + token * p.kv_heads * p.head_dim,
                   row, p.kv_heads, p.head_dim);
    cta_copy_heads(reinterpret_cast<unsigned short*>(p.v_pool), reinterpret_cast<const unsigned short*>(p.v_new) + token * p.kv_heads * p.v_head_dim,
                   row, p.kv_heads, p.v_head_dim);
}
