//! Split-KV decode on manual MMA (`mma.sync` m16n8k16, CUDA sm_80 and later) over NVFP4 codes:
//! the 4-bit kernel's numerics (`fma_vec_fp4.rs`: NVFP4 Q and K along the head dim, NVFP4 `Vᵀ`
//! along the keys; P quantized to NVFP4 per 16 keys with the fixed tensor scale `1/2688` and a
//! running max that always moves for `Fp4V::Nvfp4`, P rounded to f16 for `Fp4V::Nvfp4P16`) in
//! the MMA decode kernel's shape (`decode_mma.rs`: a handful of packed query rows of one KV
//! head, operands built in registers from global memory, no shared-memory stage or barrier in
//! the key loop, one online softmax per warp).
//!
//! Why: a long-context decode step reads the KV cache once and does little arithmetic on it,
//! so its time is the bytes read. NVFP4 K and V are 4.5 bits an element against 16; what is
//! left to pay for is the decode, about two instructions a code.
//!
//! **Decoding.** The tensor cores take f16; every E2M1 code becomes an exact f16 with integer
//! instructions only: its sign, exponent and mantissa bits are placed into f16's
//! (`e2m1_f16_pairs`: the value times 2^-14), and one f16 multiply by `block_scale · 128` gives
//! `e2m1 · block_scale · 2^-7`, exact (at most 6 significant bits, between 2^-17 and 21); the
//! factors 2^7 come back once, in the score scale (2^14 for Q and K) and in O's. A word of 8
//! codes gives the pairs (0, 4), (1, 5), (2, 6), (3, 7): the MMA's k-slots follow that order.
//! The UE4M3 block scales become f16 the same way (`scale_x128`), so no FP8 conversion is
//! needed.
//!
//! **Lanes** (`l = 4g + t`), per warp tile of 64 keys (4 key steps of 16):
//! - Sᵀ = K·Qᵀ, so that the few query rows are the MMA's 8 columns rather than 16 rows
//!   mostly zero (half the MMAs and score registers of S = Q·Kᵀ): m-tile `c`'s A row `r` is key
//!   [`key_of`]`(2c + r/8, r%8)`, with `key_of(j, n) = 16·(n/2) + 4·(n%2) + 8·(j/4) +
//!   2·((j/2)%2) + j%2`; lane `(g, t)` loads the keys of rows `g` and `g + 8` (its quarter `t` of
//!   the head dim, `d/32` words and `d/64` scale bytes). The k-slots `2t, 2t+1, 2t+8, 2t+9` of
//!   step `s` are head-dim elements `t·d/4 + 8·(s/2) + 2·(s%2) + (0, 4, 1, 5)`, and Qᵀ (decoded
//!   once, column `g` = packed row `g`) follows the same order.
//! - The accumulators of lane `(g, t)` are rows `2t, 2t + 1`; a row's 64 keys are on the 8
//!   lanes sharing `t`, and its 16-key P block `b` (keys `16b ..`) on lanes `g = 2b, 2b + 1`.
//! - Oᵀ += Vᵀ·Pᵀ: key step `c`'s k-slot `r` is Sᵀ m-tile `c`'s row `r`, i.e. keys `16t +
//!   8·(c/2) + 2·(c%2) + {0, 4}` (slots `2t, 2t + 1`) and `+ {1, 5}` (`2t + 8, 2t + 9`), which is
//!   the pair order of a decoded `Vᵀ` word. Pᵀ's B fragment (row `g` in lane `(g, t)`) comes
//!   from the accumulators by four shuffles (`transpose_p`). M-tile `i`'s rows `g`, `g + 8` are
//!   channels `16i + g`, `16i + g + 8`, of which lane `(g, t)` reads the 16 keys `16t ..` (8
//!   bytes, one block, one scale byte) per tile.
//!
//! Within a split, warp `w` takes the 64 keys from `w·64` of each 256-key cube tile, runs its
//! own online softmax, and the warps are combined through shared memory at the end; the splits
//! by [`super::decode::decode_merge`]. The CPU emulation follows these streams
//! (`Blocking::key_streams`), since P's rounding depends on the running max of the stream that
//! saw the key.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;
use half::f16;

use super::decode::{split_keys, DecodeArgs};
use super::fma_vec_fp4::{ue4m3_code, ue4m3_value, Fp4Shape, P_TENSOR_SCALE_BITS};
use super::decode_mma::combine_warps;
use super::mma::{acc_zero, Pair, MMA_K, MMA_M, MMA_N, PLANE};
use super::{is_visible, AttnShape, MASK_THRESHOLD, NO_MAX};

/// The E2M1 magnitude bits of each byte's low code moved to bits 1..3: the select mask of
/// [`e2m1_f16_pairs`].
pub const MAG_BITS: u32 = 0x0e0e_0e0e;

/// Most packed rows: the MMA's 8 columns of Oᵀ.
pub const FP4_DECODE_MAX_ROWS: usize = 8;
/// Key steps of 16 per warp tile: 64 keys, four 16-key P blocks, one per lane quad index.
pub const FP4_DECODE_STEPS: usize = 4;
/// Keys per warp tile.
pub const FP4_DECODE_WARP_KEYS: usize = MMA_K * FP4_DECODE_STEPS;

/// Compile-time key of the 4-bit MMA decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp4DecodeConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Packed query rows, exactly (`group · q_len`).
    pub rows: usize,
    pub warps: usize,
    pub causal: bool,
    pub write_lse: bool,
    /// Add the per-row LSE shift (K was smoothed).
    pub shift_lse: bool,
    /// P quantized to NVFP4 per 16 keys (`Fp4V::Nvfp4`); otherwise P rounded to f16
    /// (`Fp4V::Nvfp4P16`).
    pub p_nvfp4: bool,
}

