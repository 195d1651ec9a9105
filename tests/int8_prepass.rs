//! The CubeCL INT8 prepass (`quattn_cubecl::quantize_int8`) against the CPU codec
//! (`quattn::codec::int8`), on wgpu (mesa's llvmpipe in CI): codes and scales bit for bit for
//! every granularity, f16 and f32 inputs, both layouts, GQA, ragged lengths, outlier channels;
//! with smoothing, the device mean against the CPU's f64 mean within the error of its f32
//! summation order, and the codes bit for bit given the device mean.

#![cfg(feature = "wgpu")]

use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use half::f16;
use quattn::codec::float16::round_f16_vec;
use quattn::codec::int8::{self, DeviceSums, Int8Blocking, Int8Operands, Int8ScaleLayout};
use quattn::{inputs, AttentionProblem, Int8Granularity, Layout};
use quattn::Dtype as ElemType;
use quattn_cubecl::Int8Quant;

const GRANULARITIES: [Int8Granularity; 3] = [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread];

/// A wgpu client; `None` (skip) only outside CI when the machine has no adapter at all.
fn client() -> Option<ComputeClient<WgpuRuntime>> {
    let instance = wgpu::Instance::default();
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if adapters.is_empty() {
        let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
        assert!(!ci, "CI must have a wgpu adapter (mesa-vulkan-drivers)");
        println!("SKIPPED: no wgpu adapter on this machine");
        return None;
    }
    Some(WgpuRuntime::client(&WgpuDevice::DefaultDevice))
}

fn upload(c: &ComputeClient<WgpuRuntime>, x: &[f32], elem: ElemType) -> Handle {
    match elem {
        ElemType::F32 => c.create_from_slice(f32::as_bytes(x)),
        ElemType::F16 => c.create_from_slice(f16::as_bytes(&x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>())),
        ElemType::Bf16 => unreachable!("not tested"),
    }
}

fn read_bytes(c: &ComputeClient<WgpuRuntime>, h: &Handle) -> Vec<u8> {
    c.read_one(h.clone()).expect("read back").to_vec()
}

fn read_f32(c: &ComputeClient<WgpuRuntime>, h: &Handle) -> Vec<f32> {
    bytemuck::pod_collect_to_vec::<u8, f32>(&read_bytes(c, h))
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: device {a:e} vs CPU {b:e}");
    }
}

fn assert_codes(what: &str, got: &[i8], want: &[i8]) {
    let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    assert!(bad.is_empty(), "{what}: {} codes differ, first at {}: device {} vs CPU {}", bad.len(), bad[0], got[bad[0]], want[bad[0]]);
}

#[allow(clippy::too_many_arguments)]
fn run_device(
    c: &ComputeClient<WgpuRuntime>,
    p: &AttentionProblem,
    elem: ElemType,
    g: Int8Granularity,
    blk: Int8Blocking,
    smooth_k: bool,
    q: &[f32],
    k: &[f32],
) -> Int8Operands {
    let quant = Int8Quant { granularity: g, blocking: blk, smooth_k };
    let (qh, kh) = (upload(c, q, elem), upload(c, k, elem));
    let shape = quattn::AttentionShape { write_lse: false, ..p.shape() };
    let out: quattn_cubecl::Int8DeviceOperands = quattn_cubecl::quantize_int8(c, &shape, elem, &quant, &qh, &kh).expect("prepass refused");
    let codes = |h: &Handle, n: usize| read_bytes(c, h)[..n].iter().map(|&b| b as i8).collect::<Vec<i8>>();
    let lay = Int8ScaleLayout::new(p, g, blk).unwrap();
    Int8Operands {
        q_codes: codes(&out.q_codes, p.q_len_elems()),
        k_codes: codes(&out.k_codes, p.k_len_elems()),
        q_scales: read_f32(c, &out.q_scales)[..lay.q_scales_len()].to_vec(),
        k_scales: read_f32(c, &out.k_scales)[..lay.k_scales_len()].to_vec(),
        k_mean: out.k_mean.as_ref().map(|h| read_f32(c, h)[..p.batch * p.kv_heads * p.head_dim].to_vec()),
        lse_shift: out.lse_shift.as_ref().map(|h| read_f32(c, h)[..p.lse_len_elems()].to_vec()),
        v: None,
    }
}

