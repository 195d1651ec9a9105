//! The vectorized FMA kernel ([`super::fma_vec`]) with score modifiers: a sliding window (left
//! and right extents), top-left or bottom-right alignment, softcap, ALiBi and attention sinks.
//! A separate entry point, so the plain kernel's code stays as it is; it reuses every stage,
//! matmul and softmax helper of `fma_vec`.
//!
//! - Scores are taken to the scaled domain right after Q·Kᵀ (`s · scale`), where softcap and
//!   ALiBi are defined, and the softmax then runs with a scale of 1.
//! - Row `i` sees key `j` iff `j < kv_len`, `j + q_len <= a + right` (when bounded) and
//!   `j + q_len + left >= a` (when bounded), with `a = i + row_shift` the aligned position
//!   shifted by `q_len` so that everything stays unsigned (`row_shift` is `kv_len` for
//!   bottom-right, `q_len` for top-left alignment). Causal masking arrives here as a right
//!   extent of 0.
//! - The key tiles a query tile visits are those its rows' windows touch: tiles wholly left of
//!   the first row's window or right of the last row's are never loaded nor computed (not
//!   computed and discarded), and tiles wholly inside every row's window skip the mask.
//! - A sink adds `exp(sink − m)` to the row's denominator in the epilogue only.
//! - On a packed variable-length batch (`fwd_portable_fma_vec_mods_varlen`) every sequence
//!   aligns its rows with its own lengths.

use cubecl::prelude::*;

use super::fma_vec::{
    cube_load_transposed, cube_row_reduce, gather_transposed_len, gather_v_len, online_softmax, stage_k, stage_v, thread_score_matmul,
    thread_value_matmul, unit_gather_transposed, unit_gather_v, FmaVecConfig, W,
};
use super::{seq_k_offset, seq_kv_len, seq_lse_index, seq_q_len, seq_q_offset, seq_span, AttnShape, SeqSpan, NO_MAX};

/// Which modifiers the kernel is compiled with (part of the kernel's compile-time key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModsConfig {
    /// A left extent bounds the keys a row sees.
    pub left: bool,
    /// A right extent bounds them (always with causal masking, which is a right extent of 0).
    pub right: bool,
    pub softcap: bool,
    pub alibi: bool,
}

/// The runtime parameters of the modifiers.
#[derive(CubeType, CubeLaunch)]
pub struct ModArgs {
    /// `a(i) + q_len - i`: `kv_len` (bottom-right) or `q_len` (top-left).
    pub row_shift: u32,
    pub left: u32,
    pub right: u32,
    /// The softmax scale, applied before the modifiers (the softmax itself then runs with 1).
    pub scale: f32,
    pub softcap: f32,
}

/// `a(row) + q_len`.
#[cube]
fn aligned(row: usize, mods: &ModArgs) -> usize {
    row + mods.row_shift as usize
}

/// One past the last key the row at aligned position `a` sees.
#[cube]
pub(crate) fn key_hi(a: usize, q_len: usize, kv_len: usize, mods: &ModArgs, #[comptime] mc: ModsConfig) -> usize {
    let mut hi = kv_len;
    if mc.right {
        let t = a + mods.right as usize + 1;
        hi = select(t > q_len, min(t - q_len, kv_len), 0);
    }
    hi
}

/// The first key the row at aligned position `a` sees.
#[cube]
pub(crate) fn key_lo(a: usize, q_len: usize, kv_len: usize, mods: &ModArgs, #[comptime] mc: ModsConfig) -> usize {
    let mut lo = 0usize;
    if mc.left {
        let t = mods.left as usize + q_len;
        lo = select(a > t, min(a - t, kv_len), 0);
    }
    lo
}

/// `cap · tanh(x / cap)`, from `exp(-2|y|)`, which never overflows (a tanh built on `exp(2y)`
/// gives inf/inf for large logits on some drivers).
#[cube]
pub(crate) fn softcap_score(x: f32, cap: f32) -> f32 {
    let y = x / cap;
    let t = f32::exp(-2.0 * f32::abs(y));
    let th = (1.0 - t) / (1.0 + t);
    cap * select(y < 0.0, -th, th)
}

