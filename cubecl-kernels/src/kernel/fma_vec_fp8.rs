//! The vectorized FMA kernel on FP8 Q, K and V (OCP e4m3 or e5m2 codes with f32 descales),
//! decoding on load: each `u32` word is 4 codes of one row, decoded bit-exactly to f32 (exact in
//! f16 too: every e4m3 and e5m2 value is an f16 value) when staged. Everything else is
//! `fma_vec`'s (f32 scores, online softmax and accumulation), with two differences that mirror
//! the FP8 emulation of the facade:
//!
//! - Descales: `s = (Σ q·k) · (q_descale · k_descale)` on the decoded codes, one multiply per
//!   (row, key) with the factor of the (query block, key tile) pair; the V descale multiplies
//!   P's column for the tile (`Σ_j (p̃_j · v_descale) · v_j`). Both are the exact products up to
//!   f32 rounding.
//! - P is stored to shared memory in f16 (rounded once, as the emulation's P) and read back as
//!   f32 for P·V; the row sums take the unrounded P.
//!
//! The descales follow the tile: a Q descale block is the cube's `bq` rows and a K/V descale
//! block is one tile of `bk` keys, so `DescaleGranularity::PerBlock` descales must have been
//! computed with `block_rows = bq` for Q and `bk` for K and V (`Fp8Tiles::descale_blocks`).
//!
//! Non-finite codes (e4m3 `S.1111.111`; e5m2 `S.11111.xx`, inf and NaN) are staged as 0 and
//! recorded: the Q rows that hold one, and the lowest key whose K or V row holds one. Every
//! query row that sees such a key, or whose own Q row holds one, is written as NaN (O and LSE);
//! other rows are computed as if the code were 0, which they never multiply by a nonzero
//! probability. The poison is explicit because the arithmetic would not carry it reliably:
//! WGSL lets the compiler assume that no NaN or infinity occurs, `max` drops a NaN operand on
//! CUDA, the mask's select and `0 · NaN` in P·V would drop it or spread it to rows that do not
//! see the key, and the kernels never compute with infinities (llvmpipe).

use cubecl::prelude::*;
use cubecl::{e4m3, e5m2};
use half::f16;
use quattn_core::{DescaleGranularity, Fp8Format};

use super::fma_vec::{online_softmax, thread_apply_mask, thread_score_matmul, write_results, FmaVecConfig, W};
use super::{cube_key_ranges, is_visible, AttnShape, NO_MAX};

/// The "no bad key" value of the lowest-bad-key record.
const NO_KEY: u32 = u32::MAX;

/// Compile-time key of the FP8 inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp8Config {
    pub format: Fp8Format,
    pub granularity: DescaleGranularity,
}

impl Fp8Config {
    /// Mantissa bits of the format.
    pub const fn mantissa_bits(&self) -> u32 {
        match self.format {
            Fp8Format::E4M3 => 3,
            Fp8Format::E5M2 => 2,
        }
    }
    /// f32 bias minus the format's bias (127 − 7, 127 − 15): added to a normal code's exponent.
    pub const fn bias_adjust(&self) -> u32 {
        match self.format {
            Fp8Format::E4M3 => 120,
            Fp8Format::E5M2 => 112,
        }
    }
    /// Value of one subnormal mantissa step: 2^(1 − bias − mantissa bits).
    pub const fn subnormal_step(&self) -> f32 {
        match self.format {
            Fp8Format::E4M3 => 1.0 / 512.0,
            Fp8Format::E5M2 => 1.0 / 65536.0,
        }
    }
    /// The smallest magnitude (`code & 0x7f`) that is not finite: e4m3 `0x7f` (NaN), e5m2 `0x7c`
    /// (inf; `0x7d..=0x7f` NaN).
    pub const fn first_non_finite(&self) -> u32 {
        match self.format {
            Fp8Format::E4M3 => 0x7f,
            Fp8Format::E5M2 => 0x7c,
        }
    }
    /// Per byte of a word, the bits that are all set in a non-finite code ([`Self::first_non_finite`]
    /// in every byte): adding the byte's lowest such bit carries into bit 7 exactly when they are.
    pub const fn non_finite_mask(&self) -> u32 {
        self.first_non_finite() * 0x0101_0101
    }
    pub const fn non_finite_carry(&self) -> u32 {
        let m = self.first_non_finite();
        (m & m.wrapping_neg()) * 0x0101_0101
    }
    pub const fn per_head(&self) -> bool {
        matches!(self.granularity, DescaleGranularity::PerHead)
    }
    pub const fn per_block(&self) -> bool {
        matches!(self.granularity, DescaleGranularity::PerBlock)
    }
}

