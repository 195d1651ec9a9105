//! `quattn selftest`: every precision × shape class on every device present, each against the
//! f64 reference with the precision's tolerance. Unsupported pairs are listed as skipped with the
//! library's reason; any failure makes the exit status non-zero.

use indicatif::{ProgressBar, ProgressStyle};
use quattn::{AttentionProblem, CausalAlign, Device, Error, Family, Layout, Precision, Session, Strategy, VarLen};
use serde::Serialize;

use crate::args::{DeviceArg, SelftestArgs};
use crate::check::{self, Accuracy};
use crate::run::Shape;

#[derive(Serialize)]
pub(crate) struct Case {
    pub(crate) device: String,
    pub(crate) adapter: String,
    pub(crate) strategy: String,
    pub(crate) precision: String,
    pub(crate) kernel: Option<String>,
    pub(crate) shape: Shape,
    pub(crate) status: &'static str,
    pub(crate) accuracy: Option<Accuracy>,
    /// rel-L2 of the kernel's O against the CPU emulation of the same mode (which rounds where
    /// the kernel rounds); must stay within the mode's tolerance.
    pub(crate) vs_emulation_rel_l2: Option<f64>,
    pub(crate) reason: Option<String>,
    /// Fuzz cases: the largest error / tolerance of the case's checks (`quattn::fuzz`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_over_tolerance: Option<f64>,
}

/// Shape classes: single query row, GQA with ragged lengths, causal with q_len > kv_len, both
/// layouts, every head dim the kernels know, a decode shape.
pub fn shapes(quick: bool) -> Vec<AttentionProblem> {
    let mut v = vec![
        AttentionProblem::new(1, 2, 1, 64).kv_len(77),
        AttentionProblem::new(1, 8, 17, 64).kv_heads(2).kv_len(45).causal(true),
        AttentionProblem::new(2, 4, 127, 32).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 300, 128).kv_len(200).causal(true),
        AttentionProblem::new(1, 2, 64, 96).kv_len(130),
        AttentionProblem::new(1, 1, 33, 256).kv_len(65).layout(Layout::Bshd),
        // Decode: a GQA group of 4 at 3 positions against a ragged cache, causal, BSHD (the
        // split-KV decode kernel on CUDA).
        AttentionProblem::new(2, 8, 3, 128).kv_heads(2).kv_len(1500).causal(true).layout(Layout::Bshd),
        // Paged KV: shuffled pages of 16 keys, ragged lengths (one shorter than a page), a
        // decode step over GQA (the paged decode kernels: native on CUDA, portable on wgpu).
        AttentionProblem::new(3, 8, 1, 128).kv_heads(2).paged_kv(quattn::inputs::paged_kv(16, &[1000, 9, 333], 1, 2, 7)),
    ];
    if !quick {
        v.push(AttentionProblem::new(2, 8, 256, 128).kv_heads(1).causal(true));
        v.push(AttentionProblem::new(1, 4, 513, 64).kv_len(1031).layout(Layout::Bshd));
        // Paged, pages of 256 keys, a causal chunk of 4 positions, BSHD.
        v.push(AttentionProblem::new(2, 8, 4, 64).kv_heads(2).causal(true).layout(Layout::Bshd).paged_kv(quattn::inputs::paged_kv(256, &[700, 260], 0, 1, 8)));
    }
    v.into_iter().map(|p| p.with_lse(true)).collect()
}

/// Score-modifier classes (every modifier, combinations, both alignments, rows that see no key),
/// at the head dims the native kernels take; run with the float precisions only.
pub fn modifier_shapes() -> Vec<AttentionProblem> {
    let slopes = AttentionProblem::standard_alibi_slopes(8);
    let sinks: Vec<f32> = (0..8).map(|h| 0.75 * h as f32 - 2.0).collect();
    vec![
        AttentionProblem::new(1, 8, 200, 64).kv_heads(2).kv_len(333).causal(true).window(40, 0),
        AttentionProblem::new(2, 8, 130, 128).kv_heads(4).kv_len(300).window(64, 17).softcap(20.0).layout(Layout::Bshd),
        AttentionProblem::new(1, 8, 300, 128).kv_len(200).causal(true).causal_align(CausalAlign::TopLeft).sinks(sinks.clone()).alibi_slopes(slopes.clone()),
        AttentionProblem::new(1, 8, 90, 64).kv_len(40).window(5, 0).sinks(sinks),
    ]
    .into_iter()
    .map(|p| p.with_lse(true))
    .collect()
}

