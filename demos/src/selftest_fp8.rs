//! `quattn selftest`'s FP8 group on CUDA: the native FP8 plans' device quantization and their
//! device-tensor entry points.
//!
//! - `fp8-upload`: a native FP8 plan's upload (`Session::upload` of f16 host inputs, quantized by
//!   the device prepass) against the codec (`Fp8Tensor::quantize` on the same f16 values): codes
//!   and descales bit for bit; two executions of the resident data give the same O.
//! - `fp8-quantize`: `Session::quantize_fp8_cuda` alone, f16 and bf16 inputs, e4m3 and e5m2,
//!   per tensor and per head, against the codec; inputs with outliers, tensors scaled so that
//!   f16 subnormals and subnormal f32 descales occur; a NaN element (a NaN code, the descale of
//!   its group without it); a large problem per head (the one-read pass where the device keeps
//!   enough CTAs resident) and per tensor (the amax and quantize passes, several slabs).
//! - `fp8-run_cuda` / `fp8-run_cuda_fp8`: the device-tensor entry points (f16 tensors quantized
//!   on the device; pre-quantized codes and descales) against the host path of the same plan,
//!   O and LSE bit for bit; typed errors for wrong descale buffers.

use half::{bf16, f16};
use quattn::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use quattn::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use quattn::{
    AttentionProblem, CudaCodes, CudaCodesMut, CudaFp8, CudaFp8Mut, CudaTensor, CudaTensorMut, DescaleGranularity, Dtype, Error, Fp8Format,
    KernelId, Layout, NativeKind, Precision, PvFormat, Session, Strategy, Strides, TensorName,
};
use std::sync::Arc;

use crate::run::Shape;
use crate::selftest::Case;

const GRANULARITIES: [DescaleGranularity; 2] = [DescaleGranularity::PerTensor, DescaleGranularity::PerHead];

/// GQA BHSD with ragged lengths, BSHD, a decode-like row over many keys; head dim 128 (one
/// compiled variant per family).
fn shapes() -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(2, 8, 300, 128).kv_heads(2).kv_len(777).causal(true).with_lse(true),
        AttentionProblem::new(1, 4, 129, 128).kv_len(1000).layout(Layout::Bshd).with_lse(true),
        AttentionProblem::new(1, 32, 1, 128).kv_heads(8).kv_len(4097).with_lse(true),
    ]
}

/// The prepass alone at another head dim (64 elements per row: other row offsets per tile).
fn quantize_only_shapes() -> Vec<AttentionProblem> {
    vec![AttentionProblem::new(2, 6, 129, 64).kv_heads(3).kv_len(1000).layout(Layout::Bshd)]
}

fn fp8(descale: DescaleGranularity, p: PvFormat) -> Precision {
    Precision::Fp8 { format: Fp8Format::E4M3, descale, p }
}

fn case(session: &Session, group: &str, precision: String, p: &AttentionProblem) -> Case {
    let info = session.info();
    Case {
        device: info.kind.into(),
        adapter: info.adapter,
        strategy: group.into(),
        precision,
        kernel: None,
        shape: Shape::of(p),
        status: "fail",
        accuracy: None,
        vs_emulation_rel_l2: None,
        reason: None,
        error_over_tolerance: None,
    }
}

/// `Ok(None)` pass, `Ok(Some(why))` skip, `Err` fail.
fn finish(mut c: Case, r: anyhow::Result<Option<String>>) -> Case {
    match r {
        Ok(None) => c.status = "pass",
        Ok(Some(why)) => {
            c.status = "skip";
            c.reason = Some(why);
        }
        Err(e) => c.reason = Some(format!("{e:#}")),
    }
    c
}

/// The codec's tensors for Q, K and V of `p` (values as the device reads them).
fn reference(p: &AttentionProblem, format: Fp8Format, g: DescaleGranularity, x: [&[f32]; 3]) -> anyhow::Result<[Fp8Tensor; 3]> {
    let layout = |heads, len| DescaleLayout { granularity: g, batch: p.batch, heads, len, block_rows: 1 };
    Ok([
        Fp8Tensor::quantize(format, x[0], p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len))?,
        Fp8Tensor::quantize(format, x[1], p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len))?,
        Fp8Tensor::quantize(format, x[2], p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len))?,
    ])
}