impl Fp4DecodeConfig {
    pub const fn units(&self) -> usize {
        self.warps * PLANE
    }
    /// Keys per cube tile (the split's unit).
    pub const fn bk(&self) -> usize {
        self.warps * FP4_DECODE_WARP_KEYS
    }
    /// K rows a lane holds per warp tile: A rows `g` and `g + 8` of each of Sᵀ's m-tiles.
    pub const fn k_rows(&self) -> usize {
        2 * FP4_DECODE_STEPS
    }
    #[allow(dead_code)] // the NVRTC checks' HMMA count
    pub const fn qk_steps(&self) -> usize {
        self.head_dim / MMA_K
    }
    pub const fn o_tiles(&self) -> usize {
        self.v_head_dim / MMA_M
    }
    /// 32-bit words of a K row one lane holds (`d/4` codes): the launch's vector width.
    pub const fn k_words(&self) -> usize {
        self.head_dim / 32
    }
    /// f32s of the warps' final states: `[warps][rows][2 + dv]` (max, sum, accumulator).
    pub const fn merge_len(&self) -> usize {
        self.warps * self.rows * (self.v_head_dim + 2)
    }
    #[allow(dead_code)] // the NVRTC checks' shared-memory count
    pub const fn smem_bytes(&self) -> usize {
        4 * self.merge_len()
    }

    /// Why the kernel's loops do not cover this configuration, if they do not.
    pub fn invalid(&self) -> Option<String> {
        let (d, dv) = (self.head_dim, self.v_head_dim);
        if self.rows == 0 || self.rows > FP4_DECODE_MAX_ROWS {
            return Some(format!("{} rows: the 4-bit MMA decode kernel holds 1..={FP4_DECODE_MAX_ROWS}", self.rows));
        }
        // A lane's quarter of a K row is whole 16-element scale blocks (d/64 of them) and a
        // lane holds 8 K rows and 16 V channel blocks per tile: at d 128 that is 229 registers
        // and no spill; at d 64 ptxas keeps 128 registers and spills, so the 4-bit FMA kernel
        // keeps that head dim.
        if d != 128 {
            return Some(format!("head dim {d}: the 4-bit MMA decode kernel takes 128"));
        }
        if dv == 0 || !dv.is_multiple_of(MMA_M) || dv > 128 {
            return Some(format!("V head dim {dv}: a multiple of 16 up to 128"));
        }
        if self.warps == 0 {
            return Some("no warps".into());
        }
        None
    }
}

