//! On a GPU: check the decode family against an f64 CPU reference and time it at the decode
//! shapes of the benchmark.
//!
//! ```text
//! cargo run --release -p quattn-native --example decode_check [-- --check-only|--bench-only]
//! QUATTN_DECODE_SWEEP=64x3,64x4,128x2 cargo run --release -p quattn-native --example decode_check -- --bench-only
//! ```
//!
//! Check: every variant of `DecodeConfig::all()` on cases that cover GQA packing (group 1 to 16,
//! q_len 1 to 16), ragged and short KV lengths, bottom-right causal masks (rows that see no key
//! included), BSHD strides, bf16 and both head dims; each case at one split (O written by the
//! decode kernel), at the split the device's split function picks, and at many splits (the
//! in-kernel merge, with splits in which some rows see nothing); the 64-row variants also on
//! prefill cases of several row blocks (blocks within one Q head and across two). The split
//! counters are one buffer per variant, so every launch also checks that the last one left them
//! zeroed. One line per (variant, case): max |dO|
//! and |dLSE|, `ok` or `FAIL`; the last line is `ALL OK` or `SOME FAILED`.
//!
//! Bench: batch 8, 32 query heads over 8 KV heads, head dim 128, f16, (q_len, kv_len) = (1, 8k),
//! (1, 32k), (16, 32k): median ms of the decode call over 50 calls bracketed by CUDA
//! events each, and TB/s of K and V read; the split function's choice first, then forced split
//! counts. `QUATTN_DECODE_SWEEP` adds forced pipelines (`BLOCK_N x STAGES`) at every shape.
//! Output lines start with `bench` and are whitespace-separated `key=value` pairs.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use half::{bf16, f16};
use quattn_native::{AttentionShape, DecodeConfig, DecodeKernel, DecodePtrs, DecodeSplit, DecodeTile, Dtype, Layout, Strides};

type BoxErr = Box<dyn std::error::Error>;

/// Deterministic normal-ish samples (sum of uniforms), no RNG dependency.
fn samples(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                acc += ((s >> 40) as f32) / ((1u64 << 24) as f32) - 0.5;
            }
            acc * 1.732
        })
        .collect()
}

fn to_bits(x: &[f32], dtype: Dtype) -> Vec<u16> {
    match dtype {
        Dtype::Bf16 => x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect(),
        _ => x.iter().map(|v| f16::from_f32(*v).to_bits()).collect(),
    }
}
fn from_bits(x: &[u16], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::Bf16 => x.iter().map(|v| bf16::from_bits(*v).to_f32()).collect(),
        _ => x.iter().map(|v| f16::from_bits(*v).to_f32()).collect(),
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
}

impl Case {
    fn rows(&self) -> usize {
        self.q_heads / self.kv_heads * self.q_len
    }
    fn shape(&self, head_dim: usize) -> AttentionShape {
        let layout = if self.bshd { Layout::Bshd } else { Layout::Bhsd };
        AttentionShape::contiguous(layout, self.batch, self.q_heads, self.kv_heads, self.q_len, self.kv_len, head_dim, self.causal)
    }
}

/// Cases per row tile: each packs at most `rows` query rows per KV head.
fn cases() -> Vec<Case> {
    let c = |batch, q_heads, kv_heads, q_len, kv_len, causal, bshd| Case { batch, q_heads, kv_heads, q_len, kv_len, causal, bshd };
    vec![
        // The benchmark's group of 4 at q_len 1, ragged KV.
        c(2, 8, 2, 1, 1000, false, false),
        c(2, 8, 2, 1, 1000, true, true),
        // MHA and a group of 16.
        c(1, 3, 3, 1, 517, false, false),
        c(1, 16, 1, 1, 300, false, true),
        // Several positions per head, causal: the last rows see every key, the first fewer.
        c(2, 8, 2, 4, 777, true, false),
        c(1, 4, 2, 8, 333, true, true),
        c(1, 4, 1, 16, 1100, true, false),
        c(1, 8, 2, 16, 64, false, false),
        // Fewer keys than positions, causal: the first rows see no key (O 0, LSE -inf).
        c(1, 4, 1, 6, 3, true, false),
        c(1, 2, 1, 20, 5, true, true),
        // 32 rows.
        c(1, 8, 1, 4, 500, true, true),
        // A single key; a key count one past a tile.
        c(1, 4, 4, 1, 1, false, false),
        c(1, 2, 1, 1, 129, false, false),
        // Row blocks (64-row variants): 200 rows of 4 heads x 50 positions, blocks spanning two
        // heads, causal; 3 x 90 positions within single heads but for the last block; more
        // positions than keys.
        c(2, 8, 2, 50, 700, true, false),
        c(1, 3, 1, 90, 1000, false, true),
        c(1, 2, 1, 130, 77, true, false),
    ]
}

