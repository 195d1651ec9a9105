//! Paged KV cache on a CUDA GPU: the native paged decode variants (`fwd_decode_paged_*`) against
//! the f64 reference at every page size, ragged lengths (an empty sequence, one shorter than a
//! page), GQA, causal chunks, prefills of more query rows than one tile packs (row blocks, with
//! and without score modifiers), f16 and bf16; the device-tensor path bit-identical to the host
//! path; the `append_kv` kernel bit-exact with `PagedKv::append` and flagging a missing page;
//! and the time of paged decode against the contiguous cache at the decode shape
//! (batch 8, 32 q heads over 8 KV heads, q_len 1, kv 32k, head dim 128, f16).
//!
//! `paged_check [--check | --bench | --sanitize]` (default: check, then bench). `--sanitize`
//! runs a few small launches of every kernel kind, for `compute-sanitizer --tool memcheck`.
//! Prints why it skips without a CUDA GPU; exits non-zero on any wrong result.
use half::{bf16, f16};
use quattn::cudarc::driver::{CudaContext, DevicePtrMut};
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{inputs, AttentionProblem, CudaTensor, CudaTensorMut, Device, HostSlice, PagedKv, Precision, Session, Strategy, PAGE_SIZES};
use quattn_native::append_kv::{AppendKvArgs, AppendKvPtrs};
use quattn_native::AppendKvKernel;

type BoxErr = Box<dyn std::error::Error>;

/// Plans `p` (which must land on a paged decode variant), runs it on the host path and checks
/// O and LSE against the f64 reference; rows of empty sequences must be O = 0, LSE = -inf.
fn check_case(s: &Session, p: &AttentionProblem, precision: Precision, seed: u64) -> Result<bool, BoxErr> {
    let plan = s.plan(p, precision, Strategy::Auto)?;
    if !plan.kernel_name().starts_with("fwd_decode_paged") {
        println!("FAIL {} planned {}", describe(p), plan.kernel_name());
        return Ok(false);
    }
    let (q, k, v) = inputs::qkv(p, seed);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = s.run(&plan, &q, &k, &v)?;
    let r = quattn::reference::attention_f64(p, &q, &k, &v)?;
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    let lse = out.lse.as_ref().ok_or("no LSE")?;
    let lse_ok = compare_lse(lse, &r.lse).is_some_and(|l| l.max_abs <= tol.max_abs_rel);
    let pg = p.paged.as_ref().ok_or("not paged")?;
    let mut empty_ok = true;
    for b in (0..p.batch).filter(|&b| pg.seq_len(b) == 0) {
        for h in 0..p.q_heads {
            for i in 0..p.q_len {
                empty_ok &= lse[(b * p.q_heads + h) * p.q_len + i] == f32::NEG_INFINITY;
                empty_ok &= out.o[p.o_strides().offset(b, h, i)..][..p.v_head_dim].iter().all(|&x| x == 0.0);
            }
        }
    }
    let ok = tol.accepts(&m, ref_max) && lse_ok && empty_ok;
    println!(
        "{} {:34} {:5} {} | rel-L2 {:.2e} max-abs {:.2e} lse {} empty rows {}",
        if ok { "ok  " } else { "FAIL" },
        plan.kernel_name(),
        precision.name(),
        describe(p),
        m.rel_l2,
        m.max_abs,
        if lse_ok { "ok" } else { "BAD" },
        if empty_ok { "ok" } else { "BAD" }
    );
    Ok(ok)
}

fn describe(p: &AttentionProblem) -> String {
    let pg = p.paged.as_ref().map(|x| (x.page_size, x.seq_lens.to_vec())).unwrap_or_default();
    format!("b{} h{}/{} q{} d{}{} ps{} lens {:?}", p.batch, p.q_heads, p.kv_heads, p.q_len, p.head_dim, if p.causal { " causal" } else { "" }, pg.0, pg.1)
}

