//! INT8 quantization prepass (SageAttention style), device side: the per-channel mean of K over
//! the key sequence (smoothing), and one kernel that quantizes a block of rows of Q or K to
//! symmetric INT8 with one f32 scale per group of rows. The host side and the recipe are in
//! `crate::quant`.
//!
//! Bit-exactness with the CPU codec rests on three operations being correctly rounded: the
//! scale `amax / 127`, the quotient `x / scale`, and the fold `scale * fold`. Multiplication is
//! correctly rounded on every target (Vulkan, WGSL, CUDA), division is not (Vulkan allows 2.5
//! ulp for `OpFDiv`), so quotients go through [`div_rn`], which corrects the hardware quotient
//! to the nearest float with exact FMA remainders. Round-half-even is the target's `round`
//! (WGSL `round`, SPIR-V `RoundEven`, CUDA `rint`: all half-to-even).

use cubecl::prelude::*;

pub(crate) use quattn_core::Int8Granularity;
/// Rows of one warp in the per-thread fragment model, and the row groups (lane quads) in it.
pub(crate) use quattn_core::{INT8_MMA_M as MMA_M, INT8_THREAD_GROUPS as THREAD_GROUPS};
/// Largest code magnitude.
pub(crate) const QMAX: f32 = 127.0;
/// `QMAX.to_bits()`, for [`div_rn_bits`].
pub(crate) const QMAX_BITS: u32 = 0x42fe_0000;
/// Units sharing one row when scanning it (each takes every `LANES`-th 4-channel quad).
pub(crate) const LANES: usize = 8;
/// Units per cube of the quantization kernel.
pub(crate) const QUANT_UNITS: usize = 128;
/// Units per cube of the mean kernels.
pub(crate) const MEAN_UNITS: usize = 128;
/// Keys per cube of [`k_mean_partial`]: at head dim 128, 4 parts of 64 keys each. 16 kv heads
/// at 8k keys (batch 2) or 16k (batch 1) give 1024 cubes (about 8 per SM of an H100, against
/// the 16–32 cubes of one cube per head), and a sequence of at most 256 keys stays one chunk.
pub(crate) const MEAN_CHUNK: usize = 256;

/// Compile-time key of [`quantize_rows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantConfig {
    pub head_dim: usize,
    /// Rows per block (`block_q` for Q, `block_k` for K): one cube.
    pub rows: usize,
    pub warps: usize,
    pub granularity: Int8Granularity,
    /// Subtract the per-channel mean (K smoothing) before quantizing.
    pub subtract_mean: bool,
    /// Write `lse_scale · (row · μ)` per row (Q, when K is smoothed). The dot is taken on the
    /// loaded row, so it needs `subtract_mean == false` (Q's case).
    pub write_shift: bool,
}

impl QuantConfig {
    /// Scale groups per block.
    pub const fn slots(&self) -> usize {
        match self.granularity {
            Int8Granularity::PerBlock => 1,
            Int8Granularity::PerWarp => self.warps,
            Int8Granularity::PerThread => self.warps * THREAD_GROUPS,
        }
    }
    pub const fn quads(&self) -> usize {
        self.head_dim / 4
    }
    /// Rows scanned at once by the cube.
    pub const fn rows_per_pass(&self) -> usize {
        QUANT_UNITS / LANES
    }
    pub const fn passes(&self) -> usize {
        self.rows.div_ceil(self.rows_per_pass())
    }
}

/// Runtime shape of one [`quantize_rows`] launch. Grid: `(blocks, heads, batch)`.
#[derive(CubeType, CubeLaunch)]
pub struct QuantShape {
    /// Rows in the sequence (`q_len` or `kv_len`).
    pub len: u32,
    pub heads: u32,
    /// Blocks per (batch, head): `ceil(len / rows)`.
    pub blocks: u32,
    /// Element strides (batch, head, seq) of the source and of the codes.
    pub s0: u32,
    pub s1: u32,
    pub s2: u32,
    /// Heads per mean head (the GQA group for Q, 1 for K).
    pub group: u32,
    /// Heads of the mean tensor (`kv_heads`).
    pub mean_heads: u32,
    /// Multiplied into the stored scales after the codes are computed.
    pub fold: f32,
    /// Factor of the LSE shift (`softmax_scale`).
    pub lse_scale: f32,
}