/// Key tiles of the query rows `[q0, q0+bq)` as `(first, full_start, full_end, end)`: the tiles
/// `[first, end)` are visited; those in `[full_start, full_end)` are visible to every row and
/// need no mask.
#[cube]
pub(crate) fn cube_window_tiles(
    q0: usize,
    q_len: usize,
    kv_len: usize,
    mods: &ModArgs,
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] mc: ModsConfig,
) -> (usize, usize, usize, usize) {
    let q_last = min(q0 + bq, q_len) - 1;
    let a_first = aligned(q0, mods);
    let a_last = aligned(q_last, mods);
    // The window only moves right with the row: the first row has the lowest bounds.
    let lo_min = key_lo(a_first, q_len, kv_len, mods, mc);
    let hi_max = key_hi(a_last, q_len, kv_len, mods, mc);
    let lo_max = key_lo(a_last, q_len, kv_len, mods, mc);
    let hi_min = key_hi(a_first, q_len, kv_len, mods, mc);
    let first = lo_min / bk;
    let end = select(hi_max > lo_min, (hi_max + bk - 1) / bk, first);
    let full_start = (lo_max + bk - 1) / bk;
    let full_end = hi_min / bk;
    (first, full_start, full_end, end)
}

/// Scales the unit's scores, applies softcap and ALiBi, and (on tiles not wholly visible) sets
/// the scores of invisible keys to `NO_MAX`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn thread_modify_scores<N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    shape: &AttnShape,
    seq: &ComptimeOption<SeqSpan>,
    mods: &ModArgs,
    slope: f32,
    q0: usize,
    k0: usize,
    masked: bool,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] mc: ModsConfig,
) {
    let rm = comptime!(cfg.rm());
    let kq = comptime!(cfg.kq());
    let q_len = seq_q_len(shape, seq);
    let kv_len = seq_kv_len(shape, seq);
    let scale = mods.scale;
    let cap = mods.softcap;
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        let a = aligned(row, mods);
        let lo = key_lo(a, q_len, kv_len, mods, mc);
        let hi = key_hi(a, q_len, kv_len, mods, mc);
        #[unroll]
        for j in 0..kq {
            let mut s = scores[i * kq + j];
            #[unroll]
            for e in 0..W {
                let key = k0 + (j * cfg.tc + unit_col) * W + e;
                let mut x = s[e] * scale;
                if mc.softcap {
                    x = softcap_score(x, cap);
                }
                if mc.alibi {
                    let kpos = key + q_len;
                    let dist = select(a >= kpos, a - kpos, kpos - a);
                    x -= slope * f32::cast_from(dist);
                }
                if masked {
                    x = select(key >= lo && key < hi, x, NO_MAX);
                }
                s[e] = x;
            }
            scores[i * kq + j] = s;
        }
    }
}

/// The vector FMA kernel with score modifiers (module docs). `head_params` holds the sinks
/// (`[q_heads]`) then the ALiBi slopes (`[q_heads]`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_mods<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    mods: &ModArgs,
    head_params: &Array<f32>,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] mc: ModsConfig,
) {
    fma_vec_mods_forward::<E, S, N>(q, k, v, o, lse, shape, mods, head_params, &ComptimeOption::new_None(), cfg, mc);
}

/// [`fwd_portable_fma_vec_mods`] on a packed variable-length batch, in the layout of
/// [`super::fma_vec::fwd_portable_fma_vec_varlen`]. Each sequence aligns its rows with its own
/// lengths: `mods.row_shift` is unused, the kernel takes the sequence's `kv_len` (bottom-right)
/// or `q_len` (`top_left`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_mods_varlen<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    cu_seqlens_q: &Array<u32>,
    cu_seqlens_k: &Array<u32>,
    shape: &AttnShape,
    mods: &ModArgs,
    head_params: &Array<f32>,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] mc: ModsConfig,
    #[comptime] top_left: bool,
) {
    let seq = seq_span(cu_seqlens_q, cu_seqlens_k, CUBE_POS_Z as usize);
    // Uniform over the cube, before any barrier.
    if CUBE_POS_X as usize * cfg.bq >= seq.q_len {
        terminate!();
    }
    let row_shift = if top_left { seq.q_len } else { seq.kv_len };
    let seq_mods = ModArgs {
        row_shift: row_shift as u32,
        left: mods.left,
        right: mods.right,
        scale: mods.scale,
        softcap: mods.softcap,
    };
    fma_vec_mods_forward::<E, S, N>(q, k, v, o, lse, shape, &seq_mods, head_params, &ComptimeOption::new_Some(seq), cfg, mc);
}

