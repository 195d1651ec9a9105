//! The vectorized FMA kernel for the f16-accumulating modes (`Precision::F16` with QK `F16` or
//! `TwoStage`, or PV `F16PerTile`): the products and sums that the mode allows in f16 run as
//! f16 multiply-adds on 2-wide f16 vectors, the operand of packed half math (NVIDIA `HFMA2`,
//! AMD `v_pk_fma_f16`): two FMAs per lane per instruction and no f16→f32 conversion of the
//! staged operands in the inner loops. Half the instructions of the f32 kernel, not always
//! twice its FLOP rate: the H100 issues `HFMA2` at half the `FFMA` rate (64-66 TFLOP/s for
//! both through CUDA and Vulkan).
//!
//! How the inner loops are written, and why (measured on an H100):
//! - `a * b + c`, not `fma(a, b, c)`: CubeCL's CUDA lowering turns an f16 `fma` into `fmaf` on
//!   converted floats (FFMA plus conversions, 16 TFLOP/s), while `a * b + c` is contracted by
//!   NVRTC into `HFMA2` (42). A contracted multiply-add rounds once, like the emulation; a
//!   compiler that does not contract (mesa's llvmpipe splits f16 FMAs anyway) also rounds the
//!   product to f16.
//! - 2-wide accumulators (one 32-bit register each), the broadcast operand splatted
//!   (`HFMA2 ... R.H0_H0` on NVIDIA: free), loops over a chunk's head-dim indices and over a
//!   tile's keys unrolled (constant shared-memory offsets).
//!
//! Everything outside the two matmuls is `fma_vec`'s (staging, masking, the online softmax in
//! f32, the epilogue), with the tile layout described there. What differs:
//! - Q, K and V are staged in f16 (the input type) and P is staged in f16: P is rounded to f16
//!   for P·V in every `Precision::F16` mode, so this loses nothing against the mode.
//! - **Q·Kᵀ**, per `QkAccum`: `F32` converts each operand and accumulates in f32;
//!   `F16` accumulates the whole head dim in f16; `TwoStage` accumulates `TWO_STAGE_CHUNK`
//!   head-dim indices in f16 and adds each chunk's f16 partial into an f32 score.
//! - **P·V**: `F16PerTile` accumulates the tile's `bk` keys in f16 and adds the tile into the
//!   f32 accumulator (after the rescale by `alpha`, which the online softmax applied); `F32`
//!   converts and accumulates in f32.
//! - Every f16 accumulation step is one multiply-add `round_f16(acc + a·b)` in index order: the
//!   CPU emulation of the mode with `k_step = 1` rounds at the same points.
//! - With f16 P·V the conditional rescale is off: a stale max lets p reach 2⁸, and a tile's
//!   f16 sum of 2⁸·|v| over `bk` keys could overflow where the always-rescaled one (p ≤ 1)
//!   does not. The launcher turns it off.

use cubecl::prelude::*;

use super::fma_vec::{
    cube_load_transposed, gather_transposed_len, gather_v_len, online_softmax, stage_k, stage_v, thread_apply_mask, thread_score_matmul,
    thread_value_matmul, unit_gather_transposed, unit_gather_v, write_results, FmaVecConfig, W,
};
use super::{cube_key_ranges, AttnShape, NO_MAX};

/// Compile-time key of the accumulation: `qk_chunk` is the head-dim span of each f16 partial
/// sum of Q·Kᵀ (0: f32 accumulation; `head_dim`: the `F16` mode), `pv_f16` the per-tile f16
/// accumulation of P·V. `split_kv`: K and V get their own stages, so a tile needs two
/// barriers instead of four (V is staged while other units still read K; the next K while
/// others still read V).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HalfConfig {
    pub qk_chunk: usize,
    pub pv_f16: bool,
    pub split_kv: bool,
}

/// The packed-f16 operand: 2 lanes, one 32-bit register.
type P2 = Const<2>;