/// Runtime shape of the descale tensors, and the NaN written to poisoned rows (passed in: WGSL
/// cannot spell it).
#[derive(CubeType, CubeLaunch)]
pub struct Fp8Shape {
    pub kv_heads: u32,
    /// `ceil(q_len / bq)`.
    pub q_blocks: u32,
    /// `ceil(kv_len / bk)`.
    pub k_blocks: u32,
    pub nan: f32,
}

/// `E`: element type of O. `S`: stage type of the decoded codes (f32, or f16: exact either way).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_fp8<E: Float, S: Float, N: Size>(
    q: &Array<u32>,
    k: &Array<u32>,
    v: &Array<u32>,
    q_descale: &Array<f32>,
    k_descale: &Array<f32>,
    v_descale: &Array<f32>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    fp8: &Fp8Shape,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] fcfg: Fp8Config,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q_block = CUBE_POS_X as usize;
    let q0 = q_block * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<S, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<S, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f16, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));
    // `bad[r]` (r < bq): Q row q0 + r holds a non-finite code; `bad[bq]`: the lowest key whose
    // K or V row holds one, NO_KEY if none.
    let mut bad = SharedMemory::<Atomic<u32>>::new(comptime!(cfg.bq + 1));
    let flags = comptime!(cfg.bq + 1);
    #[unroll]
    for step in 0..comptime!(flags.div_ceil(cfg.units())) {
        let r = step * cfg.units() + unit;
        if r < flags {
            bad[r].store(select(r == cfg.bq, NO_KEY, 0u32));
        }
    }
    sync_cube();

    cube_load_fp8_transposed::<S, N>(
        q, &mut q_stage, &mut bad, q_base, shape.q_s2 as usize, q0, q_len, cfg.bq, cfg.head_dim, true, cfg, fcfg,
    );

    // Descale indices: [1], [batch, heads] or [batch, heads, blocks].
    let mut q_index = 0usize;
    if comptime!(fcfg.per_block()) {
        q_index = (batch * shape.q_heads as usize + head) * fp8.q_blocks as usize + q_block;
    } else if comptime!(fcfg.per_head()) {
        q_index = batch * shape.q_heads as usize + head;
    }
    let q_ds = q_descale[q_index];
    let mut kv_index = 0usize;
    if comptime!(fcfg.per_block()) {
        kv_index = (batch * fp8.kv_heads as usize + kv_head) * fp8.k_blocks as usize;
    } else if comptime!(fcfg.per_head()) {
        kv_index = batch * fp8.kv_heads as usize + kv_head;
    }

    let rm = comptime!(cfg.rm());
    let mut row_max = Array::<f32>::new(rm);
    let mut row_sum = Array::<f32>::new(rm);
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.cq()));
    let mut scores = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.kq()));
    #[unroll]
    for i in 0..rm {
        row_max[i] = NO_MAX;
        row_sum[i] = 0.0;
    }
    #[unroll]
    for i in 0..comptime!(cfg.rm() * cfg.cq()) {
        acc[i] = Vector::new(0.0f32);
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    sync_cube();

    for tile in 0..num_tiles {
        let k0 = tile * cfg.bk;
        let masked = tile >= num_full;
        let mut ds_index = kv_index;
        if comptime!(fcfg.per_block()) {
            ds_index += tile;
        }

        cube_load_fp8_transposed::<S, N>(
            k, &mut kv_stage, &mut bad, k_base, shape.k_s2 as usize, k0, kv_len, cfg.bk, cfg.head_dim, false, cfg, fcfg,
        );
        sync_cube();

        thread_score_matmul::<S, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        let factor = Vector::<f32, N>::new(q_ds * k_descale[ds_index]);
        #[unroll]
        for i in 0..comptime!(cfg.rm() * cfg.kq()) {
            scores[i] = scores[i] * factor;
        }
        if masked {
            thread_apply_mask::<N>(&mut scores, shape, q0, k0, unit_row, unit_col, cfg);
        }

        // P goes to shared memory in f16: the rounding P·V sees.
        online_softmax::<f16, N>(
            &mut scores,
            &mut row_max,
            &mut row_sum,
            &mut acc,
            &mut p_stage,
            &mut red_stage,
            shape.scale,
            unit_row,
            unit_col,
            cfg,
        );
        if cfg.plane_reduce {
            sync_cube();
        }

        cube_load_fp8_v::<S, N>(v, &mut kv_stage, &mut bad, v_base, shape.v_s2 as usize, k0, kv_len, cfg, fcfg);
        sync_cube();

        thread_value_matmul_descaled::<S, N>(&p_stage, &kv_stage, &mut acc, v_descale[ds_index], unit_row, unit_col, cfg);
        sync_cube();
    }

    write_results::<E, N>(
        o, lse, &mut red_stage, &row_max, &mut row_sum, &acc, shape, batch, head, q0, unit_row, unit_col, cfg,
    );

    // Poison: rows that see a non-finite code become NaN. The records are complete (every
    // store and atomic precedes the loop's last barrier, or the one before the loop), and the
    // unit overwrites only what it wrote above, so program order orders the two writes.
    let bad_key = bad[cfg.bq].load() as usize;
    let cq = comptime!(cfg.cq());
    let o_base = batch * shape.o_s0 as usize + head * shape.o_s1 as usize;
    let nan = Vector::<E, N>::cast_from(Vector::<f32, N>::new(fp8.nan));
    #[unroll]
    for i in 0..rm {
        let local = unit_row * rm + i;
        let row = q0 + local;
        if row < q_len {
            // A row that sees no key never read its Q row: it keeps O = 0, LSE = -inf.
            let seen = row_sum[i] > 0.0;
            let q_bad = bad[local].load() != 0u32;
            let kv_bad = is_visible(row, bad_key, q_len, kv_len, cfg.causal);
            if seen && (q_bad || kv_bad) {
                let o_row = (o_base + row * shape.o_s2 as usize) / W;
                #[unroll]
                for c in 0..cq {
                    o[o_row + c * cfg.tc + unit_col] = nan;
                }
                if cfg.write_lse {
                    if unit_col == 0 {
                        lse[(batch * shape.q_heads as usize + head) * q_len + row] = fp8.nan;
                    }
                }
            }
        }
    }
}