/// One cube per (split, KV head, batch): grid `(splits, kv_heads, batch)`, `cfg.units()`
/// units. Operands as the 4-bit kernel's (`fma_vec_fp4`): Q and K codes in dense rows (`k` as
/// vectors of `d/32` words, a lane's quarter row), their scale bytes packed in words, `Vᵀ`
/// codes in rows of `fshape.v_words` words (read as word pairs: 16 keys), its scale bytes,
/// the three tensor scales. `direct`: one split, O (f32, the shape's strides) and the LSE
/// written in place; otherwise the partial states go to `part_o` / `part_lse` for the merge.
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_decode_mma_fp4<N: Size>(
    q: &Array<u32>,
    q_sc: &Array<u32>,
    k: &Array<Vector<u32, N>>,
    k_sc: &Array<u32>,
    v: &Array<Vector<u32, Pair>>,
    v_sc: &Array<u32>,
    q_ts: &Array<f32>,
    k_ts: &Array<f32>,
    v_ts: &Array<f32>,
    lse_shift: &Array<f32>,
    o: &mut Array<f32>,
    lse: &mut Array<f32>,
    part_o: &mut Array<f32>,
    part_lse: &mut Array<f32>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    fshape: &Fp4Shape,
    #[comptime] cfg: Fp4DecodeConfig,
    #[comptime] direct: bool,
) {
    let unit = UNIT_POS as usize;
    let warp = unit / PLANE;
    let lane = UNIT_POS_PLANE;
    let g = lane as usize / 4;
    let t = lane as usize % 4;
    let split = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let group = shape.group as usize;
    let kv_heads = fshape.kv_heads as usize;
    let rows = comptime!(cfg.rows);

    let mut merge = SharedMemory::<f32>::new(comptime!(cfg.merge_len()));

    // Qᵀ's column `g` is packed row `g` (padding past `rows`: any position, Q zero); the lane's
    // softmax rows are `2t` and `2t + 1` (the accumulators' columns).
    let row_head = kv_head * group + g / q_len;
    let mut row_pos = Vector::<u32, Pair>::empty();
    row_pos[0] = ((2 * t) % q_len) as u32;
    row_pos[1] = ((2 * t + 1) % q_len) as u32;
    let scale = shape.scale;
    // Q and K are decoded as `value · 2^-7` each (see `decode_word`): the factor 2^14 back, exact.
    let qk_factor = q_ts[0] * k_ts[0] * 16384.0f32;
    // `MAG_BITS` as a value the compiler cannot see (no shape has u32::MAX query rows), so that
    // each decode step stays one three-input bitwise select rather than two masks.
    let mag = select(shape.q_len == u32::MAX, 0u32, MAG_BITS);
    let q_frags = load_q(q, q_sc, shape, batch, row_head, g % q_len, g < rows, t, mag, cfg);

    let k_row0 = (batch * kv_heads + kv_head) * kv_len;
    let v_row0 = (batch * kv_heads + kv_head) * comptime!(cfg.v_head_dim);
    let v_words = fshape.v_words as usize;
    let keys = split_keys(shape, dec, kv_len, split, cfg.bk(), cfg.causal);
    let (k_begin, num_tiles, full) = (keys.begin, keys.tiles, keys.full);
    let warp_k0 = k_begin + warp * FP4_DECODE_WARP_KEYS;

    let mut k_regs = Array::<Vector<u32, N>>::new(comptime!(cfg.k_rows()));
    let mut k_scales = Array::<u32>::new(comptime!(cfg.k_rows()));
    let mut v_regs = Array::<Vector<u32, Pair>>::new(comptime!(2 * cfg.o_tiles()));
    let mut v_scales = Array::<u32>::new(comptime!(2 * cfg.o_tiles()));
    let mut s_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..FP4_DECODE_STEPS {
        s_frags.push(acc_zero());
    }
    let mut o_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..cfg.o_tiles() {
        o_frags.push(acc_zero());
    }
    let mut row_max = Vector::<f32, Pair>::new(NO_MAX);
    let mut row_sum = Vector::<f32, Pair>::new(0.0f32);

    if num_tiles > 0 {
        load_k(k, k_sc, &mut k_regs, &mut k_scales, k_row0, warp_k0, kv_len, g, t, cfg);
        load_v(v, v_sc, &mut v_regs, &mut v_scales, v_row0, v_words, warp_k0, g, t, cfg);
    }
    for tile in 0..num_tiles {
        let k0 = warp_k0 + tile * comptime!(cfg.bk());
        score_matmul(&q_frags, &k_regs, &k_scales, &mut s_frags, mag, cfg);
        if tile + 1 < num_tiles {
            load_k(k, k_sc, &mut k_regs, &mut k_scales, k_row0, k0 + comptime!(cfg.bk()), kv_len, g, t, cfg);
        }
        if k0 + FP4_DECODE_WARP_KEYS > full {
            softmax(&mut s_frags, &mut o_frags, &mut row_max, &mut row_sum, qk_factor, scale, k0, row_pos, q_len, kv_len, g, true, cfg);
        } else {
            softmax(&mut s_frags, &mut o_frags, &mut row_max, &mut row_sum, qk_factor, scale, k0, row_pos, q_len, kv_len, g, false, cfg);
        }
        value_matmul(&s_frags, &v_regs, &v_scales, &mut o_frags, g, t, mag, cfg);
        if tile + 1 < num_tiles {
            load_v(v, v_sc, &mut v_regs, &mut v_scales, v_row0, v_words, k0 + comptime!(cfg.bk()), g, t, cfg);
        }
    }

    // The warp's state into the merge: rows 2t and 2t + 1, the partial sums of the lanes that
    // share `t` reduced; each lane's channels `16i + g` and `16i + g + 8`.
    row_sum += plane_shuffle_xor(row_sum, 4u32);
    row_sum += plane_shuffle_xor(row_sum, 8u32);
    row_sum += plane_shuffle_xor(row_sum, 16u32);
    let pitch = comptime!(cfg.v_head_dim + 2);
    #[unroll]
    for e in 0..2usize {
        let r = 2 * t + e;
        if g == 0 && r < rows {
            let at = (warp * rows + r) * pitch;
            merge[at] = row_max[e];
            merge[at + 1] = row_sum[e];
        }
    }
    #[unroll]
    for e in 0..2usize {
        let r = 2 * t + e;
        if r < rows {
            let at = (warp * rows + r) * pitch + 2 + g;
            #[unroll]
            for i in 0..cfg.o_tiles() {
                let frag = o_frags.index(i);
                merge[at + 16 * i] = frag[0][e];
                merge[at + 16 * i + 8] = frag[1][e];
            }
        }
    }
    sync_cube();

    // Combine: task (row, 4 channels). The accumulators hold Σ p̃·ṽ of elements times block
    // scales: the tensor scales (V's, and P's fixed one when P is NVFP4) once, here.
    // V is decoded as `value · 2^-7`: the factor 128 back, exact.
    let mut o_factor = v_ts[0] * 128.0f32;
    if comptime!(cfg.p_nvfp4) {
        o_factor *= f32::new(comptime!(f32::from_bits(P_TENSOR_SCALE_BITS)));
    }
    let quads = comptime!(cfg.v_head_dim / 4);
    let tasks = comptime!(cfg.rows * cfg.v_head_dim / 4);
    #[unroll]
    for step in 0..comptime!(tasks.div_ceil(cfg.units())) {
        let task = step * comptime!(cfg.units()) + unit;
        if task < tasks {
            let r = task / quads;
            let c = (task % quads) * 4;
            let head = kv_head * group + r / q_len;
            let pos = r % q_len;
            let (m, total, out) = combine_warps(&merge, r, c, scale, rows, pitch, cfg.warps);
            let seen = total > 0.0;
            let inv = select(seen, o_factor / total, 0.0);
            let lse_row = (batch * shape.q_heads as usize + head) * q_len + pos;
            let mut state_lse = m * scale + f32::ln(select(seen, total, 1.0));
            if comptime!(cfg.shift_lse) {
                state_lse += lse_shift[lse_row];
            }
            if comptime!(direct) {
                let o_row = batch * shape.o_s0 as usize + head * shape.o_s1 as usize + pos * shape.o_s2 as usize + c;
                #[unroll]
                for e in 0..4usize {
                    o[o_row + e] = out[e] * inv;
                }
                if comptime!(cfg.write_lse) {
                    if c == 0 {
                        lse[lse_row] = select(seen, state_lse, shape.lse_empty);
                    }
                }
            } else {
                let state = ((batch * kv_heads + kv_head) * dec.splits as usize + split) * rows + r;
                #[unroll]
                for e in 0..4usize {
                    part_o[state * comptime!(cfg.v_head_dim) + c + e] = out[e] * inv;
                }
                if c == 0 {
                    part_lse[state] = select(seen, state_lse, NO_MAX);
                }
            }
        }
    }
}

/// The key (from the warp tile's first) of S tile `j`'s column `n` ([module docs](self)).
#[cube]
pub(crate) fn key_of(#[comptime] j: usize, n: usize) -> usize {
    16 * (n / 2) + 4 * (n % 2) + comptime!(8 * (j / 4) + 2 * ((j / 2) % 2) + j % 2)
}