fn strides(p: &AttentionProblem) -> [Strides; 3] {
    [p.q_strides(), p.k_strides(), p.v_strides()]
}

fn compare(p: &AttentionProblem, got: [&Fp8Tensor; 3], want: &[Fp8Tensor; 3]) -> anyhow::Result<()> {
    for (((name, g), w), s) in ["Q", "K", "V"].into_iter().zip(got).zip(want).zip(strides(p)) {
        g.matches(w, s, p.head_dim).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    }
    Ok(())
}

fn f16_round(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

pub fn cases(session: &Session) -> Vec<Case> {
    let mut out = Vec::new();
    let Ok(ctx) = CudaContext::new(0) else { return out };
    let stream = ctx.default_stream();
    for (p, attention) in shapes().into_iter().map(|p| (p, true)).chain(quantize_only_shapes().into_iter().map(|p| (p, false))) {
        for g in GRANULARITIES {
            if attention {
                let prec = fp8(g, PvFormat::Fp8);
                let c = case(session, "fp8-upload", prec.name(), &p);
                let r = upload_case(session, &p, prec);
                out.push(finish(c, r));
            }
            for input in [Dtype::F16, Dtype::Bf16] {
                for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                    let name = format!("{} from {input}", Precision::Fp8 { format, descale: g, p: PvFormat::Fp8 }.name());
                    let c = case(session, "fp8-quantize", name, &p);
                    let r = quantize_case(session, &stream, &p, input, format, g, false);
                    out.push(finish(c, r));
                }
            }
        }
        // A NaN element: a NaN code, its group's descale as if it were absent.
        let c = case(session, "fp8-quantize-nan", fp8(DescaleGranularity::PerHead, PvFormat::Fp8).name(), &p);
        let r = quantize_case(session, &stream, &p, Dtype::F16, Fp8Format::E4M3, DescaleGranularity::PerHead, true);
        out.push(finish(c, r));
        if !attention {
            continue;
        }
        for (strategy, pv) in [(Strategy::Auto, PvFormat::Fp8), (Strategy::Native(NativeKind::Fp8Mma), PvFormat::F16)] {
            for g in GRANULARITIES {
                let prec = fp8(g, pv);
                for api in ["run_cuda", "run_cuda_fp8"] {
                    let c = case(session, &format!("fp8-{api}-{strategy:?}"), prec.name(), &p);
                    let r = device_case(session, &stream, &p, prec, strategy, api);
                    out.push(finish(c, r));
                }
            }
        }
    }
    // Three 64 MB f16 tensors. Per head (64 tiles a group) the default path takes the one-read
    // pass on a device that keeps that many CTAs resident; per tensor (4096 tiles a group) no
    // device does, so the amax and quantize passes run, in several slabs of the L2's size.
    let big = AttentionProblem::new(4, 16, 4096, 128);
    for g in [DescaleGranularity::PerHead, DescaleGranularity::PerTensor] {
        let c = case(session, "fp8-quantize-slabs", fp8(g, PvFormat::Fp8).name(), &big);
        out.push(finish(c, quantize_case(session, &stream, &big, Dtype::F16, Fp8Format::E4M3, g, false)));
    }
    let p = &shapes()[0];
    let c = case(session, "fp8-entry-errors", fp8(DescaleGranularity::PerHead, PvFormat::Fp8).name(), p);
    out.push(finish(c, entry_errors(session, &stream, p)));
    out
}