/// The modifier kernel's body, on the shape's batch (`seq` none) or on one packed sequence.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fma_vec_mods_forward<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    mods: &ModArgs,
    head_params: &Array<f32>,
    seq: &ComptimeOption<SeqSpan>,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] mc: ModsConfig,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = seq_q_len(shape, seq);
    let kv_len = seq_kv_len(shape, seq);
    let q_heads = shape.q_heads as usize;

    let q_base = seq_q_offset(batch, shape.q_s0, shape.q_s2, seq) + head * shape.q_s1 as usize;
    let k_base = seq_k_offset(batch, shape.k_s0, shape.k_s2, seq) + kv_head * shape.k_s1 as usize;
    let v_base = seq_k_offset(batch, shape.v_s0, shape.v_s2, seq) + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<S, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<S, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_transposed::<E, S, N>(q, &mut q_stage, q_base, shape.q_s2 as usize, q0, q_len, cfg.bq, cfg.head_dim, cfg);

    let mut row_max = Array::<f32>::new(cfg.rm());
    let mut row_sum = Array::<f32>::new(cfg.rm());
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.cq()));
    let mut scores = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.kq()));
    #[unroll]
    for i in 0..cfg.rm() {
        row_max[i] = NO_MAX;
        row_sum[i] = 0.0;
    }
    #[unroll]
    for i in 0..comptime!(cfg.rm() * cfg.cq()) {
        acc[i] = Vector::new(0.0f32);
    }
    // Zero without ALiBi (and then unused).
    let slope = head_params[q_heads + head];

    let (first, full_start, full_end, end) = cube_window_tiles(q0, q_len, kv_len, mods, cfg.bq, cfg.bk, mc);

    let mut k_regs = Array::<Vector<E, N>>::new(comptime!(gather_transposed_len(cfg.bk, cfg.head_dim, cfg.units())));
    let mut v_regs = Array::<Vector<E, N>>::new(comptime!(gather_v_len(&cfg)));
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;
    if end > first {
        unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, first * cfg.bk, kv_len, cfg.bk, cfg.head_dim, cfg);
    }

    sync_cube();

    for tile in first..end {
        let k0 = tile * cfg.bk;
        let masked = tile < full_start || tile >= full_end;

        stage_k::<E, S, N>(&k_regs, &mut kv_stage, cfg);
        sync_cube();
        unit_gather_v::<E, N>(v, &mut v_regs, v_base, v_stride, k0, kv_len, cfg);

        thread_score_matmul::<S, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        thread_modify_scores::<N>(&mut scores, shape, seq, mods, slope, q0, k0, masked, unit_row, unit_col, cfg, mc);

        online_softmax::<f32, N>(
            &mut scores,
            &mut row_max,
            &mut row_sum,
            &mut acc,
            &mut p_stage,
            &mut red_stage,
            1.0f32,
            unit_row,
            unit_col,
            cfg,
        );
        if cfg.plane_reduce {
            sync_cube();
        }

        stage_v::<E, S, N>(&v_regs, &mut kv_stage, cfg);
        sync_cube();
        if tile + 1 < end {
            unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, k0 + cfg.bk, kv_len, cfg.bk, cfg.head_dim, cfg);
        }

        thread_value_matmul::<f32, S, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
        sync_cube();
    }

    write_results_mods::<E, N>(
        o,
        lse,
        &mut red_stage,
        &row_max,
        &mut row_sum,
        &acc,
        shape,
        head_params,
        seq,
        batch,
        head,
        q0,
        unit_row,
        unit_col,
        cfg,
    );
}