/// Normal inputs with the project's outliers, plus +8σ on a few K channels (a per-channel
/// offset shared by all keys, what smoothing removes); rounded to `elem`.
fn inputs_for(p: &AttentionProblem, elem: ElemType, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (q, mut k, _) = inputs::qkv(p, seed);
    let st = p.k_strides();
    for b in 0..p.batch {
        for h in 0..p.kv_heads {
            for j in 0..p.kv_len {
                for c in [3, p.head_dim / 2 + 1] {
                    k[st.offset(b, h, j) + c] += 8.0;
                }
            }
        }
    }
    match elem {
        ElemType::F16 => (round_f16_vec(&q), round_f16_vec(&k)),
        _ => (q, k),
    }
}

/// Runs one case and checks everything against the CPU codec (`int8::verify_operands`: codes
/// and scales bit for bit, the f32-summed mean and LSE shift within their summation bounds).
fn check_case(c: &ComputeClient<WgpuRuntime>, p: &AttentionProblem, elem: ElemType, blk: Int8Blocking, seed: u64) {
    let (q, k) = inputs_for(p, elem, seed);
    let fold = p.softmax_scale() * std::f32::consts::LOG2_E;
    for g in GRANULARITIES {
        if blk.check(g).is_err() {
            continue;
        }
        let lay = Int8ScaleLayout::new(p, g, blk).unwrap();
        for smooth in [false, true] {
            let what = format!("{p:?} {elem:?} {g:?} {blk:?} smooth={smooth}");
            let dev = run_device(c, p, elem, g, blk, smooth, &q, &k);
            if let Err(e) = int8::verify_operands(p, &lay, smooth, &q, &k, fold, &dev, DeviceSums::F32AnyOrder) {
                panic!("{what}: {e}");
            }
        }
    }
}

#[test]
fn prepass_matches_codec_f16_bhsd_gqa_ragged() {
    let Some(c) = client() else { return };
    let blk = Int8Blocking { block_q: 32, block_k: 32, warps: 2 };
    // kv_len 777: the K mean in 4 chunks of keys, the last one ragged.
    for (q_len, kv_len) in [(1, 17), (17, 70), (300, 45), (20, 777)] {
        let p = AttentionProblem::new(2, 4, q_len, 64).kv_heads(2).kv_len(kv_len);
        check_case(&c, &p, ElemType::F16, blk, q_len as u64);
    }
}

#[test]
fn prepass_matches_codec_f32_bshd_hd128() {
    let Some(c) = client() else { return };
    let blk = Int8Blocking { block_q: 64, block_k: 32, warps: 4 };
    let p = AttentionProblem::new(1, 4, 70, 128).kv_heads(1).kv_len(300).layout(Layout::Bshd);
    check_case(&c, &p, ElemType::F32, blk, 7);
    let p = AttentionProblem::new(2, 2, 17, 32).kv_len(33).layout(Layout::Bshd);
    check_case(&c, &p, ElemType::F16, Int8Blocking { block_q: 16, block_k: 16, warps: 1 }, 8);
}

#[test]
fn prepass_native_blocking_and_odd_head_dim() {
    // The native IMMA blocking (128 rows, 8 warps of 16) and a head dim that is not a power of
    // two (the mean kernel's partial sums do not divide evenly, nor do its chunks of keys).
    let Some(c) = client() else { return };
    let p = AttentionProblem::new(1, 2, 130, 96).kv_heads(1).kv_len(600);
    check_case(&c, &p, ElemType::F16, Int8Blocking { block_q: 128, block_k: 64, warps: 8 }, 9);
}

/// Quotients that land exactly on a half integer: round-half-even decides, on the device as on
/// the CPU (2.5 → 2, 3.5 → 4, −0.5 → 0, 126.5 → 126).
#[test]
fn prepass_rounds_ties_to_even() {
    let Some(c) = client() else { return };
    let p = AttentionProblem::new(1, 1, 32, 32).kv_len(32);
    let blk = Int8Blocking { block_q: 32, block_k: 32, warps: 2 };
    // Every row holds ±127 (scale exactly 1 for every group) and half integers elsewhere.
    let make = |seed: u64| -> Vec<f32> {
        let mut x = inputs::normal_with_outliers(32 * 32, seed);
        for (i, v) in x.iter_mut().enumerate() {
            *v = if i % 32 == 0 { if i % 64 == 0 { 127.0 } else { -127.0 } } else { (*v * 40.0).clamp(-127.0, 126.0).floor() + 0.5 };
        }
        x
    };
    let (q, k) = (make(1), make(2));
    let fold = p.softmax_scale() * std::f32::consts::LOG2_E;
    for g in GRANULARITIES {
        let lay = Int8ScaleLayout::new(&p, g, blk).unwrap();
        let dev = run_device(&c, &p, ElemType::F16, g, blk, false, &q, &k);
        let cq = int8::quantize_q(&p, &lay, &q, fold).unwrap();
        let ck = int8::quantize_k(&p, &lay, &k).unwrap();
        assert!(ck.scales.iter().all(|&s| s == 1.0));
        assert_codes("Q ties", &dev.q_codes, &cq.codes);
        assert_codes("K ties", &dev.k_codes, &ck.codes);
        assert_bits("Q scales", &dev.q_scales, &cq.scales);
        for (&x, &code) in k.iter().zip(&dev.k_codes) {
            assert_eq!(code as f32, x.round_ties_even(), "{x}");
        }
    }
}