/// The cases of one page size.
fn cases(ps: usize, seed: u64) -> Vec<AttentionProblem> {
    let pk = |lens: &[usize], s: u64| inputs::paged_kv(ps, lens, 1, 2, seed + s);
    vec![
        AttentionProblem::new(5, 8, 1, 128).kv_heads(2).with_lse(true).paged_kv(pk(&[ps * 3 + 5, 1, 0, 2 * ps, 777], 0)),
        AttentionProblem::new(3, 8, 4, 64).kv_heads(2).causal(true).with_lse(true).paged_kv(pk(&[2 * ps + 3, 3, 1500], 1)),
        AttentionProblem::new(3, 32, 1, 128).kv_heads(8).with_lse(true).paged_kv(pk(&[4096, 100, 2049], 2)),
        AttentionProblem::new(2, 4, 16, 128).kv_heads(1).causal(true).layout(quattn::Layout::Bshd).with_lse(true).paged_kv(pk(&[5000, 9], 3)),
        // Prefills: 4 x 100 rows per KV head (row blocks spanning two heads), one sequence
        // shorter than q_len (its first positions see no key); 3 x 90 rows with a window, sinks
        // and softcap.
        AttentionProblem::new(2, 8, 100, 128).kv_heads(2).causal(true).with_lse(true).paged_kv(pk(&[700 + ps, 60], 4)),
        AttentionProblem::new(2, 3, 90, 64)
            .kv_heads(1)
            .causal(true)
            .window(40, 0)
            .softcap(20.0)
            .sinks(vec![0.5f32, -1.0, 2.0])
            .with_lse(true)
            .paged_kv(pk(&[1000, 3 * ps + 1], 5)),
    ]
}

/// The device-tensor path (`run_cuda` on caller buffers, O poisoned with NaN bits) gives the
/// host path's O bit for bit.
fn check_device_tensors(s: &Session, ctx: &std::sync::Arc<CudaContext>) -> Result<bool, BoxErr> {
    let p = cases(16, 40).swap_remove(0);
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto)?;
    let (q, k, v) = inputs::qkv(&p, 41);
    let h = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let (q, k, v) = (h(&q), h(&k), h(&v));
    let stream = ctx.new_stream()?;
    let (dq, dk, dv) = (stream.clone_htod(&q)?, stream.clone_htod(&k)?, stream.clone_htod(&v)?);
    let mut d_o = stream.clone_htod(&vec![f16::NAN; p.o_len_elems()])?;
    let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()])?;
    s.run_cuda(&plan, &stream, CudaTensor::new(&dq, &stream), CudaTensor::new(&dk, &stream), CudaTensor::new(&dv, &stream), CudaTensorMut::new(&mut d_o, &stream), Some(CudaTensorMut::new(&mut d_lse, &stream)))?;
    let o = stream.clone_dtoh(&d_o)?;
    let host = s.run(&plan, &q, &k, &v)?;
    let same = o.iter().zip(&host.o).all(|(a, b)| a.to_f32().to_bits() == b.to_bits());
    println!("{} device-tensor path bit-identical to the host path ({})", if same { "ok  " } else { "FAIL" }, plan.kernel_name());
    Ok(same)
}