/// Variable-length batch classes (ragged packed sequences, an empty query sequence, a sequence
/// without keys, q_len above and below kv_len, GQA, causal and not, with a modifier), at the
/// head dims the native varlen variants take; run with the float precisions only.
pub fn varlen_shapes() -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(1, 8, 1, 128).kv_heads(2).causal(true).varlen(VarLen::from_lengths(&[300, 1, 0, 129], &[300, 40, 7, 500])),
        AttentionProblem::new(1, 4, 1, 64).varlen(VarLen::from_lengths(&[65, 700, 3], &[129, 0, 64])),
        AttentionProblem::new(1, 8, 1, 64).kv_heads(4).causal(true).window(32, 0).varlen(VarLen::from_lengths(&[90, 17], &[200, 17])),
    ]
    .into_iter()
    .map(|p| p.with_lse(true))
    .collect()
}

fn devices(a: &SelftestArgs) -> Vec<Device> {
    let wanted: Vec<DeviceArg> = if a.devices.is_empty() { vec![DeviceArg::Cpu, DeviceArg::Wgpu, DeviceArg::Cuda, DeviceArg::Hip] } else { a.devices.clone() };
    wanted
        .into_iter()
        .filter_map(|d| match d {
            DeviceArg::Auto => Some(Device::Auto),
            DeviceArg::Cpu => Some(Device::Cpu),
            DeviceArg::Wgpu => Some(Device::Wgpu(quattn::WgpuAdapter::Default)),
            DeviceArg::WgpuSpirv => Some(Device::WgpuSpirv(quattn::WgpuAdapter::Default)),
            DeviceArg::Cuda => Some(Device::Cuda(0)),
            DeviceArg::Hip => Some(Device::Hip(0)),
        })
        .collect()
}