fn upload_case(session: &Session, p: &AttentionProblem, prec: Precision) -> anyhow::Result<Option<String>> {
    let plan = session.plan(p, prec, Strategy::Auto)?;
    if !matches!(plan.kernel, KernelId::Native(_)) {
        return Ok(Some(format!("{} is not a native FP8 kernel", plan.kernel_name())));
    }
    let (q, k, v) = quattn::inputs::qkv_k_outlier_channels(p, 0xf8 ^ p.kv_len as u64, 8.0);
    let (q, k, v) = (f16_round(&q), f16_round(&k), f16_round(&v));
    let mut r = session.upload(&plan, &q, &k, &v)?;
    let ops = session.fp8_operands(&r)?.ok_or_else(|| anyhow::anyhow!("a native FP8 plan without device operands"))?;
    let Precision::Fp8 { format, descale, .. } = prec else { unreachable!("an FP8 precision") };
    compare(p, [&ops.q, &ops.k, &ops.v], &reference(p, format, descale, [&q, &k, &v])?)?;
    session.execute(&mut r)?;
    let first = session.download(&r)?;
    session.execute(&mut r)?;
    let second = session.download(&r)?;
    anyhow::ensure!(
        first.o.iter().zip(&second.o).all(|(a, b)| a.to_bits() == b.to_bits()),
        "a second execution of the resident data gives another O"
    );
    anyhow::ensure!(first.o.iter().all(|x| x.is_finite()), "non-finite O");
    Ok(None)
}

/// Uploads `x` as 16-bit `dtype` bits; returns the buffer and the values it holds.
fn upload16(stream: &Arc<CudaStream>, x: &[f32], dtype: Dtype) -> anyhow::Result<(CudaSlice<u16>, Vec<f32>)> {
    let (bits, vals): (Vec<u16>, Vec<f32>) = match dtype {
        Dtype::Bf16 => x.iter().map(|&a| bf16::from_f32(a)).map(|b| (b.to_bits(), b.to_f32())).unzip(),
        _ => x.iter().map(|&a| f16::from_f32(a)).map(|h| (h.to_bits(), h.to_f32())).unzip(),
    };
    Ok((stream.clone_htod(&bits)?, vals))
}

fn raw<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    use quattn::cudarc::driver::DevicePtr;
    s.device_ptr(stream).0
}

#[allow(clippy::too_many_arguments)]
fn quantize_case(
    session: &Session,
    stream: &Arc<CudaStream>,
    p: &AttentionProblem,
    input: Dtype,
    format: Fp8Format,
    g: DescaleGranularity,
    nan: bool,
) -> anyhow::Result<Option<String>> {
    let (q, k, v) = quattn::inputs::qkv_k_outlier_channels(p, 0x51ab ^ p.q_len as u64, 8.0);
    // Ranges that reach the formats' edges: f16 subnormal inputs (K), large values (V); in
    // bf16 tiny Q (its descales are subnormal f32) and huge K.
    let (sq, sk, sv) = if input == Dtype::Bf16 { (1e-37f32, 1e30, 1.0) } else { (1.0, 1e-6, 1000.0) };
    let scaled = |x: &[f32], s: f32| x.iter().map(|&a| a * s).collect::<Vec<f32>>();
    let mut k = scaled(&k, sk);
    if nan {
        k[p.head_dim + 3] = f32::NAN;
    }
    let (dq, q) = upload16(stream, &scaled(&q, sq), input)?;
    let (dk, mut k) = upload16(stream, &k, input)?;
    let (dv, v) = upload16(stream, &scaled(&v, sv), input)?;
    let Some(lens) = quattn::codec::fp8_scaled::descale_counts(p, g) else { anyhow::bail!("per-block granularity") };
    let (mut cq, mut ck, mut cv) = (stream.alloc_zeros::<u8>(p.q_len_elems())?, stream.alloc_zeros::<u8>(p.k_len_elems())?, stream.alloc_zeros::<u8>(p.v_len_elems())?);
    let nan_descales = |n: usize| stream.clone_htod(&vec![f32::NAN; n]);
    let (mut dsq, mut dsk, mut dsv) = (nan_descales(lens[0])?, nan_descales(lens[1])?, nan_descales(lens[2])?);
    // u16 buffers carry the 16-bit bits: hand them over as raw memory of the input type.
    // SAFETY: each holds the problem's elements and lives until the stream is read below.
    unsafe {
        session.quantize_fp8_cuda(
            p,
            format,
            g,
            stream,
            CudaTensor::from_raw(raw(&dq, stream), dq.len(), input),
            CudaTensor::from_raw(raw(&dk, stream), dk.len(), input),
            CudaTensor::from_raw(raw(&dv, stream), dv.len(), input),
            CudaFp8Mut {
                q: CudaCodesMut::new(&mut cq, stream),
                k: CudaCodesMut::new(&mut ck, stream),
                v: CudaCodesMut::new(&mut cv, stream),
                q_descale: CudaTensorMut::new(&mut dsq, stream),
                k_descale: CudaTensorMut::new(&mut dsk, stream),
                v_descale: CudaTensorMut::new(&mut dsv, stream),
            },
        )?;
    }
    let layout = |heads, len| DescaleLayout { granularity: g, batch: p.batch, heads, len, block_rows: 1 };
    let read = |c: &CudaSlice<u8>, d: &CudaSlice<f32>, heads, len| -> anyhow::Result<Fp8Tensor> {
        Ok(Fp8Tensor { format, codes: stream.clone_dtoh(c)?, descales: stream.clone_dtoh(d)?, layout: layout(heads, len) })
    };
    let mut got = [read(&cq, &dsq, p.q_heads, p.q_len)?, read(&ck, &dsk, p.kv_heads, p.kv_len)?, read(&cv, &dsv, p.kv_heads, p.kv_len)?];
    if nan {
        // The codec refuses NaN: compare against K without it, then check its code.
        let at = p.head_dim + 3;
        let code = got[1].codes[at];
        let nan_code = match format {
            Fp8Format::E4M3 => code & 0x7f == 0x7f,
            Fp8Format::E5M2 => code & 0x7f > 0x7c,
        };
        anyhow::ensure!(nan_code, "the NaN element's code is {code:#04x}, not a NaN");
        k[at] = 0.0;
        got[1].codes[at] = 0;
    }
    compare(p, [&got[0], &got[1], &got[2]], &reference(p, format, g, [&q, &k, &v])?)?;
    Ok(None)
}