/// `append_kv` on the device against `PagedKv::append` on the host (bit-exact), then a table
/// with a missing page: the status flag is set and nothing outside the pool is written.
fn check_append(ctx: &std::sync::Arc<CudaContext>) -> Result<bool, BoxErr> {
    let kernel = AppendKvKernel::load(ctx)?;
    let stream = ctx.default_stream();
    let (hk, d, dv, new_tokens) = (4usize, 128usize, 64usize, 37usize);
    let lens = [0usize, 5, 16, 100];
    let finals: Vec<usize> = lens.iter().map(|n| n + new_tokens).collect();
    let mut ok = true;
    for ps in PAGE_SIZES {
        let full = inputs::paged_kv(ps, &finals, 1, 2, ps as u64);
        let cache = PagedKv::new(ps, full.num_pages, full.block_table.clone(), lens.iter().map(|&n| n as i32).collect::<Vec<_>>());
        let bits = |n: usize, seed: u64| inputs::normal_with_outliers(n, seed).into_iter().map(bf16::from_f32).collect::<Vec<bf16>>();
        let same_bits = |a: &[bf16], b: &[bf16]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let (mut k, mut v) = (bits(cache.pool_elems(hk, d), 1), bits(cache.pool_elems(hk, dv), 2));
        let (k_new, v_new) = (bits(lens.len() * new_tokens * hk * d, 3), bits(lens.len() * new_tokens * hk * dv, 4));
        let (mut dk, mut dvv) = (stream.clone_htod(&k)?, stream.clone_htod(&v)?);
        let (mut dkn, mut dvn) = (stream.clone_htod(&k_new)?, stream.clone_htod(&v_new)?);
        let mut table = stream.clone_htod(&cache.block_table.to_vec())?;
        let mut seq = stream.clone_htod(&cache.seq_lens.to_vec())?;
        let mut status = stream.alloc_zeros::<u32>(1)?;
        let args = AppendKvArgs { batch: lens.len(), new_tokens, kv_heads: hk, head_dim: d, v_head_dim: dv, page_size: ps, max_pages: cache.max_pages, num_pages: cache.num_pages };
        let ptrs = AppendKvPtrs {
            k_pool: dk.device_ptr_mut(&stream).0,
            v_pool: dvv.device_ptr_mut(&stream).0,
            k_new: dkn.device_ptr_mut(&stream).0,
            v_new: dvn.device_ptr_mut(&stream).0,
            block_table: table.device_ptr_mut(&stream).0,
            seq_lens: seq.device_ptr_mut(&stream).0,
            status: status.device_ptr_mut(&stream).0,
        };
        // SAFETY: every buffer was allocated above for these sizes.
        unsafe { kernel.launch_raw(&stream, &args, &ptrs) }?;
        let (gk, gv, st) = (stream.clone_dtoh(&dk)?, stream.clone_dtoh(&dvv)?, stream.clone_dtoh(&status)?);
        cache.append(hk, d, dv, &mut k, &mut v, &k_new, &v_new, new_tokens)?;
        let same = same_bits(&gk, &k) && same_bits(&gv, &v) && st[0] == 0;
        // A missing page: the last sequence's table row cleared.
        let mut bad = cache.block_table.to_vec();
        for e in &mut bad[(lens.len() - 1) * cache.max_pages..] {
            *e = -1;
        }
        let mut bad_table = stream.clone_htod(&bad)?;
        let before = stream.clone_dtoh(&dk)?;
        let ptrs = AppendKvPtrs { block_table: bad_table.device_ptr_mut(&stream).0, ..ptrs };
        // SAFETY: as above.
        unsafe { kernel.launch_raw(&stream, &args, &ptrs) }?;
        let (st, after) = (stream.clone_dtoh(&status)?, stream.clone_dtoh(&dk)?);
        let flagged = st[0] == 1 && same_bits(&after, &before); // the other sequences rewrote the same values
        println!("{} append_kv page size {ps}: bit-exact with PagedKv::append {same}, missing page flagged {flagged}", if same && flagged { "ok  " } else { "FAIL" });
        ok &= same && flagged;
    }
    Ok(ok)
}

/// Median device milliseconds of `p` (resident inputs), and its O against the f64 reference.
fn time_case(s: &Session, p: &AttentionProblem, check: bool) -> Result<(f64, String, Option<f64>), BoxErr> {
    let plan = s.plan(p, Precision::F16_DEFAULT, Strategy::Auto)?;
    let (q, k, v) = inputs::qkv(p, 7);
    let h = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let (q, k, v) = (h(&q), h(&k), h(&v));
    let mut r = s.upload(&plan, &q, &k, &v)?;
    let mut t = s.time(&mut r, 10, 50)?;
    t.sort_by(|a, b| a.total_cmp(b));
    let err = if check {
        let out = s.download(&r)?;
        let w = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
        let reference = quattn::reference::attention_f64(p, &w(&q), &w(&k), &w(&v))?;
        Some(ErrorMetrics::compare(&out.o, &reference.o).rel_l2)
    } else {
        None
    };
    Ok((t[t.len() / 2], plan.kernel_name(), err))
}