/// The E2M1 codes of `w` (code `x` in bits `4x .. 4x + 4`) as four f16 pairs of the code's
/// value times 2^-14, exact: the sign, exponent and mantissa bits placed into f16's (exponent
/// field 0..3, the subnormal 0.5 landing on f16's subnormal 2^-15). Pair `i` holds codes `i`
/// (low half) and `i + 4`: each field moves by the same shift in both halves.
#[cube]
pub(crate) fn e2m1_f16_pairs(w: u32, mag: u32) -> Array<u32> {
    // The even codes (0, 2, 4, 6) as f16 high bytes, one per byte: magnitude bits to 1..3 and,
    // from a second shift, sign to 7 (one bitwise select; that shift's other bits are left in
    // 0 and 4..6, which the final masks drop); then the odd codes. Each byte pair is one f16
    // pair's high bytes.
    let even = ((w << 1u32) & mag) | ((w << 4u32) & !mag);
    let odd = ((w >> 3u32) & mag) | (w & !mag);
    let mut out = Array::<u32>::new(4usize);
    out[0] = (even << 8u32) & 0x8e00_8e00u32;
    out[1] = (odd << 8u32) & 0x8e00_8e00u32;
    out[2] = even & 0x8e00_8e00u32;
    out[3] = odd & 0x8e00_8e00u32;
    out
}

/// UE4M3 scale code `code` (low byte; 0x7f, NaN, never occurs) as two f16 of `scale · 128`,
/// exact (at most 57344), with integer instructions: the code's exponent and mantissa bits
/// placed at f16's bits 7..13 read as `scale · 2^-8` (E4M3's subnormals landing on f16's, the
/// same 2^-8 apart), then one exact multiply by 2^15.
#[cube]
fn scale_x128(code: u32) -> Vector<f16, Pair> {
    Vector::<f16, Pair>::reinterpret(ue4m3_f16_bits(code)) * Vector::<f16, Pair>::new(f16::from_int(32768))
}

/// The bits of two f16 of `ue4m3(code) · 2^-8` (see [`scale_x128`]).
#[cube]
pub(crate) fn ue4m3_f16_bits(code: u32) -> u32 {
    (code & 0x7fu32) * 0x0080_0080u32
}

/// The word's four pairs of `e2m1 · scale · 2^-7` in f16 (`s128` from [`scale_x128`]), pair
/// `i` codes `(i, i + 4)`. Exact: the value has at most 6 significant bits, is at most 21 and,
/// when not zero, at least 2^-17, whose lowest bit f16's subnormals still hold.
#[cube]
fn decode_word(w: u32, s128: Vector<f16, Pair>, mag: u32) -> Array<Vector<f16, Pair>> {
    let bits = e2m1_f16_pairs(w, mag);
    let mut out = Array::<Vector<f16, Pair>>::new(4usize);
    #[unroll]
    for i in 0..4usize {
        out[i] = Vector::<f16, Pair>::reinterpret(bits[i]) * s128;
    }
    out
}

/// Byte `index` of a byte buffer packed 4 per word, in the low byte.
#[cube]
fn byte_word(src: &Array<u32>, index: usize) -> u32 {
    src[index / 4] >> (8 * (index % 4)) as u32
}

/// The lane's Qᵀ fragments, `[k-step]`: column `g` is Q row `g` (zero when not `real`),
/// quarter `t` of the head dim decoded in the k-slot order of the module docs.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_q(
    q: &Array<u32>,
    q_sc: &Array<u32>,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    pos: usize,
    real: bool,
    t: usize,
    mag: u32,
    #[comptime] cfg: Fp4DecodeConfig,
) -> Sequence<Array<Vector<f16, Pair>>> {
    let row = (batch * shape.q_heads as usize + head) * shape.q_len as usize + pos;
    let word0 = row * comptime!(cfg.head_dim / 8) + t * comptime!(cfg.k_words());
    let byte0 = row * comptime!(cfg.head_dim / 16) + t * comptime!(cfg.head_dim / 64);
    let mut frags = Sequence::<Array<Vector<f16, Pair>>>::new();
    #[unroll]
    for x in 0..cfg.k_words() {
        let mut w = 0u32;
        let mut sc = 0u32;
        if real {
            w = q[word0 + x];
            sc = byte_word(q_sc, byte0 + comptime!(x / 2));
        }
        let pairs = decode_word(w, scale_x128(sc), mag);
        #[unroll]
        for h in 0..2usize {
            let mut b = Array::<Vector<f16, Pair>>::new(2usize);
            b[0] = pairs[comptime!(2 * h)];
            b[1] = pairs[comptime!(2 * h + 1)];
            frags.push(b);
        }
    }
    frags
}

/// The warp's K rows of the tile from `k0`: S tile `j`, key `k0 + key_of(j, g)`, this lane's
/// quarter (`d/32` words) and its scale bytes (in the low `d/64` bytes); zero past `kv_len`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_k<N: Size>(
    k: &Array<Vector<u32, N>>,
    k_sc: &Array<u32>,
    regs: &mut Array<Vector<u32, N>>,
    scales: &mut Array<u32>,
    k_row0: usize,
    k0: usize,
    kv_len: usize,
    g: usize,
    t: usize,
    #[comptime] cfg: Fp4DecodeConfig,
) {
    #[unroll]
    for j in 0..cfg.k_rows() {
        let key = k0 + key_of(j, g);
        let mut value = Vector::<u32, N>::new(0u32);
        let mut sc = 0u32;
        if key < kv_len {
            let row = k_row0 + key;
            value = k[row * 4 + t];
            sc = byte_word(k_sc, row * comptime!(cfg.head_dim / 16) + t * comptime!(cfg.head_dim / 64));
        }
        regs[j] = value;
        scales[j] = sc;
    }
}