fn device_case(session: &Session, stream: &Arc<CudaStream>, p: &AttentionProblem, prec: Precision, strategy: Strategy, api: &str) -> anyhow::Result<Option<String>> {
    let plan = match session.plan(p, prec, strategy) {
        Ok(plan) => plan,
        Err(e) => return Ok(Some(e.to_string())),
    };
    if !matches!(plan.kernel, KernelId::Native(_)) {
        return Ok(Some(format!("{} is not a native FP8 kernel", plan.kernel_name())));
    }
    let (q, k, v) = quattn::inputs::qkv(p, 0xde ^ p.kv_len as u64);
    let (q, k, v) = (f16_round(&q), f16_round(&k), f16_round(&v));
    let mut r = session.upload(&plan, &q, &k, &v)?;
    session.execute(&mut r)?;
    let host = session.download(&r)?;
    // NaN bits: an element the kernel skips stays NaN.
    let o = stream.clone_htod(&vec![0x7fffu16; p.o_len_elems()])?;
    let mut lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()])?;
    let o_raw = raw(&o, stream);
    match api {
        "run_cuda" => {
            let (dq, _) = upload16(stream, &q, Dtype::F16)?;
            let (dk, _) = upload16(stream, &k, Dtype::F16)?;
            let (dv, _) = upload16(stream, &v, Dtype::F16)?;
            // SAFETY: f16 bits of the problem's elements, alive until the stream is read below.
            unsafe {
                session.run_cuda(
                    &plan,
                    stream,
                    CudaTensor::from_raw(raw(&dq, stream), dq.len(), Dtype::F16),
                    CudaTensor::from_raw(raw(&dk, stream), dk.len(), Dtype::F16),
                    CudaTensor::from_raw(raw(&dv, stream), dv.len(), Dtype::F16),
                    CudaTensorMut::from_raw(o_raw, o.len(), Dtype::F16),
                    Some(CudaTensorMut::new(&mut lse, stream)),
                )?;
            }
        }
        _ => {
            let ops = session.fp8_operands(&r)?.ok_or_else(|| anyhow::anyhow!("no device operands"))?;
            let up = |c: &[u8]| stream.clone_htod(c);
            let (cq, ck, cv) = (up(&ops.q.codes)?, up(&ops.k.codes)?, up(&ops.v.codes)?);
            let d = |x: &[f32]| stream.clone_htod(x);
            let (sq, sk, sv) = (d(&ops.q.descales)?, d(&ops.k.descales)?, d(&ops.v.descales)?);
            let x = CudaFp8 {
                q: CudaCodes::new(&cq, stream),
                k: CudaCodes::new(&ck, stream),
                v: CudaCodes::new(&cv, stream),
                q_descale: CudaTensor::new(&sq, stream),
                k_descale: CudaTensor::new(&sk, stream),
                v_descale: CudaTensor::new(&sv, stream),
            };
            // SAFETY: f16 O of the problem's elements, alive until the stream is read below.
            unsafe { session.run_cuda_fp8(&plan, stream, x, CudaTensorMut::from_raw(o_raw, o.len(), Dtype::F16), Some(CudaTensorMut::new(&mut lse, stream)))? };
        }
    }
    let o_bits = stream.clone_dtoh(&o)?;
    let lse = stream.clone_dtoh(&lse)?;
    let o: Vec<f32> = o_bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
    anyhow::ensure!(o.len() == host.o.len() && o.iter().zip(&host.o).all(|(a, b)| a.to_bits() == b.to_bits()), "O differs from the host path");
    let host_lse = host.lse.unwrap_or_default();
    anyhow::ensure!(lse.iter().zip(&host_lse).all(|(a, b)| a.to_bits() == b.to_bits()), "LSE differs from the host path");
    Ok(None)
}