/// `a / b` correctly rounded (round to nearest even), computed on the integer mantissas so that
/// it does not depend on the target's division (Vulkan allows 2.5 ulp for `OpFDiv`) or FMA
/// (WGSL's `fma` may be unfused, and is on llvmpipe). Domain: `b > 0` normal, `a` finite; a
/// zero or subnormal `a`, or a quotient outside the normal range, gives a signed zero (only
/// reachable with f32 inputs below 1e-36, whose codes are 0 anyway).
#[cube]
pub(crate) fn div_rn(a: f32, b: f32) -> f32 {
    div_rn_bits(a, u32::reinterpret(b))
}

/// [`div_rn`] with the divisor given by its bits: a constant divisor must come in this way,
/// because CubeCL's CUDA backend emits `reinterpret_cast<uint32 const&>(float(127.0))` for the
/// bitcast of a literal, which NVRTC rejects (not an lvalue).
#[cube]
pub(crate) fn div_rn_bits(a: f32, ub: u32) -> f32 {
    let ua = u32::reinterpret(a);
    let sign = ua & 0x8000_0000u32;
    let ea = (ua >> 23u32) & 0xffu32;
    let eb = (ub >> 23u32) & 0xffu32;
    let ma = (ua & 0x7f_ffffu32) | 0x80_0000u32;
    let mb = (ub & 0x7f_ffffu32) | 0x80_0000u32;
    // Normalize so that the quotient of the mantissas lies in [1, 2).
    let shift = select(ma < mb, 1u32, 0u32);
    let mut rem = ma << shift;
    // Biased exponent of the quotient, plus 256 to stay unsigned.
    let exp = ea + 127u32 + 256u32 - eb - shift;
    // 24 quotient bits and a guard bit; `rem` stays below 2^25.
    let mut quo = 0u32;
    for _ in 0..25u32 {
        quo <<= 1u32;
        if rem >= mb {
            rem -= mb;
            quo |= 1u32;
        }
        rem <<= 1u32;
    }
    let mut mant = quo >> 1u32;
    let guard = (quo & 1u32) == 1u32;
    let round_up = guard && (rem != 0u32 || (mant & 1u32) == 1u32);
    mant += select(round_up, 1u32, 0u32);
    // A carry out of the 24 bits leaves 2^24: the mantissa 1.0 of the next binade.
    let carry = mant >> 24u32;
    mant >>= carry;
    let exp = exp + carry;
    let normal = ea != 0u32 && exp >= 257u32 && exp <= 510u32;
    let bits = sign | ((exp - 256u32) << 23u32) | (mant & 0x7f_ffffu32);
    f32::reinterpret(select(normal, bits, sign))
}

/// The unfolded scale of a group whose largest magnitude is `amax` (the codec's `scale_for`).
#[cube]
pub(crate) fn scale_for(amax: f32) -> f32 {
    select(amax > 0.0, div_rn_bits(amax, QMAX_BITS), 1.0f32)
}

/// How close to a half-integer `|x|·inv` must come before [`code_byte`] decides exactly:
/// 2⁻¹⁴, far above the error of `|x|·inv` against `|x| / scale` (≤ 127 · 4 · 2⁻²⁴ < 2⁻¹⁵ for an
/// `inv` within 2.5 ulp of `1 / scale`, Vulkan's division bound, plus the multiply's rounding).
pub(crate) const TIE_MARGIN: f32 = 6.103_515_6e-5;