/// The warp's `Vᵀ` blocks of the tile from `k0`: m-tile `i`, channels `16i + g` (slot `2i`)
/// and `16i + g + 8` (`2i + 1`), keys `k0 + 16t .. + 16` (two words) and the block's scale
/// byte; zero past the padded key row.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_v(
    v: &Array<Vector<u32, Pair>>,
    v_sc: &Array<u32>,
    regs: &mut Array<Vector<u32, Pair>>,
    scales: &mut Array<u32>,
    v_row0: usize,
    v_words: usize,
    k0: usize,
    g: usize,
    t: usize,
    #[comptime] cfg: Fp4DecodeConfig,
) {
    // A `Vᵀ` row is `v_words / 2` blocks of 16 keys; the lane's block of channel `c` is word pair
    // and scale byte `c · blocks + k0/16 + t` alike. The slots' channels are 8 apart, so every
    // slot's scale byte sits at the same place in its word.
    let blocks = v_words / 2;
    let block = k0 / 16 + t;
    let base = (v_row0 + g) * blocks + block;
    let sc_base = base / 4;
    let shift = (8 * (base % 4)) as u32;
    #[unroll]
    for slot in 0..comptime!(2 * cfg.o_tiles()) {
        let mut value = Vector::<u32, Pair>::new(0u32);
        let mut sc = 0u32;
        if block < blocks {
            value = v[base + comptime!(16 * (slot / 2) + 8 * (slot % 2)) * blocks];
            sc = v_sc[sc_base + comptime!(4 * (slot / 2) + 2 * (slot % 2)) * blocks] >> shift;
        }
        regs[slot] = value;
        scales[slot] = sc;
    }
}

/// Sᵀ (`64 x 8`, columns past `rows` zero) = K(t)·Qᵀ into zeroed accumulators, K decoded per
/// word: m-tile `c` is K registers `2c` (A rows `g`) and `2c + 1` (rows `g + 8`), word `x` of
/// the lane's quarter feeds k-steps `2x` and `2x + 1`.
#[cube]
fn score_matmul<N: Size>(
    q_frags: &Sequence<Array<Vector<f16, Pair>>>,
    k_regs: &Array<Vector<u32, N>>,
    k_scales: &Array<u32>,
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    mag: u32,
    #[comptime] cfg: Fp4DecodeConfig,
) {
    let def = MmaDefinition::<f16, f16, f32>::new(MMA_M, MMA_N, MMA_K);
    #[unroll]
    for c in 0..FP4_DECODE_STEPS {
        let frag = s_frags.index_mut(c);
        frag[0] = Vector::new(0.0f32);
        frag[1] = Vector::new(0.0f32);
        let lo = k_regs[comptime!(2 * c)];
        let hi = k_regs[comptime!(2 * c + 1)];
        let sc_lo = k_scales[comptime!(2 * c)];
        let sc_hi = k_scales[comptime!(2 * c + 1)];
        #[unroll]
        for x in 0..cfg.k_words() {
            let shift = comptime!((8 * (x / 2)) as u32);
            let p_lo = decode_word(lo[x], scale_x128(sc_lo >> shift), mag);
            let p_hi = decode_word(hi[x], scale_x128(sc_hi >> shift), mag);
            #[unroll]
            for h in 0..2usize {
                let mut a = Array::<Vector<f16, Pair>>::new(4usize);
                a[0] = p_lo[comptime!(2 * h)];
                a[1] = p_hi[comptime!(2 * h)];
                a[2] = p_lo[comptime!(2 * h + 1)];
                a[3] = p_hi[comptime!(2 * h + 1)];
                def.execute_inplace(&a, q_frags.index(comptime!(2 * x + h)), s_frags.index_mut(c));
            }
        }
    }
}

/// The key (from the warp tile's first) of Sᵀ m-tile `c`'s A row `g + 8·hi`: [`key_of`] of K
/// register `2c + hi`.
#[cube]
fn s_key(#[comptime] c: usize, #[comptime] hi: usize, g: usize) -> usize {
    key_of(comptime!(2 * c + hi), g)
}