/// max |dO|, max |dLSE| of one run against the f64 reference (LSE -inf must be exactly -inf).
fn check(stream: &Arc<CudaStream>, kernel: &DecodeKernel, c: &Case, split: DecodeSplit, counters: u64) -> Result<(f64, f64), BoxErr> {
    let cfg = *kernel.config();
    let (d, dt) = (cfg.head_dim as usize, cfg.input);
    let s = c.shape(d);
    let nq = c.batch * c.q_heads * c.q_len * d;
    let nk = c.batch * c.kv_heads * c.kv_len * d;
    // Inputs rounded to the kernel's type; the reference sees exactly those values.
    let q = from_bits(&to_bits(&samples(nq, 1), dt), dt);
    let k = from_bits(&to_bits(&samples(nk, 2), dt), dt);
    let v = from_bits(&to_bits(&samples(nk, 3), dt), dt);
    let mut qd = stream.clone_htod(&to_bits(&q, dt))?;
    let mut kd = stream.clone_htod(&to_bits(&k, dt))?;
    let mut vd = stream.clone_htod(&to_bits(&v, dt))?;
    // O starts as NaN bits: any element the kernels fail to write shows up.
    let mut od = stream.clone_htod(&vec![0x7e00u16; nq])?;
    let mut ld = stream.clone_htod(&vec![f32::NAN; c.batch * c.q_heads * c.q_len])?;
    let (po_len, pl_len) = split.partial_lens(&s);
    let mut po: CudaSlice<f32> = stream.alloc_zeros(po_len.max(4))?;
    let mut pl: CudaSlice<f32> = stream.alloc_zeros(pl_len.max(4))?;
    let ptrs = DecodePtrs {
        q: qd.device_ptr_mut(stream).0,
        k: kd.device_ptr_mut(stream).0,
        v: vd.device_ptr_mut(stream).0,
        o: od.device_ptr_mut(stream).0,
        lse: ld.device_ptr_mut(stream).0,
        part_o: po.device_ptr_mut(stream).0,
        part_lse: pl.device_ptr_mut(stream).0,
        counters,
        ..Default::default()
    };
    // SAFETY: every buffer was allocated for this shape and split above, the counters for the
    // largest case.
    unsafe { kernel.launch_raw(stream, &s, None, split, &ptrs) }?;
    let o = from_bits(&stream.clone_dtoh(&od)?, dt);
    let lse = stream.clone_dtoh(&ld)?;

    let at = |st: &Strides, b: usize, h: usize, i: usize| st.offset(b, h, i);
    let (mut err_o, mut err_lse) = (0f64, 0f64);
    let group = c.q_heads / c.kv_heads;
    for b in 0..c.batch {
        for h in 0..c.q_heads {
            let kh = h / group;
            for i in 0..c.q_len {
                let visible = if c.causal {
                    (i as i64 + c.kv_len as i64 - c.q_len as i64 + 1).clamp(0, c.kv_len as i64) as usize
                } else {
                    c.kv_len
                };
                let qo = at(&s.q, b, h, i);
                let mut sc: Vec<f64> = (0..visible)
                    .map(|j| {
                        let ko = at(&s.k, b, kh, j);
                        (0..d).map(|x| q[qo + x] as f64 * k[ko + x] as f64).sum::<f64>() * s.scale as f64
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for x in sc.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                let oo = at(&s.o, b, h, i);
                for x in 0..d {
                    let r = if visible == 0 { 0.0 } else { (0..visible).map(|j| sc[j] * v[at(&s.v, b, kh, j) + x] as f64).sum::<f64>() / sum };
                    let e = (r - o[oo + x] as f64).abs();
                    err_o = err_o.max(if e.is_nan() { f64::INFINITY } else { e });
                }
                let ref_lse = if visible == 0 { f64::NEG_INFINITY } else { m + sum.ln() };
                let got = lse[(b * c.q_heads + h) * c.q_len + i] as f64;
                let e = if ref_lse.is_infinite() {
                    if got == f64::NEG_INFINITY { 0.0 } else { f64::INFINITY }
                } else if got.is_nan() {
                    f64::INFINITY
                } else {
                    (ref_lse - got).abs()
                };
                err_lse = err_lse.max(e);
            }
        }
    }
    Ok((err_o, err_lse))
}

/// The splits a case runs at: one, the device's choice, and as many as whole tiles allow (up
/// to 16, so some splits hold only keys some rows cannot see).
fn splits_of(kernel: &DecodeKernel, s: &AttentionShape) -> Vec<DecodeSplit> {
    let bn = kernel.config().tile().block_n as usize;
    let tiles = s.kv_len.div_ceil(bn).max(1);
    let one = DecodeSplit { splits: 1, keys_per_split: (tiles * bn) as u32 };
    let many_n = tiles.min(16);
    let per = tiles.div_ceil(many_n);
    let many = DecodeSplit { splits: tiles.div_ceil(per) as u32, keys_per_split: (per * bn) as u32 };
    let mut v = vec![one, kernel.split_for(s, None), many];
    v.dedup();
    v
}

fn check_variant(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, cfg: DecodeConfig) -> Result<bool, BoxErr> {
    let kernel = match DecodeKernel::load(ctx, cfg) {
        Ok(k) => k,
        Err(e) => {
            println!("FAIL {:32} does not load: {e}", cfg.name());
            return Ok(false);
        }
    };
    let tol_o = if cfg.input == Dtype::Bf16 { 2e-2 } else { 4e-3 };
    let mut ok = true;
    let mut counter_buf: CudaSlice<u32> = stream.alloc_zeros(1024)?;
    let counters = counter_buf.device_ptr_mut(stream).0;
    // Every case that fits the row tile, the smaller ones with whole warps of padding rows; the
    // 64-row tile takes every case, in row blocks.
    for c in cases().into_iter().filter(|c| c.rows() <= cfg.rows as usize || cfg.rows as usize == DecodeConfig::MAX_ROWS) {
        let s = c.shape(cfg.head_dim as usize);
        assert!(cfg.counters_len(&s) <= 1024);
        for split in splits_of(&kernel, &s) {
            let (eo, el) = check(stream, &kernel, &c, split, counters)?;
            let pass = eo <= tol_o && el <= 1e-2;
            ok &= pass;
            println!(
                "{} {:32} b{} h{}/{} q{} kv{} {}{} splits {:2} x {:5} | dO {eo:.1e} dLSE {el:.1e}",
                if pass { "ok  " } else { "FAIL" },
                cfg.name(),
                c.batch,
                c.q_heads,
                c.kv_heads,
                c.q_len,
                c.kv_len,
                if c.causal { "causal " } else { "" },
                if c.bshd { "bshd" } else { "bhsd" },
                split.splits,
                split.keys_per_split
            );
        }
    }
    Ok(ok)
}

/// Median ms of `iters` calls (events around each) after 5 warm-up calls.
fn time_calls(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, iters: usize, mut call: impl FnMut() -> Result<(), BoxErr>) -> Result<f64, BoxErr> {
    for _ in 0..5 {
        call()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(iters);
    for _ in 0..iters {
        let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        a.record(stream)?;
        call()?;
        b.record(stream)?;
        events.push((a, b));
    }
    stream.synchronize()?;
    let mut ms: Vec<f64> = events.iter().map(|(a, b)| a.elapsed_ms(b).map(|x| x as f64)).collect::<Result<_, _>>()?;
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms[ms.len() / 2])
}

fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, tiles: &[Option<DecodeTile>]) -> Result<(), BoxErr> {
    let (batch, q_heads, kv_heads, d) = (8usize, 32usize, 8usize, 128usize);
    let max_kv = 32768;
    let nk = batch * kv_heads * max_kv * d;
    // Non-zero data (a repeated block of samples): the values do not change the memory traffic.
    let block = to_bits(&samples(1 << 20, 5), Dtype::F16);
    let fill: Vec<u16> = block.iter().cycle().take(nk).copied().collect();
    let mut kd = stream.clone_htod(&fill)?;
    let mut vd = stream.clone_htod(&fill)?;
    drop(fill);
    let mut qd = stream.clone_htod(&block[..batch * q_heads * 16 * d])?;
    let mut od: CudaSlice<u16> = stream.alloc_zeros(batch * q_heads * 16 * d)?;
    let mut ld: CudaSlice<f32> = stream.alloc_zeros(batch * q_heads * 16)?;
    let mut po: CudaSlice<f32> = stream.alloc_zeros(batch * kv_heads * 128 * 64 * d)?;
    let mut pl: CudaSlice<f32> = stream.alloc_zeros(batch * kv_heads * 128 * 64)?;
    let mut counters: CudaSlice<u32> = stream.alloc_zeros(batch * kv_heads)?;
    let ptrs = DecodePtrs {
        q: qd.device_ptr_mut(stream).0,
        k: kd.device_ptr_mut(stream).0,
        v: vd.device_ptr_mut(stream).0,
        o: od.device_ptr_mut(stream).0,
        lse: ld.device_ptr_mut(stream).0,
        part_o: po.device_ptr_mut(stream).0,
        part_lse: pl.device_ptr_mut(stream).0,
        counters: counters.device_ptr_mut(stream).0,
        ..Default::default()
    };
    for (q_len, kv_len) in [(1usize, 8192usize), (1, 32768), (16, 32768)] {
        // K and V keep the 32k layout; shorter rows read the first kv_len keys of each head.
        let mut s = AttentionShape::contiguous(Layout::Bhsd, batch, q_heads, kv_heads, q_len, kv_len, d, false);
        s.k = Strides::new(Layout::Bhsd, kv_heads, max_kv, d);
        s.v = s.k;
        let bytes = 2.0 * (batch * kv_heads * kv_len * d * 2) as f64;
        for tile in tiles {
            let mut cfg = DecodeConfig::new(d, Dtype::F16, q_heads / kv_heads * q_len)?;
            cfg.tile = *tile;
            let kernel = match DecodeKernel::load(ctx, cfg) {
                Ok(k) => k,
                Err(e) => {
                    println!("bench kernel={} skipped=\"{e}\"", cfg.name());
                    continue;
                }
            };
            let auto = kernel.split_for(&s, None);
            let bn = cfg.tile().block_n;
            let mut splits = vec![auto];
            for n in [1u32, 2, 3, 4, 6, 8, 16] {
                let per = (kv_len as u32).div_ceil(n).div_ceil(bn) * bn;
                let sp = DecodeSplit { splits: (kv_len as u32).div_ceil(per), keys_per_split: per };
                if !splits.contains(&sp) {
                    splits.push(sp);
                }
            }
            let (sms, occ) = kernel.occupancy();
            for (i, sp) in splits.iter().enumerate() {
                // SAFETY: the buffers hold the largest shape and MAX_SPLITS partial states.
                let ms = time_calls(ctx, stream, 50, || Ok(unsafe { kernel.launch_raw(stream, &s, None, *sp, &ptrs) }?))?;
                println!(
                    "bench kernel={} q_len={q_len} kv_len={kv_len} splits={} keys_per_split={} chosen={} sms={sms} ctas_per_sm={occ} regs={} ms={ms:.4} tb_s={:.3}",
                    cfg.name(),
                    sp.splits,
                    sp.keys_per_split,
                    i == 0,
                    kernel.compiled().resources.map(|r| r.registers).unwrap_or(0),
                    bytes / (ms * 1e-3) / 1e12
                );
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (check_only, bench_only) = (mode == "--check-only", mode == "--bench-only");
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    println!("device {} cc {:?}", ctx.name()?, ctx.compute_capability()?);
    let mut all_ok = true;
    if !bench_only {
        // The paged variants run through the library (examples/paged_check.rs).
        for cfg in DecodeConfig::all().into_iter().filter(|c| !c.paged) {
            all_ok &= check_variant(&ctx, &stream, cfg)?;
        }
    }
    if !check_only {
        let mut tiles = vec![None];
        if let Ok(sweep) = std::env::var("QUATTN_DECODE_SWEEP") {
            for t in sweep.split(',').filter(|t| !t.trim().is_empty()) {
                let p: Vec<Option<u32>> = t.trim().split('x').map(|x| x.parse().ok()).collect();
                match p[..] {
                    [Some(n), Some(st)] => tiles.push(Some(DecodeTile::new(n, st))),
                    _ => println!("bench skipped=\"{t}: not BLOCK_N x STAGES\""),
                }
            }
        }
        bench(&ctx, &stream, &tiles)?;
    }
    if !bench_only {
        println!("{}", if all_ok { "ALL OK" } else { "SOME FAILED" });
    }
    Ok(())
}