/// The code of `x` under `scale`, as a byte (two's complement in `0..256`): exactly the
/// codec's `clamp(rne(RN(x / scale)), −127, 127)` (an f32 division, then rounding half to
/// even), given `inv` ≈ `1 / scale` (any division of the target). Away from a half-integer,
/// rounding `|x|·inv` gives the same integer as rounding the f32 quotient, since both lie within
/// 2⁻¹⁵ of the true quotient; within [`TIE_MARGIN`] of one the quotient is formed by the
/// correctly rounded [`div_rn`], so that a quotient that rounds onto the half-integer ties to
/// even as the codec's does. That branch is taken by about 1 element in 8000: the 25-step
/// division per element it replaces made the prepass cost 40% of the attention kernel on the
/// H100. Domain: `scale` normal and positive.
#[cube]
pub(crate) fn code_byte(x: f32, scale: f32, inv: f32) -> u32 {
    let t = f32::abs(x) * inv;
    let mut q = t;
    if f32::abs(t - f32::floor(t) - 0.5) < TIE_MARGIN {
        q = div_rn(f32::abs(x), scale);
    }
    let c = f32::min(f32::round(q), QMAX);
    let c = select(x < 0.0, -c, c);
    u32::cast_from(select(c < 0.0, c + 256.0, c))
}

/// Position of local row `r` of a block among the block's scale groups.
#[cube]
pub(crate) fn block_slot(
    r: usize,
    #[comptime] granularity: Int8Granularity,
    #[comptime] rows: usize,
    #[comptime] warps: usize,
) -> usize {
    let mut slot = 0;
    if comptime!(granularity == Int8Granularity::PerWarp) {
        slot = r / comptime!(rows / warps);
    }
    if comptime!(granularity == Int8Granularity::PerThread) {
        slot = (r / MMA_M) * THREAD_GROUPS + (r % MMA_M) % THREAD_GROUPS;
    }
    slot
}

/// Partial sums of K over one chunk of [`MEAN_CHUNK`] keys, per channel, in f32. Grid
/// `(chunks, kv_heads, batch)` with `chunks = ceil(kv_len / MEAN_CHUNK)`; unit `(part, quad)`
/// sums the chunk's keys `j ≡ first + part (mod parts)` of its 4 channels in key order, then
/// the first part adds the `parts` sums in part order and writes the chunk's sum to
/// `partial[b, h, chunk, c]`. [`k_mean_finish`] adds the chunks in chunk order. The whole
/// summation tree is fixed (the result does not depend on scheduling) and, as any tree over the
/// `n` keys, has at most `n − 1` roundings on the path of any key, so the recursive-summation
/// bound `γ_{n−1} Σ|k|` of a sequential sum holds for it (its depth is far smaller:
/// `⌈chunk / parts⌉ + parts + chunks − 2` additions).
#[cube(launch_unchecked)]
pub fn k_mean_partial<E: Float, N: Size>(
    k: &Array<Vector<E, N>>,
    partial: &mut Array<Vector<f32, N>>,
    kv_len: u32,
    s0: u32,
    s1: u32,
    s2: u32,
    #[comptime] head_dim: usize,
) {
    let quads = comptime!(head_dim / 4);
    let parts = comptime!(MEAN_UNITS / (head_dim / 4));
    let unit = UNIT_POS as usize;
    let quad = unit % quads;
    let part = unit / quads;
    let chunk = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let first = chunk * MEAN_CHUNK;
    // `chunk < ceil(kv_len / MEAN_CHUNK)`: the chunk holds at least one key.
    let keys = min(kv_len as usize - first, MEAN_CHUNK);
    let base = batch * s0 as usize + head * s1 as usize;
    let mut sums = SharedMemory::<Vector<f32, N>>::new(comptime!(parts * (head_dim / 4)));
    if part < parts {
        let mut sum = Vector::<f32, N>::new(0.0f32);
        let count = (keys + parts - 1 - part) / parts;
        for i in 0..count {
            let j = first + part + i * parts;
            sum += Vector::cast_from(k[(base + j * s2 as usize) / 4 + quad]);
        }
        sums[part * quads + quad] = sum;
    }
    sync_cube();
    if part == 0 {
        let mut sum = sums[quad];
        #[unroll]
        for p in 1..parts {
            sum += sums[p * quads + quad];
        }
        let out =
            ((batch * CUBE_COUNT_Y as usize + head) * CUBE_COUNT_X as usize + chunk) * quads + quad;
        partial[out] = sum;
    }
}