fn bench(s: &Session) -> Result<bool, BoxErr> {
    let (batch, kv) = (8usize, 32768usize);
    let base = AttentionProblem::new(batch, 32, 1, 128).kv_heads(8);
    let bytes = 2.0 * (batch * 8 * kv * 128 * 2) as f64;
    let tol = Tolerance::for_precision(Precision::F16_DEFAULT).max_rel_l2;
    let (ms0, name0, e0) = time_case(s, &base.clone().kv_len(kv), true)?;
    println!("contiguous  {name0:34} {ms0:.4} ms  {:.0} GB/s  rel-L2 {:.2e}", bytes / ms0 / 1e6, e0.unwrap_or(f64::NAN));
    let mut ok = e0.is_some_and(|e| e <= tol);
    for ps in [16usize, 64, 256] {
        let p = base.clone().paged_kv(inputs::paged_kv(ps, &vec![kv; batch], 0, 0, ps as u64));
        let (ms, name, e) = time_case(s, &p, true)?;
        let good = e.is_some_and(|e| e <= tol);
        ok &= good;
        println!(
            "paged ps{ps:<4} {name:34} {ms:.4} ms  {:.0} GB/s  {:+.1}% vs contiguous  rel-L2 {:.2e} {}",
            bytes / ms / 1e6,
            (ms / ms0 - 1.0) * 100.0,
            e.unwrap_or(f64::NAN),
            if good { "" } else { "FAIL" }
        );
    }
    Ok(ok)
}

/// Small launches of every paged kernel kind (one split and several, f16 and bf16, both head
/// dims, the smallest and largest page) and append_kv, for compute-sanitizer.
fn sanitize(s: &Session, ctx: &std::sync::Arc<CudaContext>) -> Result<bool, BoxErr> {
    let mut ok = true;
    for (precision, ps) in [(Precision::F16_DEFAULT, 16usize), (Precision::BF16_DEFAULT, 256)] {
        let pk = |lens: &[usize]| inputs::paged_kv(ps, lens, 1, 2, 3);
        for p in [
            AttentionProblem::new(3, 8, 1, 128).kv_heads(2).with_lse(true).paged_kv(pk(&[2000, 0, 17])),
            AttentionProblem::new(2, 8, 4, 64).kv_heads(2).causal(true).with_lse(true).paged_kv(pk(&[3000, 5])),
            AttentionProblem::new(2, 4, 40, 128).kv_heads(1).causal(true).with_lse(true).paged_kv(pk(&[900, 30])),
        ] {
            ok &= check_case(s, &p, precision, 5)?;
        }
    }
    ok &= check_device_tensors(s, ctx)?;
    ok &= check_append(ctx)?;
    Ok(ok)
}

fn main() -> Result<(), BoxErr> {
    let session = match Session::new(Device::Cuda(0)) {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let ctx = CudaContext::new(0)?;
    println!("{}", session.info().adapter);
    let mode = std::env::args().nth(1).unwrap_or_default();
    let mut ok = true;
    if mode == "--sanitize" {
        ok &= sanitize(&session, &ctx)?;
    } else {
        if mode != "--bench" {
            for (i, ps) in PAGE_SIZES.into_iter().enumerate() {
                for p in cases(ps, 10 * i as u64) {
                    for precision in [Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
                        ok &= check_case(&session, &p, precision, 100 + i as u64)?;
                    }
                }
            }
            ok &= check_device_tensors(&session, &ctx)?;
            ok &= check_append(&ctx)?;
        }
        if mode != "--check" {
            ok &= bench(&session)?;
        }
    }
    if !ok {
        return Err("paged_check: wrong results (FAIL lines above)".into());
    }
    println!("all paged checks passed");
    Ok(())
}