/// The scale-index mapping on a small GQA case: batch 2, 4 Q heads over 2 KV heads, q_len 40,
/// kv_len 70, block_k 32, every granularity. For each (query block, key block) of each
/// (batch, head), the Q scale indices the block's rows use and the K scale index its keys use,
/// printed and checked against values derived by hand from the layout rules; then each Q head's
/// rows are given a distinct magnitude and the device's scales must sit at those indices.
#[test]
fn scale_index_mapping_gqa() {
    let p = AttentionProblem::new(2, 4, 40, 32).kv_heads(2).kv_len(70);
    // block_q 16 with 2 warps of 8 rows (per block and per warp); per thread needs 16 rows per
    // warp, so it is laid out for block_q 32 with 2 warps.
    let small = Int8Blocking { block_q: 16, block_k: 32, warps: 2 };
    let wide = Int8Blocking { block_q: 32, block_k: 32, warps: 2 };
    assert!(small.check(Int8Granularity::PerThread).is_err());
    let cases = [(Int8Granularity::PerBlock, small), (Int8Granularity::PerWarp, small), (Int8Granularity::PerThread, wide)];
    for (g, blk) in cases {
        let lay = Int8ScaleLayout::new(&p, g, blk).unwrap();
        println!("{g:?} {blk:?}: q scales {:?}, k scales {:?}", lay.q_scales_shape(), lay.k_scales_shape());
        for b in 0..2 {
            for h in 0..4 {
                let kvh = h / 2;
                for qb in 0..lay.q_blocks() {
                    for kb in 0..lay.k_blocks() {
                        let rows = qb * blk.block_q..(qb * blk.block_q + blk.block_q).min(40);
                        let mut qi: Vec<usize> = rows.clone().map(|i| lay.q_scale_index(b, h, i)).collect();
                        qi.dedup();
                        let keys = kb * 32..(kb * 32 + 32).min(70);
                        let mut ki: Vec<usize> = keys.map(|j| lay.k_scale_index(b, kvh, j)).collect();
                        ki.dedup();
                        println!("  b{b} h{h} (kv {kvh}) qblock {qb} kblock {kb} -> q_scale {qi:?} k_scale {ki:?}");
                        // K: [2, 2, 3], one scale per block of 32 keys of the KV head.
                        assert_eq!(ki, vec![(b * 2 + kvh) * 3 + kb]);
                        let head = b * 4 + h;
                        let expected: Vec<usize> = match g {
                            // [2, 4, 3]: q_len 40 = blocks of 16, 16, 8.
                            Int8Granularity::PerBlock => vec![head * 3 + qb],
                            // [2, 4, 3, 2]: rows 0..8 warp 0, 8..16 warp 1; the last block's
                            // 8 rows are all warp 0's.
                            Int8Granularity::PerWarp => {
                                if qb < 2 { vec![head * 6 + qb * 2, head * 6 + qb * 2 + 1] } else { vec![head * 6 + 4] }
                            }
                            // [2, 4, 2, 2, 8]: block 0 rows 0..32 = warps 0, 1; groups g of rows
                            // {g, g+8} in each warp, so in row order the slots go 0..8, 0..8
                            // (warp 0), 8..16, 8..16 (warp 1); block 1 has rows 32..40 only:
                            // warp 0, groups 0..8.
                            Int8Granularity::PerThread => {
                                let base = head * 32 + qb * 16;
                                if qb == 0 {
                                    (0..8).chain(0..8).chain(8..16).chain(8..16).map(|s| base + s).collect()
                                } else {
                                    (0..8).map(|s| base + s).collect()
                                }
                            }
                        };
                        assert_eq!(qi, expected, "{g:?} b{b} h{h} qblock {qb}");
                    }
                }
            }
        }
    }

    // On the device: row i of head h in batch b has amax (b*4 + h + 1) * (i + 1); the scale at
    // each index is then the largest of its rows.
    let Some(c) = client() else { return };
    let st = p.q_strides();
    let mut q = vec![0.0f32; p.q_len_elems()];
    for b in 0..2 {
        for h in 0..4 {
            for i in 0..40 {
                q[st.offset(b, h, i) + (i % 32)] = ((b * 4 + h + 1) * (i + 1)) as f32 * if i % 2 == 0 { 1.0 } else { -1.0 };
            }
        }
    }
    let k = inputs::normal_with_outliers(p.k_len_elems(), 5);
    let fold = p.softmax_scale() * std::f32::consts::LOG2_E;
    for (g, blk) in cases {
        let lay = Int8ScaleLayout::new(&p, g, blk).unwrap();
        let dev = run_device(&c, &p, ElemType::F32, g, blk, false, &q, &k);
        let mut amax = vec![0.0f32; lay.q_scales_len()];
        for b in 0..2 {
            for h in 0..4 {
                for i in 0..40 {
                    let idx = lay.q_scale_index(b, h, i);
                    amax[idx] = amax[idx].max(((b * 4 + h + 1) * (i + 1)) as f32);
                }
            }
        }
        let want: Vec<f32> = amax.iter().map(|&a| int8::scale_for(a) * fold).collect();
        assert_bits(&format!("{g:?} scales by index"), &dev.q_scales, &want);
    }
}