/// Code `byte` (in the low 8 bits) as its f32 value, bit-exact for every finite code; 0 for the
/// non-finite ones (see the module doc). Normal codes are assembled in the f32 bit pattern
/// (sign, exponent + bias difference, mantissa); subnormal ones are `mantissa · 2^(1−bias−m)`,
/// exact in f32 (no f32 subnormal arises, so flush-to-zero modes cannot touch them).
#[cube]
pub(crate) fn decode_fp8(byte: u32, #[comptime] fcfg: Fp8Config) -> f32 {
    let magnitude = byte & 0x7fu32;
    let sign = (byte & 0x80u32) << 24u32;
    let normal = f32::reinterpret(
        ((magnitude << comptime!(23 - fcfg.mantissa_bits())) + comptime!(fcfg.bias_adjust() << 23)) | sign,
    );
    let sub = f32::cast_from(magnitude) * comptime!(fcfg.subnormal_step());
    let subnormal = select(sign != 0u32, -sub, sub);
    let value = select(magnitude < comptime!(1u32 << fcfg.mantissa_bits()), subnormal, normal);
    select(magnitude < comptime!(fcfg.first_non_finite()), value, 0.0f32)
}

/// Whether any of the 4 codes of `word` is non-finite.
#[cube]
pub(crate) fn word_has_non_finite(word: u32, #[comptime] fcfg: Fp8Config) -> bool {
    non_finite_bytes(word, fcfg) != 0u32
}