/// Epilogue with sinks (without, the host passes a sink of -3e38, which takes no mass): `l' = l·e^(m−M) + e^(sink−M)` with `M = max(m, sink)`, `O = acc·e^(m−M)
/// / l'`, `LSE = M + ln l'` (scores are already scaled); rows that saw no key get O = 0 and
/// `LSE = lse_empty`, sink or not.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_results_mods<E: Float, N: Size>(
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    row_max: &Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &Array<Vector<f32, N>>,
    shape: &AttnShape,
    head_params: &Array<f32>,
    seq: &ComptimeOption<SeqSpan>,
    batch: usize,
    head: usize,
    q0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let cq = comptime!(cfg.cq());
    cube_row_reduce(row_sum, red_stage, unit_row, unit_col, false, cfg);

    // Without sinks the host fills -3e38: exp(sink − m) is 0 and the rescale exactly 1.
    let sink = head_params[head];
    let q_len = seq_q_len(shape, seq);
    let o_base = seq_q_offset(batch, shape.o_s0, shape.o_s2, seq) + head * shape.o_s1 as usize;
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        if row < q_len {
            let l = row_sum[i];
            let seen = l > 0.0;
            let m = row_max[i];
            let big = max(m, sink);
            let rescale = f32::exp(m - big);
            let total = l * rescale + f32::exp(sink - big);
            let inv = Vector::<f32, N>::new(select(seen, rescale / select(seen, total, 1.0), 0.0));
            let o_row = (o_base + row * shape.o_s2 as usize) / W;
            #[unroll]
            for c in 0..cq {
                o[o_row + c * cfg.tc + unit_col] = Vector::cast_from(acc[i * cq + c] * inv);
            }
            if cfg.write_lse {
                if unit_col == 0 {
                    let value = select(seen, big + f32::ln(select(seen, total, 1.0)), shape.lse_empty);
                    lse[seq_lse_index(shape, seq, batch, head, q_len, row)] = value;
                }
            }
        }
    }
}