/// Online softmax of the warp's score tile (the lane's rows `2t + e`, keys `s_key(c, hi, g)`),
/// the running max always moving; P left in place in f32: with `cfg.p_nvfp4` quantized to
/// NVFP4 in blocks of 16 keys (as `fma_vec_fp4`'s `cube_quantize_p` and the codec do, as
/// `e2m1 · block_scale`), otherwise as it is (rounded to f16 by [`value_matmul`]). The row sums
/// take the unquantized P.
#[cube]
#[allow(clippy::too_many_arguments)]
fn softmax(
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    row_max: &mut Vector<f32, Pair>,
    row_sum: &mut Vector<f32, Pair>,
    qk_factor: f32,
    scale: f32,
    k0: usize,
    pos: Vector<u32, Pair>,
    q_len: usize,
    kv_len: usize,
    g: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: Fp4DecodeConfig,
) {
    let mut tile_max = Vector::<f32, Pair>::new(NO_MAX);
    #[unroll]
    for c in 0..FP4_DECODE_STEPS {
        let frag = s_frags.index_mut(c);
        #[unroll]
        for hi in 0..2usize {
            let mut x = frag[hi] * Vector::new(qk_factor);
            if comptime!(masked) {
                let key = k0 + s_key(c, hi, g);
                #[unroll]
                for e in 0..2usize {
                    x[e] = select(is_visible(pos[e] as usize, key, q_len, kv_len, cfg.causal), x[e], NO_MAX);
                }
            }
            frag[hi] = x;
            tile_max = max(tile_max, x);
        }
    }
    // A row's 64 keys are on the 8 lanes that share `t`.
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 4u32));
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 8u32));
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 16u32));
    let old_max = *row_max;
    let new_max = max(tile_max, old_max);
    // Before the store: `old_max` names the variable behind `row_max` itself (a CubeCL `let` of
    // a dereferenced local), so after `*row_max = new_max` the comparison would always be false.
    let moved = new_max[0] != old_max[0] || new_max[1] != old_max[1];
    let alpha = Vector::<f32, Pair>::exp((old_max - new_max) * Vector::new(scale));
    let neg_scaled_max = new_max * Vector::new(-scale);
    let mut tile_sum = Vector::<f32, Pair>::new(0.0f32);
    let mut amax = Vector::<f32, Pair>::new(0.0f32);
    #[unroll]
    for c in 0..FP4_DECODE_STEPS {
        let frag = s_frags.index_mut(c);
        #[unroll]
        for hi in 0..2usize {
            let x = frag[hi];
            let mut p = Vector::<f32, Pair>::exp(fma(x, Vector::new(scale), neg_scaled_max));
            if comptime!(masked) {
                #[unroll]
                for e in 0..2usize {
                    p[e] = select(x[e] > MASK_THRESHOLD, p[e], 0.0);
                }
            }
            frag[hi] = p;
            tile_sum += p;
            amax = max(amax, p);
        }
    }
    *row_sum = *row_sum * alpha + tile_sum;
    *row_max = new_max;

    if comptime!(cfg.p_nvfp4) {
        // A row's 16-key block `b` is on lanes `g = 2b, 2b + 1` (all four m-tiles, both halves):
        // `block = ue4m3((amax / 6) / ts)`, `code = e2m1(p / (ue4m3(block) · ts))`, correctly
        // rounded divisions (no reciprocal in this kernel's fast-math set).
        amax = max(amax, plane_shuffle_xor(amax, 4u32));
        let ts = f32::new(comptime!(f32::from_bits(P_TENSOR_SCALE_BITS)));
        let mut block = Vector::<f32, Pair>::empty();
        let mut denom = Vector::<f32, Pair>::empty();
        #[unroll]
        for e in 0..2usize {
            block[e] = ue4m3_value(ue4m3_code((amax[e] / 6.0f32) / ts));
            denom[e] = block[e] * ts;
        }
        #[unroll]
        for c in 0..FP4_DECODE_STEPS {
            let frag = s_frags.index_mut(c);
            #[unroll]
            for hi in 0..2usize {
                let mut x = frag[hi];
                #[unroll]
                for e in 0..2usize {
                    // A block whose scale underflowed to 0 has code 0 everywhere (the codec's rule).
                    x[e] = select(denom[e] > 0.0, e2m1_round(x[e] / denom[e]) * block[e], 0.0);
                }
                frag[hi] = x;
            }
        }
    }

    if plane_any(moved) {
        // Oᵀ's columns are the same rows 2t and 2t + 1: the lane's own factors.
        #[unroll]
        for i in 0..cfg.o_tiles() {
            let frag = o_frags.index_mut(i);
            frag[0] = frag[0] * alpha;
            frag[1] = frag[1] * alpha;
        }
    }
}

/// `x ≥ 0` rounded to the nearest E2M1 value, ties to even, saturating at 6: the codec's
/// `e2m1::encode` then `decode`, as a sum of the steps between neighbours whose midpoints `x`
/// passes (strict where the lower neighbour has the even code, as `e2m1_code`).
#[cube]
fn e2m1_round(x: f32) -> f32 {
    // Below 1, E2M1's step is 0.5: 0.25 goes to 0 (even code), 0.75 to 1 (even code).
    let small = select(x > 0.25f32, 0.5f32, 0.0f32) + select(x >= 0.75f32, 0.5f32, 0.0f32);
    // From 1, one mantissa bit: round the f32 bits to it, ties to even (E2M1's even codes are
    // the even mantissas there); 7 and up becomes 8, which saturates to 6 as the codec does.
    let bits = u32::reinterpret(x);
    let big = f32::reinterpret((bits + 0x1f_ffffu32 + ((bits >> 22u32) & 1u32)) & 0xffc0_0000u32);
    min(select(x < 1.0f32, small, big), 6.0f32)
}

/// Pᵀ's B fragment of key step `c` from Sᵀ m-tile `c` (`frag`: the lane's keys `g`, `g + 8`
/// of rows `2t`, `2t + 1`), rounded to f16: lane `(g, t)` needs row `g`'s m-rows `2t, 2t + 1`
/// (register 0) and `2t + 8, 2t + 9` (register 1), which lanes `(2t, g/2)` and `(2t + 1, g/2)`
/// hold as element `g % 2` of their two halves. Each lane offers its halves per row, packed
/// (keys `g`, `g + 8`), and takes the row its `g` names: four shuffles and two byte permutes.
#[cube]
fn transpose_p(frag: &Array<Vector<f32, Pair>>, g: usize, t: usize) -> Array<Vector<f16, Pair>> {
    let mut even = Vector::<f32, Pair>::empty();
    even[0] = frag[0][0];
    even[1] = frag[1][0];
    let mut odd = Vector::<f32, Pair>::empty();
    odd[0] = frag[0][1];
    odd[1] = frag[1][1];
    let even = u32::reinterpret(Vector::<f16, Pair>::cast_from(even));
    let odd = u32::reinterpret(Vector::<f16, Pair>::cast_from(odd));
    let src_a = (8 * t + g / 2) as u32;
    let src_b = src_a + 4u32;
    let mine = g % 2 == 0;
    let a = select(mine, plane_shuffle(even, src_a), plane_shuffle(odd, src_a));
    let b = select(mine, plane_shuffle(even, src_b), plane_shuffle(odd, src_b));
    let mut out = Array::<Vector<f16, Pair>>::new(2usize);
    out[0] = Vector::<f16, Pair>::reinterpret((a & 0xffffu32) | (b << 16u32));
    out[1] = Vector::<f16, Pair>::reinterpret((a >> 16u32) | (b & 0xffff_0000u32));
    out
}