/// The two codes of `pair` (the first in the low byte) as two f16 through the device's FP8
/// conversion (CUDA sm_89 and later: one `cvt`), exact for every finite code; a non-finite code
/// gives its NaN or infinity.
#[cube]
pub(crate) fn convert_pair(pair: u16, #[comptime] fcfg: Fp8Config) -> Vector<f16, Const<2>> {
    if comptime!(fcfg.mantissa_bits() == 3) {
        Vector::<f16, Const<2>>::cast_from(Vector::<e4m3, Const<2>>::reinterpret(pair))
    } else {
        Vector::<f16, Const<2>>::cast_from(Vector::<e5m2, Const<2>>::reinterpret(pair))
    }
}

/// `word` with the codes [`non_finite_bytes`] marks in `non_finite` cleared (zero codes).
#[cube]
pub(crate) fn clear_marked(word: u32, non_finite: u32) -> u32 {
    word & !((non_finite >> 7u32) * 0xffu32)
}

/// Bit 7 of each byte of `word` set where that byte's code is non-finite.
#[cube]
pub(crate) fn non_finite_bytes(word: u32, #[comptime] fcfg: Fp8Config) -> u32 {
    ((word & comptime!(fcfg.non_finite_mask())) + comptime!(fcfg.non_finite_carry())) & 0x8080_8080u32
}

/// `fma_vec`'s transposing stage load on FP8 codes: each task reads one word (4 channels) from
/// each of W consecutive rows, decodes them and writes the W x W block transposed. Rows past
/// `len` are zero. A word with a non-finite code marks its row: Q (`is_q`) in `bad[row]`, K in
/// the lowest bad key `bad[bq]`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_fp8_transposed<S: Float, N: Size>(
    src: &Array<u32>,
    stage: &mut SharedMemory<Vector<S, N>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] is_q: bool,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] fcfg: Fp8Config,
) {
    let row_quads = comptime!(rows / W);
    let tasks = comptime!(rows / W * (dim / W));
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let rq = t % row_quads;
            let dq = t / row_quads;
            let mut words = Array::<u32>::new(W);
            #[unroll]
            for e in 0..W {
                let row = row0 + rq * W + e;
                let mut word = 0u32;
                if row < len {
                    word = src[(base + row * row_stride) / W + dq];
                }
                words[e] = word;
                if word_has_non_finite(word, fcfg) {
                    if is_q {
                        bad[rq * W + e].store(1u32);
                    } else {
                        bad[cfg.bq].fetch_min(row as u32);
                    }
                }
            }
            #[unroll]
            for x in 0..W {
                let mut column = Vector::<S, N>::empty();
                #[unroll]
                for e in 0..W {
                    column[e] = S::cast_from(decode_fp8((words[e] >> comptime!((8 * x) as u32)) & 0xffu32, fcfg));
                }
                stage[(dq * W + x) * row_quads + rq] = column;
            }
        }
    }
}