/// The modifier kernel compiled for CUDA offline (no GPU), at the tiling the selection gives
/// the vector FMA kernel on the H100: at head dim 128 with f16, sinks alone, each modifier alone
/// and all of them with causal masking at every head dim; all of them with f32 and bf16 at head
/// dim 128; the A100's build. NVRTC must compile each, CubeCL must declare the shared memory the fit check
/// counts, and ptxas must not spill up to head dim 128 (`offline_cuda::prefetch_spill_free`).
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec_mods::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, 
        array, attn_shape_arg, fma_vec_config, head_dims, selected_fma_tiles, settings, prefetch_spill_free, Arch, OfflineCuda,
        Variant,
    };
    use crate::launch::PortableKernel;
    use crate::Dtype;
    use cubecl::wgpu::WgpuRuntime;

    fn definition(
        client: &ComputeClient<WgpuRuntime>,
        dtype: Dtype,
        stage_f32: bool,
        cfg: FmaVecConfig,
        mc: ModsConfig,
    ) -> KernelDefinition {
        macro_rules! def {
            ($e:ty, $s:ty) => {
                fwd_portable_fma_vec_mods::FwdPortableFmaVecMods::<$e, $s, WgpuRuntime>::new(
                    settings(cfg.units()),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    attn_shape_arg(),
                    ModArgsCompilationArg { row_shift: (), left: (), right: (), scale: (), softcap: () },
                    array(),
                    W,
                    cfg,
                    mc,
                )
                .define()
            };
        }
        // `launch_modified`'s dispatch.
        match (dtype, stage_f32) {
            (Dtype::F32, _) => def!(f32, f32),
            (Dtype::F16, true) => def!(half::f16, f32),
            (Dtype::F16, false) => def!(half::f16, half::f16),
            (Dtype::Bf16, true) => def!(half::bf16, f32),
            (Dtype::Bf16, false) => def!(half::bf16, half::bf16),
        }
    }

    fn varlen_definition(
        client: &ComputeClient<WgpuRuntime>,
        dtype: Dtype,
        stage_f32: bool,
        cfg: FmaVecConfig,
        mc: ModsConfig,
        top_left: bool,
    ) -> KernelDefinition {
        macro_rules! def {
            ($e:ty, $s:ty) => {
                fwd_portable_fma_vec_mods_varlen::FwdPortableFmaVecModsVarlen::<$e, $s, WgpuRuntime>::new(
                    settings(cfg.units()),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    attn_shape_arg(),
                    ModArgsCompilationArg { row_shift: (), left: (), right: (), scale: (), softcap: () },
                    array(),
                    W,
                    cfg,
                    mc,
                    top_left,
                )
                .define()
            };
        }
        // `launch_modified_varlen`'s dispatch.
        match (dtype, stage_f32) {
            (Dtype::F32, _) => def!(f32, f32),
            (Dtype::F16, true) => def!(half::f16, f32),
            (Dtype::F16, false) => def!(half::f16, half::f16),
            (Dtype::Bf16, true) => def!(half::bf16, f32),
            (Dtype::Bf16, false) => def!(half::bf16, half::bf16),
        }
    }

    /// The varlen variant at head dim 128 on the H100: every modifier with causal masking
    /// (f16, top-left and bottom-right), and the window alone with f32.
    ///
    /// Every modifier with f16 spills on sm_90a (24 B at 168 registers, where the plain
    /// kernel's build takes 164 and spills nothing): the varlen kernel holds the sequence's
    /// first row and lengths in registers, which the plain kernel reads from its launch
    /// parameters. A known cost of that build, printed and not failed on; the others are held
    /// to no spills.
    ///
    /// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec_mods::cuda_tests::nvrtc_compiles_the_varlen`
    #[test]
    fn nvrtc_compiles_the_varlen_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let all = ModsConfig { left: true, right: true, softcap: true, alibi: true };
        let window = ModsConfig { left: true, right: true, ..ModsConfig::default() };
        // (dtype, causal, modifiers, top_left, held to no spills)
        let cases = [
            (Dtype::F16, true, all, false, false),
            (Dtype::F16, true, all, true, false),
            (Dtype::F32, false, window, false, true),
        ];
        let variants = cases.into_iter().map(|(dtype, causal, mc, top_left, spill_free)| {
            let (arch, d, dv) = (Arch::Sm90, 128, 128);
            let tiles = selected_fma_tiles(arch, d, dv, dtype, PortableKernel::Fma);
            let cfg = fma_vec_config(&tiles, d, dv, causal, true, true);
            let formula = PortableKernel::Fma(tiles).smem_bytes(d as u32, dv as u32, dtype);
            let flags = format!("l{}r{}s{}a{}", u8::from(mc.left), u8::from(mc.right), u8::from(mc.softcap), u8::from(mc.alibi));
            Variant {
                name: format!("fma_vec_mods_varlen_{flags}_topleft{top_left}_{dtype}_d{d}v{dv}_{tiles}_causal{causal}"),
                arch,
                definition: varlen_definition(cuda.client(), dtype, tiles.stage_f32, cfg, mc, top_left),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: spill_free && prefetch_spill_free(d, dv),
            }
        });
        cuda.check_all(variants);
    }

    #[test]
    fn nvrtc_compiles_the_cuda_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let none = ModsConfig::default();
        let all = ModsConfig { left: true, right: true, softcap: true, alibi: true };
        // Causal masking is a right extent of 0 (`launch_modified`): `right` with it.
        let alone = [
            ModsConfig { left: true, ..none },
            ModsConfig { right: true, ..none },
            ModsConfig { softcap: true, ..none },
            ModsConfig { alibi: true, ..none },
        ];
        // (arch, dtype, d, dv, causal, modifiers)
        let mut cases = vec![(Arch::Sm90, Dtype::F16, 128, 128, false, none)];
        cases.extend(alone.map(|mc| (Arch::Sm90, Dtype::F16, 128, 128, false, mc)));
        for (d, dv) in head_dims() {
            cases.push((Arch::Sm90, Dtype::F16, d, dv, true, all));
        }
        cases.push((Arch::Sm90, Dtype::F32, 128, 128, true, all));
        cases.push((Arch::Sm90, Dtype::Bf16, 128, 128, true, all));
        cases.push((Arch::Sm80, Dtype::F16, 128, 128, true, all));
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3, &c.4, &c.5])).map(|(arch, dtype, d, dv, causal, mc)| {
            let tiles = selected_fma_tiles(arch, d, dv, dtype, PortableKernel::Fma);
            let cfg = fma_vec_config(&tiles, d, dv, causal, true, true);
            // With plane reductions the f32 reduction scratch is unused and dropped.
            let formula = PortableKernel::Fma(tiles).smem_bytes(d as u32, dv as u32, dtype);
            let flags = format!(
                "l{}r{}s{}a{}",
                u8::from(mc.left),
                u8::from(mc.right),
                u8::from(mc.softcap),
                u8::from(mc.alibi)
            );
            Variant {
                name: format!("fma_vec_mods_{flags}_{dtype}_d{d}v{dv}_{tiles}_causal{causal}"),
                arch,
                definition: definition(cuda.client(), dtype, tiles.stage_f32, cfg, mc),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: prefetch_spill_free(d, dv),
            }
        });
        cuda.check_all(variants);
    }
}