/// `μ[b, h, c] = Σ_chunks partial[b, h, chunk, c] / kv_len` (chunk order), `0` for an empty
/// sequence. One unit per 4 channels of one (batch, kv head): `pairs · head_dim / 4` units in
/// cubes of [`MEAN_UNITS`] along x.
#[cube(launch_unchecked)]
pub fn k_mean_finish<N: Size>(
    partial: &Array<Vector<f32, N>>,
    mean: &mut Array<Vector<f32, N>>,
    kv_len: u32,
    chunks: u32,
    outputs: u32,
    #[comptime] head_dim: usize,
) {
    let quads = comptime!(head_dim / 4);
    let i = ABSOLUTE_POS;
    if i < outputs as usize {
        let pair = i / quads;
        let quad = i % quads;
        let base = pair * chunks as usize * quads + quad;
        let mut sum = Vector::<f32, N>::new(0.0f32);
        for c in 0..chunks as usize {
            sum += partial[base + c * quads];
        }
        let n = Vector::<f32, N>::new(f32::cast_from(kv_len));
        mean[i] = select_many(
            n.greater_than(Vector::new(0.0f32)),
            sum / n,
            Vector::new(0.0f32),
        );
    }
}

/// Quantizes one block of rows of one (batch, head): the amax of every scale group, its scale
/// (folded when stored), and the codes at the source's element offsets, 4 per `u32` word
/// (little-endian, so the buffer read as bytes is an int8 tensor with the source's strides).
/// Grid `(blocks, heads, batch)`, [`QUANT_UNITS`] units: `LANES` units per row, each taking
/// every `LANES`-th quad of 4 channels.
#[cube(launch_unchecked)]
pub fn quantize_rows<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    codes: &mut Array<u32>,
    scales: &mut Array<f32>,
    mean: &Array<Vector<f32, N>>,
    shift: &mut Array<f32>,
    shape: &QuantShape,
    #[comptime] cfg: QuantConfig,
) {
    let unit = UNIT_POS as usize;
    let lane = unit % LANES;
    let unit_row = unit / LANES;
    let block = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let len = shape.len as usize;
    let row0 = block * cfg.rows;
    let base = batch * shape.s0 as usize + head * shape.s1 as usize;
    let mean_base = (batch * shape.mean_heads as usize + head / shape.group as usize) * cfg.quads();

    let mut row_amax =
        SharedMemory::<f32>::new(comptime!(cfg.passes() * cfg.rows_per_pass() * LANES));
    // Each lane's part of each row's LSE-shift dot product (one float when not written).
    let mut row_dot = SharedMemory::<f32>::new(comptime!(if cfg.write_shift {
        cfg.passes() * cfg.rows_per_pass() * LANES
    } else {
        1
    }));
    let mut row_max = SharedMemory::<f32>::new(cfg.rows);
    let mut slot_scale = SharedMemory::<f32>::new(cfg.slots());

    // Loops stay runtime loops: the shader is compiled per configuration, and on llvmpipe
    // (CI) the compile time grows with every unrolled copy of the integer division.
    // 1. Each lane's share of each row's amax (0 for rows past the end) and, when the shift is
    //    written, of the row's `Σ_c q[c]·μ[c]`: the lane's quads in order, 4 channels each.
    for pass in 0..cfg.passes() {
        let r = pass * cfg.rows_per_pass() + unit_row;
        let row = row0 + r;
        let mut amax = 0.0f32;
        let mut dot = 0.0f32;
        if r < cfg.rows && row < len {
            let row_base = base + row * shape.s2 as usize;
            for quad in range_stepped(lane, cfg.quads(), LANES) {
                let x = load_quad::<E, N>(src, mean, row_base, mean_base, quad, cfg.subtract_mean);
                #[unroll]
                for e in 0..4 {
                    amax = max(amax, f32::abs(x[e]));
                }
                if cfg.write_shift {
                    let m = mean[mean_base + quad];
                    #[unroll]
                    for e in 0..4 {
                        dot += x[e] * m[e];
                    }
                }
            }
        }
        row_amax[r * LANES + lane] = amax;
        if cfg.write_shift {
            row_dot[r * LANES + lane] = dot;
        }
    }
    sync_cube();

    // 2a. One unit per row: the row's amax over its lanes (max is exact, so any order gives
    //     the codec's value) and the LSE shift `lse_scale · Σ_lanes dot` (lane order).
    for r in range_stepped(unit, cfg.rows, QUANT_UNITS) {
        let mut amax = 0.0f32;
        #[unroll]
        for l in 0..LANES {
            amax = max(amax, row_amax[r * LANES + l]);
        }
        row_max[r] = amax;
        if cfg.write_shift {
            let row = row0 + r;
            if row < len {
                let mut dot = row_dot[r * LANES];
                #[unroll]
                for l in 1..LANES {
                    dot += row_dot[r * LANES + l];
                }
                shift[(batch * shape.heads as usize + head) * len + row] = dot * shape.lse_scale;
            }
        }
    }
    sync_cube();

    // 2b. One unit per scale group: amax over its rows, scale, folded scale stored.
    let slots = comptime!(cfg.slots());
    for slot in range_stepped(unit, slots, QUANT_UNITS) {
        let mut amax = 0.0f32;
        if comptime!(cfg.granularity == Int8Granularity::PerThread) {
            let first = (slot / THREAD_GROUPS) * MMA_M + slot % THREAD_GROUPS;
            amax = max(row_max[first], row_max[first + THREAD_GROUPS]);
        } else {
            let span = comptime!(cfg.rows / slots);
            for r in slot * span..slot * span + span {
                amax = max(amax, row_max[r]);
            }
        }
        let scale = scale_for(amax);
        slot_scale[slot] = scale;
        let out =
            ((batch * shape.heads as usize + head) * shape.blocks as usize + block) * slots + slot;
        scales[out] = scale * shape.fold;
    }
    sync_cube();

    // 3. Codes, one word per quad, at the source's offsets.
    for pass in 0..cfg.passes() {
        let r = pass * cfg.rows_per_pass() + unit_row;
        let row = row0 + r;
        if r < cfg.rows && row < len {
            let scale = slot_scale[block_slot(r, cfg.granularity, cfg.rows, cfg.warps)];
            let inv = 1.0f32 / scale;
            let row_base = base + row * shape.s2 as usize;
            for quad in range_stepped(lane, cfg.quads(), LANES) {
                let x = load_quad::<E, N>(src, mean, row_base, mean_base, quad, cfg.subtract_mean);
                let mut word = 0u32;
                for e in 0..4usize {
                    word |= code_byte(x[e], scale, inv) << (8 * e) as u32;
                }
                codes[row_base / 4 + quad] = word;
            }
        }
    }
}