/// Oᵀ (`dv x 8`) += Vᵀ(t)·Pᵀ. Key step `c`'s B fragment is P of Sᵀ m-tile `c`, transposed
/// ([`transpose_p`]; exact in f16 when quantized: `e2m1 · ue4m3` ≤ 2688); m-tile `i`'s A
/// fragment is channels `16i + g` (registers 0, 2) and `16i + g + 8` (1, 3), word `c/2`, pairs
/// `c%2` and `2 + c%2`.
#[cube]
fn value_matmul(
    s_frags: &Sequence<Array<Vector<f32, Pair>>>,
    v_regs: &Array<Vector<u32, Pair>>,
    v_scales: &Array<u32>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    g: usize,
    t: usize,
    mag: u32,
    #[comptime] cfg: Fp4DecodeConfig,
) {
    let def = MmaDefinition::<f16, f16, f32>::new(MMA_M, MMA_N, MMA_K);
    let mut b_frags = Sequence::<Array<Vector<f16, Pair>>>::new();
    #[unroll]
    for c in 0..FP4_DECODE_STEPS {
        b_frags.push(transpose_p(s_frags.index(c), g, t));
    }
    #[unroll]
    for i in 0..cfg.o_tiles() {
        let lo = v_regs[comptime!(2 * i)];
        let hi = v_regs[comptime!(2 * i + 1)];
        let s_lo = scale_x128(v_scales[comptime!(2 * i)]);
        let s_hi = scale_x128(v_scales[comptime!(2 * i + 1)]);
        #[unroll]
        for x in 0..2usize {
            let p_lo = decode_word(lo[x], s_lo, mag);
            let p_hi = decode_word(hi[x], s_hi, mag);
            #[unroll]
            for h in 0..2usize {
                let mut a = Array::<Vector<f16, Pair>>::new(4usize);
                a[0] = p_lo[comptime!(2 * h)];
                a[1] = p_hi[comptime!(2 * h)];
                a[2] = p_lo[comptime!(2 * h + 1)];
                a[3] = p_hi[comptime!(2 * h + 1)];
                def.execute_inplace(&a, b_frags.index(comptime!(2 * x + h)), o_frags.index_mut(i));
            }
        }
    }
}

/// The decode and P-rounding helpers on a wgpu adapter (llvmpipe in CI), against E2M1 spelled
/// out here: every code in every position of a word, and `e2m1_round` at and around every
/// midpoint, at the saturation and on random values.
#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::wgpu::WgpuRuntime;

    /// E2M1 magnitudes by code (sign bit 3).
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

    #[cube(launch_unchecked)]
    fn pairs_kernel(words: &Array<u32>, out: &mut Array<u32>) {
        let i = ABSOLUTE_POS;
        if i < words.len() {
            let p = e2m1_f16_pairs(words[i], MAG_BITS);
            #[unroll]
            for j in 0..4usize {
                out[4 * i + j] = p[j];
            }
        }
    }

    #[cube(launch_unchecked)]
    fn scale_kernel(codes: &Array<u32>, out: &mut Array<u32>) {
        let i = ABSOLUTE_POS;
        if i < codes.len() {
            out[i] = ue4m3_f16_bits(codes[i]);
        }
    }

    #[cube(launch_unchecked)]
    fn round_kernel(x: &Array<f32>, out: &mut Array<f32>) {
        let i = ABSOLUTE_POS;
        if i < x.len() {
            out[i] = e2m1_round(x[i]);
        }
    }

    #[test]
    fn e2m1_codes_become_their_value_times_2_pow_minus_14_in_f16_pairs() {
        let Some(client) = crate::kernel::wgpu_test_client() else { return };
        // Every 16-bit pattern in the low half, a scrambled one in the high half: every code in
        // every position.
        let words: Vec<u32> = (0..65536u32).map(|x| x | (x.wrapping_mul(0x9e37) & 0xffff) << 16).collect();
        let n = words.len();
        let out = client.empty(16 * n);
        // SAFETY: n words in, 4n words out, guarded by `words.len()`.
        unsafe {
            pairs_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(u32::as_bytes(&words)), n),
                ArrayArg::from_raw_parts(out.clone(), 4 * n),
            );
        }
        let got = u32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        let value = |code: u32| {
            let v = E2M1[(code & 7) as usize] * 2f32.powi(-14);
            if code & 8 != 0 { -v } else { v }
        };
        for (i, &w) in words.iter().enumerate() {
            for j in 0..4u32 {
                let bits = got[4 * i + j as usize];
                let (lo, hi) = (half::f16::from_bits(bits as u16), half::f16::from_bits((bits >> 16) as u16));
                let (cl, ch) = ((w >> (4 * j)) & 15, (w >> (4 * j + 16)) & 15);
                assert_eq!(lo.to_f32().to_bits(), value(cl).to_bits(), "word {w:#010x} pair {j} low");
                assert_eq!(hi.to_f32().to_bits(), value(ch).to_bits(), "word {w:#010x} pair {j} high");
            }
        }
    }

    /// The bit placement only: the multiply by 2^15 that follows takes f16 subnormals, which
    /// CUDA keeps (the E2M1 decode's 0.5 is one too) and llvmpipe flushes.
    #[test]
    fn ue4m3_scale_codes_become_their_value_times_2_pow_minus_8_in_both_halves() {
        let Some(client) = crate::kernel::wgpu_test_client() else { return };
        // Every code but NaN (0x7f), in every byte of a word above the low one (ignored).
        let codes: Vec<u32> = (0..0x7fu32).map(|c| c | (0xa5u32.wrapping_mul(c + 1) & 0xff) << 8 | 0xff00_0000).collect();
        let n = codes.len();
        let out = client.empty(4 * n);
        // SAFETY: n words in and out, guarded by `codes.len()`.
        unsafe {
            scale_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(u32::as_bytes(&codes)), n),
                ArrayArg::from_raw_parts(out.clone(), n),
            );
        }
        let got = u32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        for (c, bits) in (0..0x7fu32).zip(&got) {
            let (e, m) = ((c >> 3) as i32, (c & 7) as f32);
            let value = if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) };
            for half in [*bits as u16, (*bits >> 16) as u16] {
                assert_eq!(half::f16::from_bits(half).to_f32(), value / 256.0, "code {c:#04x}");
            }
        }
    }

    #[test]
    fn e2m1_round_is_round_to_nearest_even_code_with_saturation() {
        let Some(client) = crate::kernel::wgpu_test_client() else { return };
        // The nearest E2M1 magnitude, ties to the even code, saturating at 6.
        let want = |x: f32| -> f32 {
            let mut best = 0usize;
            for (c, v) in E2M1.iter().enumerate().skip(1) {
                let (d, db) = ((x - v).abs(), (x - E2M1[best]).abs());
                if d < db || (d == db && c % 2 == 0) {
                    best = c;
                }
            }
            E2M1[best]
        };
        let mut xs = vec![0.0f32, 6.0, 6.5, 7.0, 8.0, 100.0];
        for m in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] {
            for j in -3i32..=3 {
                xs.push(f32::from_bits((m.to_bits() as i32 + j) as u32));
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            xs.push((state >> 40) as f32 / (1u64 << 24) as f32 * 7.0);
        }
        let n = xs.len();
        let out = client.empty(4 * n);
        // SAFETY: n floats in and out, guarded by `x.len()`.
        unsafe {
            round_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&xs)), n),
                ArrayArg::from_raw_parts(out.clone(), n),
            );
        }
        let got = f32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(*g, want(*x), "x = {x:e}");
        }
    }
}