pub fn main(a: &SelftestArgs) -> anyhow::Result<i32> {
    let shapes = shapes(a.quick);
    let mod_shapes = modifier_shapes();
    let varlen_shapes = varlen_shapes();
    let precisions = Precision::all_named();
    let mut cases = Vec::new();
    let mut sessions = Vec::new();
    for d in devices(a) {
        match Session::new(d) {
            Ok(s) => sessions.push(s),
            Err(e) => eprintln!("selftest: skipping {d}: {e}"),
        }
    }
    // Auto, then every family of the kernel registry forced on its own (a family the device
    // lacks is a refused plan, reported as a skip with the registry's reason), then the
    // emulation.
    let strategies_of = |_: &Session| -> Vec<Strategy> {
        let mut v = vec![Strategy::Auto];
        v.extend(Family::ALL.iter().filter_map(|f| match *f {
            Family::Native(k) => Some(Strategy::Native(k)),
            Family::Portable(k) => Some(Strategy::PortableFamily(k)),
            Family::Cpu | Family::Emulation => None,
        }));
        v.push(Strategy::Reference);
        v
    };
    // The case groups `--only` selects from.
    let group = |name: &str| a.only.as_deref().is_none_or(|o| name.contains(o));
    // Every (session, strategy, shape, precision) in a fixed order; a shard keeps every N-th.
    // The emulation is device-independent: it runs once, on the first session.
    let (shard, shards) = a.shard.unwrap_or((0, 1));
    let mut jobs = Vec::new();
    for (si, session) in sessions.iter().enumerate().filter(|_| !a.no_matrix && group("matrix")) {
        for strategy in strategies_of(session) {
            if strategy == Strategy::Reference && si > 0 {
                continue;
            }
            for p in &shapes {
                for &prec in &precisions {
                    jobs.push((si, strategy, p, prec));
                }
            }
        }
    }
    // The score modifiers: every family forced (one without them refuses by name: a skip) and
    // Auto, in the float modes (the emulations and quantized kernels do not model them).
    for (si, session) in sessions.iter().enumerate().filter(|_| !a.no_matrix && group("mods")) {
        for strategy in strategies_of(session).into_iter().filter(|s| *s != Strategy::Reference) {
            for p in &mod_shapes {
                for prec in [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
                    jobs.push((si, strategy, p, prec));
                }
            }
        }
    }
    // Variable-length batches: every family forced (one without varlen kernels refuses by
    // name: a skip) and Auto, in the float modes.
    for (si, session) in sessions.iter().enumerate().filter(|_| !a.no_matrix && group("varlen")) {
        for strategy in strategies_of(session).into_iter().filter(|s| *s != Strategy::Reference) {
            for p in &varlen_shapes {
                for prec in [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
                    jobs.push((si, strategy, p, prec));
                }
            }
        }
    }
    let jobs: Vec<_> = jobs.into_iter().enumerate().filter(|(i, _)| i % shards == shard).map(|(_, j)| j).collect();
    let bar = ProgressBar::new(jobs.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    for (si, strategy, p, prec) in jobs {
        let session = &sessions[si];
        bar.set_message(format!("{} {:?} {}", session.info().kind, strategy, prec));
        let case = run_case(session, p, prec, strategy);
        if a.json {
            bar.suspend(|| println!("{}", serde_json::to_string(&case).unwrap_or_default()));
        }
        cases.push(case);
        bar.inc(1);
    }
    bar.finish_and_clear();
    // The reliability cases (`--fuzz N`): generator cases, the NaN policy and determinism on
    // every family, dealt by the same shard rule.
    if let Some(n) = a.fuzz {
        for case in crate::reliability::cases(&sessions, n, a.fuzz_seed, (shard, shards), a.json) {
            cases.push(case);
        }
    }
    // The native INT8 prepass against the codec, bit for bit (only the CUDA backend keeps the
    // operands; elsewhere `int8_operands` is None and nothing is added).
    for session in sessions.iter().filter(|s| s.info().kind == "cuda" && shard == 0 && !a.no_matrix && group("int8-prepass")) {
        for case in prepass_cases(session) {
            if a.json {
                println!("{}", serde_json::to_string(&case).unwrap_or_default());
            }
            cases.push(case);
        }
    }
    // The native FP8 group: device quantization against the codec, the CUDA device-tensor
    // entry points against the host path.
    for session in sessions.iter().filter(|s| s.info().kind == "cuda" && shard == 2 % shards && !a.no_matrix && group("fp8")) {
        for case in crate::selftest_fp8::cases(session) {
            if a.json {
                println!("{}", serde_json::to_string(&case).unwrap_or_default());
            }
            cases.push(case);
        }
    }
    // The device-tensor entry points on every GPU session: caller-held buffers in, O out on
    // the device, bit-identical to the host path.
    for session in sessions.iter().filter(|_| shard == 1 % shards && !a.no_matrix && group("device-tensors")) {
        for case in device_tensor_cases(session) {
            if a.json {
                println!("{}", serde_json::to_string(&case).unwrap_or_default());
            }
            cases.push(case);
        }
    }
    let failed: Vec<&Case> = cases.iter().filter(|c| c.status == "fail").collect();
    let passed = cases.iter().filter(|c| c.status == "pass").count();
    let skipped = cases.len() - passed - failed.len();
    if !a.json {
        for c in &failed {
            println!(
                "FAIL {} {} {} {:?}: {}",
                c.device,
                c.strategy,
                c.precision,
                (c.shape.batch, c.shape.heads, c.shape.kv_heads, c.shape.seq, c.shape.kv_seq, c.shape.head_dim, c.shape.causal),
                c.reason.as_deref().unwrap_or("")
            );
        }
        let mut by: std::collections::BTreeMap<(String, String), (usize, usize, usize)> = Default::default();
        for c in &cases {
            let e = by.entry((c.device.clone(), c.strategy.clone())).or_default();
            match c.status {
                "pass" => e.0 += 1,
                "fail" => e.1 += 1,
                _ => e.2 += 1,
            }
        }
        for ((dev, strat), (p, f, s)) in by {
            println!("{dev:<6} {strat:<10} {p} passed, {f} failed, {s} skipped");
        }
    }
    println!("selftest: {passed} passed, {} failed, {skipped} skipped", failed.len());
    Ok(if failed.is_empty() { 0 } else { 1 })
}

fn run_case(session: &Session, p: &AttentionProblem, prec: Precision, strategy: Strategy) -> Case {
    let info = session.info();
    let mut case = Case {
        device: info.kind.into(),
        adapter: info.adapter,
        strategy: format!("{strategy:?}"),
        precision: prec.name(),
        kernel: None,
        shape: Shape::of(p),
        status: "skip",
        accuracy: None,
        vs_emulation_rel_l2: None,
        reason: None,
        error_over_tolerance: None,
    };
    let plan = match session.plan(p, prec, strategy) {
        Ok(plan) => plan,
        Err(
            e @ (Error::UnsupportedPrecision { .. }
            | Error::UnsupportedHeadDim { .. }
            | Error::UnsupportedStrategy { .. }
            | Error::UnsupportedVHeadDim { .. }
            | Error::UnsupportedFeature { .. }
            | Error::UnsupportedPagedKv { .. }
            | Error::UnsupportedVarLen { .. }),
        ) => {
            case.reason = Some(e.to_string());
            return case;
        }
        Err(e) => {
            case.status = "fail";
            case.reason = Some(format!("plan: {e}"));
            return case;
        }
    };
    case.kernel = Some(plan.kernel_name());
    let (q, k, v) = check::inputs(p, prec, 0x5e1f ^ (p.q_len as u64 * 131 + p.head_dim as u64));
    let result = session.run(&plan, &q, &k, &v).map_err(anyhow::Error::from).and_then(|out| {
        let acc = check::check(p, prec, &q, &k, &v, &out)?;
        // The emulations model neither score modifiers, paged K/V nor variable-length batches
        // (they refuse all three).
        let vs_emu = if strategy == Strategy::Reference || p.has_modifiers() || p.paged.is_some() || p.varlen.is_some() {
            None
        } else {
            // The plan's blocking: the INT8 scale layout follows the kernel's tiles.
            let emu = quattn::emulation::emulate(p, prec, &plan.blocking.unwrap_or_default(), &q, &k, &v)?;
            let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
            Some(quattn::metrics::ErrorMetrics::compare(&out.o, &e).rel_l2)
        };
        Ok((acc, vs_emu))
    });
    match result {
        Ok((acc, vs_emu)) => {
            case.status = if acc.passed { "pass" } else { "fail" };
            case.reason = acc.failure.clone();
            let tol = quattn::metrics::Tolerance::for_precision(prec).max_rel_l2;
            if let Some(r) = vs_emu {
                if !(r <= tol) {
                    case.status = "fail";
                    case.reason.get_or_insert_with(|| format!("O differs from the CPU emulation of {prec}: rel_l2 {r:.3e} > {tol:.1e}"));
                }
            }
            case.vs_emulation_rel_l2 = vs_emu;
            case.accuracy = Some(acc);
        }
        Err(e) => {
            case.status = "fail";
            case.reason = Some(format!("{e:#}"));
        }
    }
    case
}

/// The native INT8 prepass's codes, scales, mean and LSE shift against `codec::int8` with
/// `verify_operands` (bit for bit; the f64 mean within one f32 rounding), for every granularity
/// with and without smoothing, on the s8 wgmma blocking (Auto on an H100) and the IMMA one, a
/// GQA BHSD shape with ragged lengths and a BSHD one, K with +8σ outlier channels, and both
/// head dims on inputs whose every row takes the exact-division path (`-ties`); with FP8 P·V
/// (Auto: the s8 wgmma kernel's e4m3 P·V variant on an H100) also the e4m3 V codes and scales
/// with `verify_v_operands`. Strategy name `prepass-<strategy>`.
fn prepass_cases(session: &Session) -> Vec<Case> {
    use quattn::codec::int8::{verify_operands, verify_v_operands, DeviceSums, Int8ScaleLayout};
    use quattn::{Int8Granularity, PvFormat};
    // The third input puts every Q element and every unsmoothed K element on a tie of the
    // codec's rounding: each row's amax is 889 (scale 7) and its other elements 7 (n + 1/2),
    // so every row takes the prepass's exact-division path, where the product with fl(1/7)
    // would round about 30% of the ties the wrong way.
    let shapes = [
        (AttentionProblem::new(2, 8, 300, 128).kv_heads(2).kv_len(777), false),
        (AttentionProblem::new(1, 4, 129, 64).kv_len(1000).layout(Layout::Bshd), false),
        (AttentionProblem::new(1, 4, 200, 128).kv_heads(2).kv_len(300), true),
        (AttentionProblem::new(1, 4, 129, 64).kv_len(200).layout(Layout::Bshd), true),
    ];
    let info = session.info();
    let mut out = Vec::new();
    for (p, ties) in shapes {
        let (mut q, mut k, v) = quattn::inputs::qkv_k_outlier_channels(&p, 0x9a55 ^ p.kv_len as u64, 8.0);
        if ties {
            let d = p.head_dim;
            for x in [&mut q, &mut k] {
                for (i, e) in x.iter_mut().enumerate() {
                    // A row's channel (row mod d) is ±889; the rest 7 (n + 1/2), |n + 1/2| < 127
                    // (exact in f16).
                    let (row, ch) = (i / d, i % d);
                    *e = if ch == row % d { if row % 2 == 0 { 889.0 } else { -889.0 } } else { 7.0 * ((*e * 40.0).round().clamp(-126.0, 125.0) + 0.5) };
                }
            }
        }
        // INT8 plans upload f16: check against what the device read.
        let f16 = |x: &[f32]| quattn::codec::float16::round_f16_vec(x);
        let (q, k, v) = (f16(&q), f16(&k), f16(&v));
        let runs = [(Strategy::Auto, PvFormat::F16), (Strategy::Native(quattn::NativeKind::Int8Imma), PvFormat::F16), (Strategy::Auto, PvFormat::Fp8)];
        for (strategy, pv) in runs {
            for granularity in [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread] {
                for smooth_k in [false, true] {
                    let prec = Precision::Int8Qk { granularity, smooth_k, pv };
                    let mut case = Case {
                        device: info.kind.into(),
                        adapter: info.adapter.clone(),
                        strategy: format!("prepass-{strategy:?}{}", if ties { "-ties" } else { "" }),
                        precision: prec.name(),
                        kernel: None,
                        shape: Shape::of(&p),
                        status: "fail",
                        accuracy: None,
                        vs_emulation_rel_l2: None,
                        reason: None,
                        error_over_tolerance: None,
                    };
                    let result = (|| -> anyhow::Result<Option<()>> {
                        let plan = match session.plan(&p, prec, strategy) {
                            // FP8 P·V has a native kernel on sm_90a only: elsewhere nothing to check.
                            Err(Error::UnsupportedPrecision { .. }) if pv == PvFormat::Fp8 => return Ok(None),
                            other => other?,
                        };
                        case.kernel = Some(plan.kernel_name());
                        let mut r = session.upload(&plan, &q, &k, &v)?;
                        session.execute(&mut r)?;
                        let Some(ops) = session.int8_operands(&r)? else { return Ok(None) };
                        let layout = Int8ScaleLayout::new(&p, granularity, plan.blocking.unwrap_or_default().int8())?;
                        let fold = p.softmax_scale() * std::f32::consts::LOG2_E;
                        verify_operands(&p, &layout, smooth_k, &q, &k, fold, &ops, DeviceSums::F64MeanCodecShift)?;
                        match (&ops.v, pv) {
                            (Some(vo), PvFormat::Fp8) => verify_v_operands(&p, &v, vo)?,
                            (None, PvFormat::F16) => {}
                            (Some(_), PvFormat::F16) => anyhow::bail!("an f16 P·V prepass wrote e4m3 V"),
                            (None, PvFormat::Fp8) => anyhow::bail!("the FP8 P·V prepass wrote no e4m3 V"),
                        }
                        Ok(Some(()))
                    })();
                    match result {
                        Ok(Some(())) => case.status = "pass",
                        Ok(None) => {
                            case.status = "skip";
                            case.reason = Some("this plan keeps no INT8 operands (not the native prepass, or FP8 P·V has no native kernel here)".into());
                        }
                        Err(e) => case.reason = Some(format!("{e:#}")),
                    }
                    out.push(case);
                }
            }
        }
    }
    out
}

/// f16 and bf16 through `Session::run_cuda` (CUDA) and `Session::run_cubecl` (every CubeCL
/// device) against the host path of the same plan: O must match bit for bit.
fn device_tensor_cases(session: &Session) -> Vec<Case> {
    let info = session.info();
    let shapes = [
        AttentionProblem::new(2, 8, 300, 128).kv_heads(2).kv_len(500).causal(true).with_lse(true),
        AttentionProblem::new(1, 4, 129, 64).layout(Layout::Bshd).with_lse(true),
        // A variable-length batch: its offsets are host data of the plan, copied per call.
        AttentionProblem::new(1, 8, 1, 128).kv_heads(2).causal(true).varlen(VarLen::from_lengths(&[300, 1, 0, 129], &[300, 40, 7, 500])).with_lse(true),
    ];
    let mut out = Vec::new();
    for p in &shapes {
        for prec in [Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
            let apis: &[&str] = match info.kind {
                "cuda" => &["run_cuda", "run_cubecl"],
                "wgpu" | "wgpu-spirv" => &["run_cubecl"],
                _ => &[],
            };
            for &api in apis {
                let mut case = Case {
                    device: info.kind.into(),
                    adapter: info.adapter.clone(),
                    strategy: format!("DeviceTensor({api})"),
                    precision: prec.name(),
                    kernel: None,
                    shape: Shape::of(p),
                    status: "skip",
                    accuracy: None,
                    vs_emulation_rel_l2: None,
                    reason: None,
                    error_over_tolerance: None,
                };
                let plan = match session.plan(p, prec, Strategy::Auto) {
                    Ok(plan) => plan,
                    Err(e) => {
                        case.reason = Some(e.to_string());
                        out.push(case);
                        continue;
                    }
                };
                case.kernel = Some(plan.kernel_name());
                let result = device_tensor_check(session, &plan, api);
                match result {
                    Ok(None) => case.status = "pass",
                    Ok(Some(skip)) => case.reason = Some(skip),
                    Err(e) => {
                        case.status = "fail";
                        case.reason = Some(format!("{e:#}"));
                    }
                }
                out.push(case);
            }
        }
    }
    out
}

/// `Ok(None)`: bit-identical to the host path; `Ok(Some(why))`: not applicable here.
fn device_tensor_check(session: &Session, plan: &quattn::Plan, api: &str) -> anyhow::Result<Option<String>> {
    use half::{bf16, f16};
    let p = &plan.problem;
    let (q, k, v) = quattn::inputs::qkv(p, 77);
    let host = session.run(plan, &q, &k, &v)?;
    let bytes: Box<dyn Fn(&[f32]) -> Vec<u8>> = match plan.dtype() {
        quattn::Dtype::F16 => Box::new(|x: &[f32]| bytemuck::cast_slice(&x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).to_vec()),
        quattn::Dtype::Bf16 => Box::new(|x: &[f32]| bytemuck::cast_slice(&x.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>()).to_vec()),
        quattn::Dtype::F32 => Box::new(|x: &[f32]| bytemuck::cast_slice(x).to_vec()),
    };
    let widen = |b: &[u8]| -> Vec<f32> {
        match plan.dtype() {
            quattn::Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(b).iter().map(|x| x.to_f32()).collect(),
            quattn::Dtype::Bf16 => bytemuck::pod_collect_to_vec::<u8, bf16>(b).iter().map(|x| x.to_f32()).collect(),
            quattn::Dtype::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(b),
        }
    };
    let (o, lse): (Vec<f32>, Vec<f32>) = match api {
        "run_cuda" => {
            use quattn::cudarc::driver::CudaContext;
            use quattn::{CudaTensor, CudaTensorMut};
            if !matches!(plan.kernel, quattn::KernelId::Native(_)) {
                return Ok(Some(format!("{} is a portable kernel: CubeCL handles only", plan.kernel_name())));
            }
            let ctx = CudaContext::new(0)?;
            let stream = ctx.new_stream()?;
            let up = |x: &[f32]| -> anyhow::Result<_> { Ok(stream.clone_htod(&bytemuck::pod_collect_to_vec::<u8, u16>(&bytes(x)))?) };
            let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
            // NaN bits in both 16-bit formats' high byte pattern: a skipped element stays NaN.
            let d_o = stream.clone_htod(&vec![0x7fffu16; p.o_len_elems()])?;
            let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()])?;
            // u16 buffers carry f16/bf16 bits: hand them over as raw device memory of the
            // plan's type.
            let (qp, kp, vp) = (raw(&dq, &stream), raw(&dk, &stream), raw(&dv, &stream));
            let op = raw(&d_o, &stream);
            let dt = plan.dtype();
            // SAFETY: each buffer holds the problem's elements of `dt` bits and lives until the
            // stream is synchronized below.
            unsafe {
                session.run_cuda(
                    plan,
                    &stream,
                    CudaTensor::from_raw(qp, dq.len(), dt),
                    CudaTensor::from_raw(kp, dk.len(), dt),
                    CudaTensor::from_raw(vp, dv.len(), dt),
                    CudaTensorMut::from_raw(op, d_o.len(), dt),
                    Some(CudaTensorMut::new(&mut d_lse, &stream)),
                )?;
            }
            let o_bits = stream.clone_dtoh(&d_o)?;
            let lse = stream.clone_dtoh(&d_lse)?;
            (widen(bytemuck::cast_slice(&o_bits)), lse)
        }
        _ => {
            let run = |client: &dyn Fn(&[u8]) -> quattn::cubecl::server::Handle,
                       empty: &dyn Fn(usize) -> quattn::cubecl::server::Handle|
             -> anyhow::Result<(quattn::cubecl::server::Handle, quattn::cubecl::server::Handle, quattn::cubecl::server::Handle, quattn::cubecl::server::Handle, quattn::cubecl::server::Handle)> {
                Ok((client(&bytes(&q)), client(&bytes(&k)), client(&bytes(&v)), empty(p.o_len_elems() * plan.dtype().size_bytes()), empty(p.lse_len_elems() * 4)))
            };
            macro_rules! on {
                ($rt:ty) => {{
                    let c = session.cubecl_client::<$rt>()?;
                    let (qh, kh, vh, oh, lh) = run(&|b| c.create_from_slice(b), &|n| c.empty(n))?;
                    session.run_cubecl::<$rt>(plan, quattn::CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) })?;
                    let o = c.read_one(oh).map_err(|e| anyhow::anyhow!("read O: {e:?}"))?;
                    let l = c.read_one(lh).map_err(|e| anyhow::anyhow!("read LSE: {e:?}"))?;
                    (widen(&o)[..p.o_len_elems()].to_vec(), bytemuck::pod_collect_to_vec::<u8, f32>(&l)[..p.lse_len_elems()].to_vec())
                }};
            }
            if session.info().kind == "cuda" {
                on!(quattn::cubecl::cuda::CudaRuntime)
            } else {
                on!(quattn::cubecl::wgpu::WgpuRuntime)
            }
        }
    };
    let same = o.len() == host.o.len() && o.iter().zip(&host.o).all(|(a, b)| a.to_bits() == b.to_bits());
    anyhow::ensure!(same, "O differs from the host path");
    let host_lse = host.lse.unwrap_or_default();
    anyhow::ensure!(lse.iter().zip(&host_lse).all(|(a, b)| a.to_bits() == b.to_bits()), "LSE differs from the host path");
    Ok(None)
}

fn raw(s: &quattn::cudarc::driver::CudaSlice<u16>, stream: &quattn::cudarc::driver::CudaStream) -> u64 {
    use quattn::cudarc::driver::DevicePtr;
    s.device_ptr(stream).0
}