/// Typed refusals of `run_cuda_fp8`: a descale buffer of another length, an f16 plan.
fn entry_errors(session: &Session, stream: &Arc<CudaStream>, p: &AttentionProblem) -> anyhow::Result<Option<String>> {
    let plan = session.plan(p, fp8(DescaleGranularity::PerHead, PvFormat::Fp8), Strategy::Auto)?;
    if !matches!(plan.kernel, KernelId::Native(_)) {
        return Ok(Some(format!("{} is not a native FP8 kernel", plan.kernel_name())));
    }
    let [nq, nk, nv] = plan.fp8_descale_lens().ok_or_else(|| anyhow::anyhow!("no descale lengths for a native FP8 plan"))?;
    let codes = stream.alloc_zeros::<u8>(p.q_len_elems().max(p.k_len_elems()))?;
    let (dq, dk, dv) = (stream.clone_htod(&vec![1.0f32; nq])?, stream.clone_htod(&vec![1.0f32; nk + 1])?, stream.clone_htod(&vec![1.0f32; nv])?);
    let mut o = stream.alloc_zeros::<f16>(p.o_len_elems())?;
    let mut lse = stream.alloc_zeros::<f32>(p.lse_len_elems())?;
    fn x<'a>(codes: &'a CudaSlice<u8>, d: [&'a CudaSlice<f32>; 3], stream: &'a Arc<CudaStream>) -> CudaFp8<'a> {
        CudaFp8 {
            q: CudaCodes::new(codes, stream),
            k: CudaCodes::new(codes, stream),
            v: CudaCodes::new(codes, stream),
            q_descale: CudaTensor::new(d[0], stream),
            k_descale: CudaTensor::new(d[1], stream),
            v_descale: CudaTensor::new(d[2], stream),
        }
    }
    let err = session.run_cuda_fp8(&plan, stream, x(&codes, [&dq, &dk, &dv], stream), CudaTensorMut::new(&mut o, stream), Some(CudaTensorMut::new(&mut lse, stream))).err();
    anyhow::ensure!(matches!(err, Some(Error::Descales { tensor: TensorName::K, .. })), "K descales of length {} accepted: {err:?}", nk + 1);
    // A plan that reads no FP8 codes (the emulation: nothing to compile).
    let f16_plan = session.plan(p, Precision::F16_DEFAULT, Strategy::Reference)?;
    let err = session.run_cuda_fp8(&f16_plan, stream, x(&codes, [&dq, &dv, &dv], stream), CudaTensorMut::new(&mut o, stream), Some(CudaTensorMut::new(&mut lse, stream))).err();
    anyhow::ensure!(matches!(err, Some(Error::EntryPoint { .. })), "an f16 plan through run_cuda_fp8: {err:?}");
    Ok(None)
}