/// Stages values `[k0, k0+bk)` row-major (`[key][dv/W]`): each word is one stage vector of 4
/// channels. Rows past `kv_len` are zero; a word with a non-finite code lowers `bad[bq]` to its
/// key.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_fp8_v<S: Float, N: Size>(
    v: &Array<u32>,
    kv_stage: &mut SharedMemory<Vector<S, N>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] fcfg: Fp8Config,
) {
    let per_row = comptime!(cfg.v_pitch());
    let count = comptime!(cfg.bk * cfg.v_pitch());
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let key = k0 + e / per_row;
            let mut word = 0u32;
            if key < kv_len {
                word = v[(v_base + key * v_row_stride) / W + e % per_row];
            }
            if word_has_non_finite(word, fcfg) {
                bad[cfg.bq].fetch_min(key as u32);
            }
            let mut value = Vector::<S, N>::empty();
            #[unroll]
            for x in 0..W {
                value[x] = S::cast_from(decode_fp8((word >> comptime!((8 * x) as u32)) & 0xffu32, fcfg));
            }
            kv_stage[e] = value;
        }
    }
}

/// `fma_vec::thread_value_matmul` on the f16 P stage, with the tile's V descale applied to P
/// after its rounding: `acc[i][c] += Σ_j (p̃[i][j] · v_descale) · v[j][c]`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn thread_value_matmul_descaled<S: Float, N: Size>(
    p_stage: &SharedMemory<Vector<f16, N>>,
    kv_stage: &SharedMemory<Vector<S, N>>,
    acc: &mut Array<Vector<f32, N>>,
    v_descale: f32,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let cq = comptime!(cfg.cq());
    let descale = Vector::<f32, N>::new(v_descale);
    let mut p = Array::<Vector<f32, N>>::new(rq);
    let mut vv = Array::<Vector<f32, N>>::new(cq);
    let p_off = unit_row * rq;
    for key in 0..cfg.bk {
        #[unroll]
        for i in 0..rq {
            p[i] = Vector::<f32, N>::cast_from(p_stage[key * cfg.p_pitch() + p_off + i]) * descale;
        }
        #[unroll]
        for c in 0..cq {
            vv[c] = Vector::cast_from(kv_stage[key * cfg.v_pitch() + c * cfg.tc + unit_col]);
        }
        #[unroll]
        for i in 0..rm {
            let pi = Vector::<f32, N>::new(p[i / W][i % W]);
            #[unroll]
            for c in 0..cq {
                acc[i * cq + c] = fma(pi, vv[c], acc[i * cq + c]);
            }
        }
    }
}