/// `E`: element type of Q, K, V, O (f16; the stages and P are in `E` too). `N` must be `W`.
#[cube(launch_unchecked)]
pub fn fwd_portable_fma_half<E: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] half: HalfConfig,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<E, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    // K (and V, unless split); with `split_kv` V has its own stage (else a 1-vector stub).
    let mut kv_stage = SharedMemory::<Vector<E, N>>::new(comptime!(if half.split_kv {
        cfg.head_dim * cfg.k_pitch()
    } else {
        cfg.kv_stage_len()
    }));
    let mut v_stage = SharedMemory::<Vector<E, N>>::new(comptime!(if half.split_kv { cfg.bk * cfg.v_pitch() } else { 1 }));
    let mut p_stage = SharedMemory::<Vector<E, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_transposed::<E, E, N>(
        q,
        &mut q_stage,
        q_base,
        shape.q_s2 as usize,
        q0,
        q_len,
        cfg.bq,
        cfg.head_dim,
        cfg,
    );

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

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    // K and V are prefetched into registers, as in `fma_vec`.
    let mut k_regs = Array::<Vector<E, N>>::new(comptime!(gather_transposed_len(cfg.bk, cfg.head_dim, cfg.units())));
    let mut v_regs = Array::<Vector<E, N>>::new(comptime!(gather_v_len(&cfg)));
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;
    if num_tiles > 0 {
        unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, 0, kv_len, cfg.bk, cfg.head_dim, cfg);
    }

    sync_cube();

    for tile in 0..num_tiles {
        let k0 = tile * cfg.bk;
        let masked = tile >= num_full;

        stage_k::<E, E, N>(&k_regs, &mut kv_stage, cfg);
        sync_cube();
        // This tile's V is in flight during Q·Kᵀ and the softmax.
        unit_gather_v::<E, N>(v, &mut v_regs, v_base, v_stride, k0, kv_len, cfg);

        if comptime!(half.qk_chunk == 0) {
            thread_score_matmul::<E, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        } else {
            thread_score_matmul_half::<E, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg, half.qk_chunk);
        }
        if masked {
            thread_apply_mask::<N>(&mut scores, shape, q0, k0, unit_row, unit_col, cfg);
        }

        online_softmax::<E, N>(
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
        if comptime!(half.split_kv) {
            // V's own stage: the last readers of the previous V passed this tile's first barrier.
            stage_v::<E, E, N>(&v_regs, &mut v_stage, cfg);
        } else {
            // Every unit must be done reading K (the shared-memory reduction already ended
            // with a barrier) before V overwrites it.
            if cfg.plane_reduce {
                sync_cube();
            }
            stage_v::<E, E, N>(&v_regs, &mut kv_stage, cfg);
        }
        sync_cube();
        // The next tile's K is in flight during P·V.
        if tile + 1 < num_tiles {
            unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, k0 + cfg.bk, kv_len, cfg.bk, cfg.head_dim, cfg);
        }

        if comptime!(half.split_kv) {
            if half.pv_f16 {
                thread_value_matmul_half::<E, N>(&p_stage, &v_stage, &mut acc, unit_row, unit_col, cfg);
            } else {
                thread_value_matmul::<E, E, N>(&p_stage, &v_stage, &mut acc, unit_row, unit_col, cfg);
            }
            // No barrier: the next tile writes K (read by Q·Kᵀ before the last barrier), and
            // P and V only after its first barrier, which every reader of this P and V passes
            // after this P·V.
        } else {
            if half.pv_f16 {
                thread_value_matmul_half::<E, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
            } else {
                thread_value_matmul::<E, E, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
            }
            // The next tile overwrites K/V, P and the reduction scratch.
            sync_cube();
        }
    }

    write_results::<E, N>(
        o,
        lse,
        &mut red_stage,
        &row_max,
        &mut row_sum,
        &acc,
        shape,
        batch,
        head,
        q0,
        unit_row,
        unit_col,
        cfg,
    );
}

/// A 4-wide vector as two 2-wide ones: lanes (0, 1) and (2, 3).
#[cube]
fn split_pairs<E: Float, N: Size>(x: Vector<E, N>) -> (Vector<E, P2>, Vector<E, P2>) {
    let mut lo = Vector::<E, P2>::empty();
    let mut hi = Vector::<E, P2>::empty();
    lo[0] = x[0];
    lo[1] = x[1];
    hi[0] = x[2];
    hi[1] = x[3];
    (lo, hi)
}