/// Four channels of a row as f32, minus the channel means when smoothing.
#[cube]
fn load_quad<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    mean: &Array<Vector<f32, N>>,
    row_base: usize,
    mean_base: usize,
    quad: usize,
    #[comptime] subtract_mean: bool,
) -> Vector<f32, N> {
    let mut x = Vector::<f32, N>::cast_from(src[row_base / 4 + quad]);
    if subtract_mean {
        x -= mean[mean_base + quad];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    #[cube(launch_unchecked)]
    fn div_rn_kernel(a: &Array<f32>, b: &Array<f32>, out: &mut Array<f32>) {
        let i = ABSOLUTE_POS;
        if i < a.len() {
            out[i] = div_rn(a[i], b[i]);
        }
    }

    #[test]
    fn qmax_bits_are_qmax() {
        assert_eq!(QMAX_BITS, QMAX.to_bits());
    }

    #[cube(launch_unchecked)]
    fn code_byte_kernel(x: &Array<f32>, scale: &Array<f32>, out: &mut Array<u32>) {
        let i = ABSOLUTE_POS;
        if i < x.len() {
            out[i] = code_byte(x[i], scale[i], 1.0f32 / scale[i]);
        }
    }

    /// `code_byte` against the codec's `clamp(rne(x / scale))` with the CPU's IEEE division, on
    /// values within a few ulp of every half-integer quotient (exact ties included: `k·scale/2`
    /// is exact for scales with few mantissa bits) and on random values.
    #[test]
    fn code_byte_rounds_like_a_true_division() {
        let instance = wgpu::Instance::default();
        if cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all())).is_empty() {
            println!("SKIPPED: no wgpu adapter");
            return;
        }
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut xs, mut ss) = (Vec::new(), Vec::new());
        for k in (1u32..=253).step_by(2) {
            for _ in 0..6 {
                let r = next();
                // Scales with 24 random mantissa bits, and with 4 (exact half-integer products).
                let mant = 1.0 + (r >> 41) as f32 / (1u64 << 23) as f32;
                let short = 1.0 + ((r >> 60) as f32) / 16.0;
                let e = ((r >> 8) % 30) as i32 - 20;
                for m in [mant, short] {
                    let scale = m * 2f32.powi(e);
                    let tie = k as f32 / 2.0 * scale;
                    for j in -3i32..=3 {
                        let x = f32::from_bits((tie.to_bits() as i32 + j) as u32);
                        if x.abs() <= 127.0 * scale {
                            let sign = if r & 2 == 0 { 1.0 } else { -1.0 };
                            xs.push(sign * x);
                            ss.push(scale);
                        }
                    }
                }
            }
        }
        for _ in 0..4096 {
            let r = next();
            let scale = (1.0 + (r >> 41) as f32 / (1u64 << 23) as f32) * 2f32.powi(((r >> 8) % 20) as i32 - 10);
            let t = ((next() >> 40) as f32 / (1u64 << 24) as f32) * 254.0 - 127.0;
            xs.push(t * scale);
            ss.push(scale);
        }
        let n = xs.len();
        let out = client.empty(4 * n);
        // SAFETY: n elements in each buffer, guarded by `x.len()`.
        unsafe {
            code_byte_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&xs)), n),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&ss)), n),
                ArrayArg::from_raw_parts(out.clone(), n),
            );
        }
        let got = u32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        let mut ties = 0;
        for i in 0..n {
            let q = xs[i] / ss[i];
            ties += (q.abs().fract() == 0.5) as usize;
            let want = q.round_ties_even().clamp(-QMAX, QMAX) as i8 as u8 as u32;
            assert_eq!(got[i], want, "x {:e} scale {:e}: x/scale = {q}", xs[i], ss[i]);
        }
        assert!(ties > 100, "the cases must include exact ties ({ties})");
    }

    /// `div_rn` against the CPU's IEEE division, bit for bit, on quotients across many binades,
    /// the scale division `amax / 127`, and mantissa-carry cases (`a` just below `b`).
    #[test]
    fn div_rn_is_correctly_rounded() {
        let instance = wgpu::Instance::default();
        if cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all())).is_empty() {
            println!("SKIPPED: no wgpu adapter");
            return;
        }
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut a = Vec::new();
        let mut b = Vec::new();
        for i in 0..8192 {
            let r = next();
            let mant = 1.0 + (r >> 40) as f32 / (1u64 << 24) as f32;
            let e = ((r >> 8) % 40) as i32 - 20;
            let x = mant * 2f32.powi(e) * if r & 1 == 0 { 1.0 } else { -1.0 };
            let y = 1.0 + (next() >> 40) as f32 / (1u64 << 24) as f32;
            match i % 4 {
                0 => (
                    a.push(x),
                    b.push(y * 2f32.powi(((r >> 16) % 10) as i32 - 5)),
                ),
                1 => (a.push(x.abs()), b.push(127.0)),
                2 => (
                    a.push(f32::from_bits(y.to_bits() - 1 - (r % 3) as u32)),
                    b.push(y),
                ),
                _ => (a.push(x * 100.0), b.push(x.abs() * 0.79)),
            };
        }
        a.extend([0.0, -0.0, 127.0, 254.0, 1.0]);
        b.extend([0.5, 0.5, 127.0, 127.0, 3.0]);
        let n = a.len();
        let out = client.empty(4 * n);
        // SAFETY: n elements in each buffer, guarded by `a.len()`.
        unsafe {
            div_rn_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&a)), n),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&b)), n),
                ArrayArg::from_raw_parts(out.clone(), n),
            );
        }
        let got = f32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        for i in 0..n {
            let want = a[i] / b[i];
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "{} / {}: device {:e}, IEEE {:e}",
                a[i],
                b[i],
                got[i],
                want
            );
        }
    }
}