/// Refusals before anything is enqueued: strides that would split a code word, a per-thread
/// layout without 16 rows per warp, and an attention launch on operands quantized for another
/// blocking than the kernel's.
#[test]
fn prepass_and_int8_launch_refusals() {
    use quattn_cubecl::{LaunchError, PortableKernel};
    let Some(c) = client() else { return };
    let p = AttentionProblem::new(1, 2, 40, 64).kv_len(70).with_lse(true);
    let shape = p.shape();
    assert!(shape.write_lse);
    let (q, k, v) = inputs::qkv(&p, 3);
    let (qh, kh, vh) = (upload(&c, &q, ElemType::F16), upload(&c, &k, ElemType::F16), upload(&c, &v, ElemType::F16));
    let kernel = quattn_cubecl::select_int8(&c, &shape, ElemType::F16, Int8Granularity::PerThread, true).unwrap();
    let PortableKernel::Int8(int8) = kernel else { panic!("{kernel:?}") };
    let blocking = int8.blocking();
    assert_eq!(blocking.block_q % 16, 0);
    assert_eq!(blocking.warps, blocking.block_q / 16);
    assert_eq!(kernel.blocking(), Some(blocking));
    let quant = int8.quant();
    assert_eq!(quant, Int8Quant { granularity: Int8Granularity::PerThread, blocking, smooth_k: true });

    let mut odd = shape;
    odd.q.seq = 66;
    assert!(matches!(quattn_cubecl::quantize_int8(&c, &odd, ElemType::F16, &quant, &qh, &kh), Err(LaunchError::InvalidProblem { .. })));
    let wide = Int8Quant { blocking: quattn_cubecl::Int8Blocking { warps: 1, ..blocking }, ..quant };
    assert!(quattn_cubecl::quantize_int8(&c, &shape, ElemType::F16, &wide, &qh, &kh).is_err());

    let (o, lse) = (c.empty(p.o_len_elems() * 2), c.empty(p.lse_len_elems() * 4));
    let other = Int8Quant { blocking: quattn_cubecl::Int8Blocking { block_k: blocking.block_k * 2, ..blocking }, ..quant };
    let other_ops = quattn_cubecl::quantize_int8(&c, &shape, ElemType::F16, &other, &qh, &kh).unwrap();
    let err = quattn_cubecl::launch_int8(&c, &kernel, &shape, ElemType::F16, &other_ops, &vh, &o, Some(&lse)).unwrap_err();
    assert!(err.to_string().contains("quantized as"), "{err}");
    let ops = quattn_cubecl::quantize_int8(&c, &shape, ElemType::F16, &quant, &qh, &kh).unwrap();
    let info = quattn_cubecl::launch_int8(&c, &kernel, &shape, ElemType::F16, &ops, &vh, &o, Some(&lse)).unwrap();
    assert!(info.launched);
    assert!(info.kernel.starts_with("portable_fma_vec_int8_thread"), "{}", info.kernel);
    // Without the LSE shift a smoothed launch that writes the LSE cannot be right.
    let no_shift = quattn_cubecl::Int8DeviceOperands { lse_shift: None, ..ops };
    assert!(quattn_cubecl::launch_int8(&c, &kernel, &shape, ElemType::F16, &no_shift, &vh, &o, Some(&lse)).is_err());
    // The float launch refuses the INT8 kernel.
    assert!(matches!(
        quattn_cubecl::launch(&c, &kernel, &shape, ElemType::F16, &qh, &kh, &vh, &o, Some(&lse)),
        Err(LaunchError::WrongKernel { .. })
    ));
}