/// `acc += f32(pair (lo, hi))` lane by lane.
#[cube]
fn add_pairs<N: Size, E: Float>(acc: Vector<f32, N>, lo: Vector<E, P2>, hi: Vector<E, P2>) -> Vector<f32, N> {
    let mut s = acc;
    s[0] += f32::cast_from(lo[0]);
    s[1] += f32::cast_from(lo[1]);
    s[2] += f32::cast_from(hi[0]);
    s[3] += f32::cast_from(hi[1]);
    s
}

/// `scores = Σ_chunks f32(Σ_{d in chunk} q·k in f16)`: per head-dim index `rm/W + rn/W` f16
/// vector loads for `rm · rn/2` packed multiply-adds; after each chunk the f16 partials are
/// added into the f32 scores (chunk order, as the emulation's two-stage sum).
#[cube]
#[allow(clippy::too_many_arguments)]
fn thread_score_matmul_half<E: Float, N: Size>(
    q_stage: &SharedMemory<Vector<E, N>>,
    kv_stage: &SharedMemory<Vector<E, N>>,
    scores: &mut Array<Vector<f32, N>>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] chunk: usize,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let kq = comptime!(cfg.kq());
    // Key pairs per unit row: each key quad is two pairs.
    let kp = comptime!(kq * 2);
    #[unroll]
    for i in 0..rm * kq {
        scores[i] = Vector::new(0.0f32);
    }
    let mut part = Array::<Vector<E, P2>>::new(comptime!(rm * kp));
    let mut a = Array::<Vector<E, N>>::new(rq);
    let mut b = Array::<Vector<E, P2>>::new(kp);
    let q_off = unit_row * rq;
    for c in 0..comptime!(cfg.head_dim / chunk) {
        #[unroll]
        for i in 0..rm * kp {
            part[i] = Vector::new(E::from_int(0));
        }
        let d0 = c * chunk;
        #[unroll]
        for dd in 0..chunk {
            let d = d0 + dd;
            #[unroll]
            for i in 0..rq {
                a[i] = q_stage[d * cfg.q_pitch() + q_off + i];
            }
            #[unroll]
            for j in 0..kq {
                let (lo, hi) = split_pairs::<E, N>(kv_stage[d * cfg.k_pitch() + j * cfg.tc + unit_col]);
                b[2 * j] = lo;
                b[2 * j + 1] = hi;
            }
            #[unroll]
            for i in 0..rm {
                let ai = Vector::<E, P2>::new(a[i / W][i % W]);
                #[unroll]
                for j in 0..kp {
                    part[i * kp + j] = ai * b[j] + part[i * kp + j];
                }
            }
        }
        #[unroll]
        for i in 0..rm * kq {
            scores[i] = add_pairs::<N, E>(scores[i], part[2 * i], part[2 * i + 1]);
        }
    }
}

/// `acc[i][c] += f32(Σ_{keys of the tile} P[row_i][key]·V[key][col_c] in f16)`.
#[cube]
fn thread_value_matmul_half<E: Float, N: Size>(
    p_stage: &SharedMemory<Vector<E, N>>,
    kv_stage: &SharedMemory<Vector<E, N>>,
    acc: &mut Array<Vector<f32, N>>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let cq = comptime!(cfg.cq());
    // Output column pairs per unit row.
    let cp = comptime!(cq * 2);
    let mut tile = Array::<Vector<E, P2>>::new(comptime!(rm * cp));
    #[unroll]
    for i in 0..rm * cp {
        tile[i] = Vector::new(E::from_int(0));
    }
    let mut p = Array::<Vector<E, N>>::new(rq);
    let mut vv = Array::<Vector<E, P2>>::new(cp);
    let p_off = unit_row * rq;
    #[unroll]
    for key in 0..cfg.bk {
        #[unroll]
        for i in 0..rq {
            p[i] = p_stage[key * cfg.p_pitch() + p_off + i];
        }
        #[unroll]
        for c in 0..cq {
            let (lo, hi) = split_pairs::<E, N>(kv_stage[key * cfg.v_pitch() + c * cfg.tc + unit_col]);
            vv[2 * c] = lo;
            vv[2 * c + 1] = hi;
        }
        #[unroll]
        for i in 0..rm {
            let pi = Vector::<E, P2>::new(p[i / W][i % W]);
            #[unroll]
            for c in 0..cp {
                tile[i * cp + c] = pi * vv[c] + tile[i * cp + c];
            }
        }
    }
    #[unroll]
    for i in 0..rm * cq {
        acc[i] = add_pairs::<N, E>(acc[i], tile[2 * i], tile[2 * i + 1]);
    }
}