/// The INT8 prepass compiled for CUDA offline (no GPU): the K-mean kernels and the row
/// quantizer for K (smoothed or not) and Q (every scale granularity, with and without the LSE
/// shift), in the blocking of the INT8 kernel `select_int8` gives on the H100 (`block_q = bq`,
/// `block_k = bk`, `bq / 16` warps). Every head dim with f16 inputs, f32 and bf16 at head dim
/// 128, the A100's build. NVRTC must compile each and ptxas must not spill.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib quant::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, array, selected_fma_tiles, settings, Arch, OfflineCuda, Variant};
    use crate::launch::{Int8Tiles, PortableKernel};
    use crate::problem::SUPPORTED_HEAD_DIMS;
    use crate::Dtype;
    use cubecl::wgpu::WgpuRuntime;

    /// `(rows, warps)` of the Q blocks and the K block size for head dim `d`.
    fn blocking(arch: Arch, d: usize) -> (usize, usize, usize) {
        let int8 = |tiles| Int8Tiles { tiles, granularity: Int8Granularity::PerThread, smooth_k: true };
        let tiles = selected_fma_tiles(arch, d, d, Dtype::F16, |t| PortableKernel::Int8(int8(t)));
        let b = int8(tiles).blocking();
        (b.block_q, b.warps, b.block_k)
    }

    fn mean_partial(client: &ComputeClient<WgpuRuntime>, dtype: Dtype, d: usize) -> KernelDefinition {
        macro_rules! def {
            ($e:ty) => {
                k_mean_partial::KMeanPartial::<$e, WgpuRuntime>::new(
                    settings(MEAN_UNITS),
                    client.clone(),
                    array(),
                    array(),
                    (),
                    (),
                    (),
                    (),
                    4,
                    d,
                )
                .define()
            };
        }
        match dtype {
            Dtype::F32 => def!(f32),
            Dtype::F16 => def!(half::f16),
            Dtype::Bf16 => def!(half::bf16),
        }
    }

    fn mean_finish(client: &ComputeClient<WgpuRuntime>, d: usize) -> KernelDefinition {
        k_mean_finish::KMeanFinish::<WgpuRuntime>::new(settings(MEAN_UNITS), client.clone(), array(), array(), (), (), (), 4, d)
            .define()
    }

    fn quantize(client: &ComputeClient<WgpuRuntime>, dtype: Dtype, cfg: QuantConfig) -> KernelDefinition {
        let shape = QuantShapeCompilationArg {
            len: (),
            heads: (),
            blocks: (),
            s0: (),
            s1: (),
            s2: (),
            group: (),
            mean_heads: (),
            fold: (),
            lse_scale: (),
        };
        macro_rules! def {
            ($e:ty) => {
                quantize_rows::QuantizeRows::<$e, WgpuRuntime>::new(
                    settings(QUANT_UNITS),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    shape,
                    4,
                    cfg,
                )
                .define()
            };
        }
        match dtype {
            Dtype::F32 => def!(f32),
            Dtype::F16 => def!(half::f16),
            Dtype::Bf16 => def!(half::bf16),
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Prepass {
        MeanPartial,
        MeanFinish,
        /// K's blocks (per-block scales), smoothed or not.
        K { smooth: bool },
        /// Q's blocks, with the LSE shift or not.
        Q { granularity: Int8Granularity, shift: bool },
    }

    #[test]
    fn nvrtc_compiles_the_cuda_variants_without_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        use Int8Granularity::{PerBlock, PerThread, PerWarp};
        let smooth_q = Prepass::Q { granularity: PerThread, shift: true };
        let mut cases = Vec::new();
        for &d in SUPPORTED_HEAD_DIMS {
            cases.push((Arch::Sm90, Dtype::F16, d, Prepass::MeanFinish));
            for p in [Prepass::MeanPartial, Prepass::K { smooth: true }, smooth_q] {
                cases.push((Arch::Sm90, Dtype::F16, d, p));
                if d == 128 {
                    cases.push((Arch::Sm90, Dtype::F32, d, p));
                    cases.push((Arch::Sm90, Dtype::Bf16, d, p));
                    cases.push((Arch::Sm80, Dtype::F16, d, p));
                }
            }
        }
        cases.push((Arch::Sm80, Dtype::F16, 128, Prepass::MeanFinish));
        cases.push((Arch::Sm90, Dtype::F16, 128, Prepass::K { smooth: false }));
        for granularity in [PerBlock, PerWarp, PerThread] {
            for shift in [false, true] {
                if (granularity, shift) != (PerThread, true) {
                    cases.push((Arch::Sm90, Dtype::F16, 128, Prepass::Q { granularity, shift }));
                }
            }
        }
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3])).map(|(arch, dtype, d, p)| {
            let (block_q, warps, block_k) = blocking(arch, d);
            let (name, definition) = match p {
                Prepass::MeanPartial => (format!("k_mean_partial_{dtype}_d{d}"), mean_partial(cuda.client(), dtype, d)),
                Prepass::MeanFinish => (format!("k_mean_finish_d{d}"), mean_finish(cuda.client(), d)),
                // As `quantize_int8` launches them.
                Prepass::K { smooth } => {
                    let cfg = QuantConfig {
                        head_dim: d,
                        rows: block_k,
                        warps: 1,
                        granularity: PerBlock,
                        subtract_mean: smooth,
                        write_shift: false,
                    };
                    (format!("quantize_rows_k_{dtype}_d{d}_rows{block_k}_smooth{smooth}"), quantize(cuda.client(), dtype, cfg))
                }
                Prepass::Q { granularity, shift } => {
                    let cfg = QuantConfig {
                        head_dim: d,
                        rows: block_q,
                        warps,
                        granularity,
                        subtract_mean: false,
                        write_shift: shift,
                    };
                    let name = format!("quantize_rows_q_{}_{dtype}_d{d}_rows{block_q}_shift{shift}", granularity.tag());
                    (name, quantize(cuda.client(), dtype, cfg))
                }
            };
            Variant { name, arch, definition, shared_bytes: None, spill_free: true }
        });
        cuda.check_all(variants);
    }
}