/// The CUDA C++ CubeCL generates for the FP8 kernel, compiled offline by NVRTC (no GPU): the
/// table tiles at head dims 64 and 128, both formats, every descale granularity, f16 O with
/// shared-memory row reductions and bf16 O with plane shuffles. The source declares the shared
/// memory `FmaVecTiles::smem_bytes_fp8` counts (what the selection's fit check uses; less the
/// unused reduction scratch with plane shuffles) and ptxas accepts it for sm_90; the variants
/// CUDA runs (plane shuffles: CUDA always has them) spill nothing.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib fp8`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{client, cuda_include_dir, nvrtc_cubin, ADDR, COMPILE_LOCK};
    use crate::kernel::AttnShapeCompilationArg;
    use crate::tiling::{fma_vec_candidates, FmaVecTiles};
    use cubecl::cuda::CudaCompiler;
    use cubecl::wgpu::WgpuRuntime;
    use cubecl::Compiler as _;

    fn cfg(tiles: &FmaVecTiles, d: usize, causal: bool) -> FmaVecConfig {
        FmaVecConfig {
            head_dim: d,
            v_head_dim: d,
            bq: tiles.bq as usize,
            bk: tiles.bk as usize,
            tr: tiles.tr as usize,
            tc: tiles.tc as usize,
            causal,
            write_lse: true,
            lazy_rescale: true,
            plane_reduce: true,
        }
    }

    fn definition<E: Float + CubeElement, S: Float + CubeElement>(
        client: &ComputeClient<WgpuRuntime>,
        cfg: FmaVecConfig,
        fcfg: Fp8Config,
    ) -> KernelDefinition {
        let array = || ArrayCompilationArg { inplace: None };
        let shape = AttnShapeCompilationArg {
            q_len: (),
            kv_len: (),
            group: (),
            q_heads: (),
            q_s0: (),
            q_s1: (),
            q_s2: (),
            k_s0: (),
            k_s1: (),
            k_s2: (),
            v_s0: (),
            v_s1: (),
            v_s2: (),
            o_s0: (),
            o_s1: (),
            o_s2: (),
            scale: (),
            lse_empty: (),
        };
        let fp8 = Fp8ShapeCompilationArg { kv_heads: (), q_blocks: (), k_blocks: (), nan: () };
        let settings = KernelSettings::default()
            .cube_dim(CubeDim::new_1d((cfg.tr * cfg.tc) as u32))
            .address_type(AddressType::U32);
        fwd_portable_fma_vec_fp8::FwdPortableFmaVecFp8::<E, S, WgpuRuntime>::new(
            settings,
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            shape,
            fp8,
            W,
            cfg,
            fcfg,
        )
        .define()
    }

    #[test]
    fn nvrtc_sm90_compiles_with_the_tiling_shared_memory_and_no_spills() {
        let skip = |why: String| {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: {why}");
            println!("SKIPPED: {why}");
        };
        let Some(include) = cuda_include_dir() else {
            return skip("no CUDA headers (cuda_fp16.h)".into());
        };
        if let Err(e) = quattn_native::nvrtc() {
            return skip(e.to_string());
        }
        let Some(client) = client() else { return };
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        let nvrtc_options = vec![
            "--gpu-architecture=sm_90".to_string(),
            format!("--include-path={}", include.display()),
            "--std=c++17".to_string(),
            "-Xptxas=-v".to_string(),
        ];
        let mut failures = Vec::new();
        let mut cover = crate::kernel::offline_cuda::Cover::new();
        for d in [64usize, 128] {
            let tiles = fma_vec_candidates(d as u32)[0];
            for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                for granularity in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                    for (o, plane_reduce) in [("f16", false), ("bf16", true)] {
                        if !cover.take(&[&d, &format, &granularity, &o]) {
                            continue;
                        }
                        let cfg = FmaVecConfig { plane_reduce, ..cfg(&tiles, d, true) };
                        let fcfg = Fp8Config { format, granularity };
                        let def = match (o, tiles.stage_f32) {
                            ("f16", true) => definition::<half::f16, f32>(&client, cfg, fcfg),
                            ("f16", false) => definition::<half::f16, half::f16>(&client, cfg, fcfg),
                            (_, true) => definition::<half::bf16, f32>(&client, cfg, fcfg),
                            (_, false) => definition::<half::bf16, half::f16>(&client, cfg, fcfg),
                        };
                        let kernel = {
                            let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                            CudaCompiler::default().compile(def, &options, ExecutionMode::Unchecked, ADDR).unwrap()
                        };
                        let name = format!("fp8_{format}_{granularity:?}_{o}_d{d}_{tiles}_plane{plane_reduce}");
                        let formula = tiles.smem_bytes_fp8(d as u32, d as u32) as usize;
                        let declared = kernel.shared_memory_size();
                        if plane_reduce {
                            // The reduction scratch is unused and dropped.
                            assert_eq!(declared + 4 * tiles.bq as usize * tiles.tc as usize, formula, "{name}");
                        } else {
                            assert_eq!(declared, formula, "{name}: declared shared memory");
                        }
                        let (_, log) = nvrtc_cubin(&kernel.to_string(), &nvrtc_options).unwrap_or_else(|e| panic!("{name}: {e}"));
                        let res = quattn_native::Resources::parse_ptxas_log(&log)
                            .unwrap_or_else(|| panic!("{name}: no ptxas report in {log}"));
                        println!("{name}: {} registers, {} B spilled", res.registers, res.spill_bytes());
                        // CUDA always has plane shuffles, so only those variants run there.
                        if plane_reduce && res.spill_bytes() != 0 {
                            failures.push(name);
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "spills: {failures:?}");
    }
}