#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, client, cuda_include_dir, nvrtc_cubin, ADDR, COMPILE_LOCK};
    use crate::kernel::AttnShapeCompilationArg;
    use cubecl::cuda::CudaCompiler;
    use cubecl::wgpu::WgpuRuntime;
    use cubecl::Compiler as _;

    /// The table tile at hd 128 with every f16 accumulation on (two-stage Q·Kᵀ, f16 P·V), with
    /// one K/V stage or two.
    fn cfg(causal: bool, split_kv: bool) -> (FmaVecConfig, HalfConfig) {
        let t = crate::tiling::fma_half_candidates(128)[0];
        (
            FmaVecConfig {
                head_dim: 128,
                v_head_dim: 128,
                bq: t.bq as usize,
                bk: t.bk as usize,
                tr: t.tr as usize,
                tc: t.tc as usize,
                causal,
                write_lse: true,
                lazy_rescale: false,
                plane_reduce: true,
            },
            HalfConfig { qk_chunk: 32, pv_f16: true, split_kv },
        )
    }

    fn definition(client: &ComputeClient<WgpuRuntime>, cfg: FmaVecConfig, half: HalfConfig) -> KernelDefinition {
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
        let settings = KernelSettings::default()
            .cube_dim(CubeDim::new_1d((cfg.tr * cfg.tc) as u32))
            .address_type(AddressType::U32);
        fwd_portable_fma_half::FwdPortableFmaHalf::<half::f16, WgpuRuntime>::new(
            settings,
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            array(),
            shape,
            W,
            cfg,
            half,
        )
        .define()
    }

    /// CubeCL's CUDA source of the table tile, compiled by NVRTC for sm_90 and disassembled,
    /// with one K/V stage and with two: both matmuls are packed `HFMA2` (at least one per 2-wide
    /// multiply-add of the unrolled loops: a chunk of Q·Kᵀ and a tile of P·V), and ptxas spills
    /// nothing (the prefetch holds a tile's loads in registers across a matmul). An `fma` on f16
    /// vectors would show here as FFMA on converted floats, with no HFMA2. Skips (saying why)
    /// without NVRTC, the CUDA headers or a disassembler, except under CI.
    #[test]
    fn nvrtc_sm90_packed_hfma2_and_no_spills() {
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
        if quattn_native::tools::find_any_disassembler().is_none() {
            return skip("no cuobjdump / nvdisasm".into());
        }
        let Some(client) = client() else { return };
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        for (causal, split_kv) in [(false, false), (true, false), (false, true), (true, true)] {
            let (cfg, half) = cfg(causal, split_kv);
            let kernel = {
                let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                CudaCompiler::default()
                    .compile(definition(&client, cfg, half), &options, ExecutionMode::Unchecked, ADDR)
                    .unwrap()
            };
            let opts = vec![
                "--gpu-architecture=sm_90".to_string(),
                format!("--include-path={}", include.display()),
                "--std=c++17".to_string(),
                "-Xptxas=-v".to_string(),
            ];
            let (cubin, log) = nvrtc_cubin(&kernel.to_string(), &opts).unwrap();
            let res = quattn_native::Resources::parse_ptxas_log(&log).expect("ptxas report");
            let sass = quattn_native::sass::disassemble(&cubin).unwrap();
            let hist = quattn_native::sass::opcode_histogram(&sass);
            // `HFMA2.MMA` is a move through the FMA pipe, not a multiply-add.
            let hfma2 = hist.get("HFMA2").copied().unwrap_or(0);
            let per_chunk = half.qk_chunk * cfg.rm() * cfg.kq() * 2;
            let per_tile = cfg.bk * cfg.rm() * cfg.cq() * 2;
            println!(
                "causal {causal}, split K/V {split_kv}: {} registers, {} B spilled, {hfma2} HFMA2 (unrolled loops: {per_chunk} + {per_tile}), {} FFMA",
                res.registers,
                res.spill_bytes(),
                hist.get("FFMA").copied().unwrap_or(0)
            );
            assert!(
                hfma2 >= per_chunk + per_tile,
                "causal {causal}, split K/V {split_kv}: {hfma2} HFMA2 < {per_chunk} + {per_tile}"
            );
            assert_eq!(res.spill_bytes(), 0, "causal {causal}, split K/V {split_kv}: spills");
        }
    }

    /// Every f16-accumulating mode at head dim 128, and the two-stage Q·Kᵀ with f16 P·V at every
    /// head dim, at the tiling and K/V staging the selection gives on the H100 (and the A100's
    /// build of one): NVRTC must compile each, CubeCL must declare the shared memory the fit
    /// check counts, and ptxas must not spill up to head dim 128 (`offline_cuda::prefetch_spill_free`).
    #[test]
    fn nvrtc_compiles_every_accumulation_mode_at_the_selected_tiling() {
        use crate::kernel::offline_cuda::{fma_vec_config, head_dims, prefetch_spill_free, Arch, OfflineCuda, Variant};
        use crate::launch::{CubeLimits, HalfTiles, PortableKernel};
        use crate::Dtype;
        use quattn_core::{Accumulation, PvAccum, QkAccum};
        let Some(cuda) = OfflineCuda::new() else { return };
        let two_stage = Accumulation { qk: QkAccum::TwoStage, pv: PvAccum::F16PerTile };
        let mut cases: Vec<(Arch, usize, usize, Accumulation)> = Vec::new();
        for qk in [QkAccum::F32, QkAccum::F16, QkAccum::TwoStage] {
            for pv in [PvAccum::F32, PvAccum::F16PerTile] {
                let accumulation = Accumulation { qk, pv };
                if !accumulation.is_f32() {
                    cases.push((Arch::Sm90, 128, 128, accumulation));
                }
            }
        }
        for (d, dv) in head_dims() {
            if d.max(dv) != 128 {
                cases.push((Arch::Sm90, d, dv, two_stage));
            }
        }
        cases.push((Arch::Sm80, 128, 128, two_stage));
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3])).map(|(arch, d, dv, accumulation)| {
            // The selection's table walk (`launch::candidates`, `first_fit`): separate K and V
            // stages where they fit.
            let limits = CubeLimits { max_shared_bytes: arch.max_shared_bytes(), max_units: 1024 };
            let kernel = crate::tiling::fma_half_candidates(d.max(dv) as u32)
                .iter()
                .map(|&tiles| {
                    let split_kv = tiles.smem_bytes_half_split(d as u32, dv as u32) as usize <= limits.max_shared_bytes;
                    HalfTiles { tiles, accumulation, split_kv }
                })
                .find(|&h| PortableKernel::Half(h).check_fits(limits, d as u32, dv as u32, Dtype::F16).is_ok())
                .expect("a packed-f16 tiling fits");
            // As `launch` builds them.
            let pv_f16 = accumulation.pv == PvAccum::F16PerTile;
            let cfg = fma_vec_config(&kernel.tiles, d, dv, true, true, !pv_f16);
            let half = HalfConfig { qk_chunk: accumulation.qk_chunk(d), pv_f16, split_kv: kernel.split_kv };
            // With plane reductions the f32 reduction scratch is unused and dropped.
            let formula = PortableKernel::Half(kernel).smem_bytes(d as u32, dv as u32, Dtype::F16);
            Variant {
                name: format!(
                    "fma_half_qk{:?}_pv{:?}_d{d}v{dv}_{}_split{}",
                    accumulation.qk, accumulation.pv, kernel.tiles, kernel.split_kv
                ),
                arch,
                definition: definition(cuda.client(), cfg, half),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: prefetch_spill_free(d, dv),
            }
        });
        cuda.check_all(variants);
    }
}