/// NVRTC compiles of the 4-bit MMA decode kernel for sm_90a: shared memory as counted, no
/// spills, the key loop's HMMAs (one warp tile: `8 · d/16` for S, `4 · dv/16` for Oᵀ), and the
/// FP8 conversion on the scale bytes only (the codes are decoded with integer instructions).
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib decode_mma_fp4`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::decode::DecodeArgsCompilationArg;
    use crate::kernel::fma_vec_fp4::Fp4ShapeCompilationArg;
    use crate::kernel::offline_cuda::{array, attn_shape_arg, nvrtc_cubin, settings, Arch, OfflineCuda, Variant};
    use cubecl::wgpu::WgpuRuntime;

    pub(crate) fn definition(client: &ComputeClient<WgpuRuntime>, cfg: Fp4DecodeConfig, direct: bool) -> KernelDefinition {
        let dec = DecodeArgsCompilationArg { rows: (), splits: (), keys_per_split: (), nan: (), page_shift: (), max_pages: (), lens_at: (), num_pages: () };
        fwd_portable_decode_mma_fp4::FwdPortableDecodeMmaFp4::<WgpuRuntime>::new(
            settings(cfg.units()),
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            attn_shape_arg(),
            dec,
            Fp4ShapeCompilationArg { kv_heads: (), v_words: () },
            cfg.k_words(),
            cfg,
            direct,
        )
        .define()
    }

    fn cases() -> Vec<(String, Fp4DecodeConfig, bool)> {
        let mut all = Vec::new();
        for (d, rows) in [(128usize, 4usize), (128, 8), (128, 1)] {
            for (causal, direct, shift_lse) in [(false, false, false), (true, true, true)] {
                for p_nvfp4 in [true, false] {
                    let cfg = Fp4DecodeConfig { head_dim: d, v_head_dim: d, rows, warps: 4, causal, write_lse: true, shift_lse, p_nvfp4 };
                    assert_eq!(cfg.invalid(), None, "{cfg:?}");
                    let p = if p_nvfp4 { "p4" } else { "p16" };
                    all.push((format!("decode_mma_fp4_d{d}_rows{rows}_{p}_causal{causal}_direct{direct}"), cfg, direct));
                }
            }
        }
        all
    }

    #[test]
    fn nvrtc_sm80_and_sm90_compile_the_4bit_mma_decode_kernel_with_its_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let variants = cases().into_iter().flat_map(|(name, cfg, direct)| {
            [Arch::Sm80, Arch::Sm90].map(|arch| Variant {
                name: name.clone(),
                arch,
                definition: definition(cuda.client(), cfg, direct),
                shared_bytes: Some(cfg.smem_bytes()),
                spill_free: true,
            })
        });
        cuda.check_all(variants);
    }

    #[test]
    fn nvrtc_sm90_sass_has_one_warp_tiles_hmma_and_no_fp8_conversion() {
        let Some(cuda) = OfflineCuda::new() else { return };
        if quattn_native::tools::find_any_disassembler().is_none() {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: no cuobjdump / nvdisasm");
            println!("SKIPPED: no cuobjdump / nvdisasm");
            return;
        }
        let include = crate::kernel::offline_cuda::cuda_include_dir().expect("OfflineCuda found the headers");
        let options = vec!["--gpu-architecture=sm_90a".to_string(), format!("--include-path={}", include.display()), "-Xptxas=-v".to_string()];
        let mut failures = Vec::new();
        for (name, cfg, direct) in cases().into_iter().filter(|(n, c, _)| n.contains("rows4") && !c.causal) {
            let (source, _) = cuda.translate(definition(cuda.client(), cfg, direct), Arch::Sm90).unwrap();
            let (cubin, log) = nvrtc_cubin(&source, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sass = quattn_native::sass::disassemble(&cubin).unwrap();
            if let Some(dir) = std::env::var_os("QUATTN_SASS_DIR") {
                std::fs::write(std::path::Path::new(&dir).join(format!("{name}.sass")), &sass).unwrap();
            }
            let hist = quattn_native::sass::opcode_histogram(&sass);
            let count = |f: &dyn Fn(&str) -> bool| -> usize { hist.iter().filter(|(op, _)| f(op)).map(|(_, n)| n).sum() };
            let hmma = count(&|op| op == "HMMA.16816.F32");
            let expected = FP4_DECODE_STEPS * (cfg.qk_steps() + cfg.o_tiles());
            let conversions = count(&|op| op.starts_with("F2FP") && op.contains(".E4M3."));
            println!("{name}: {hmma} HMMA.16816.F32 (expected {expected}), {conversions} FP8 conversions; {}", log.trim());
            // Codes and scale bytes alike become f16 through integer instructions (which is what
            // lets the kernel run on sm_80).
            if hmma != expected || conversions != 0 {
                failures.push(name);
            }
        }
        assert!(failures.is_empty(), "HMMA count wrong or FP8 conversions present for: {failures:?}");
    }
}
