//! Checks of the [NaN policy](crate::nonfinite) and of run-to-run determinism for one plan,
//! shared by the tests (CPU, llvmpipe) and `quattn selftest` (GPUs).

use half::{bf16, f16};

use crate::error::Error;
use crate::{AttentionProblem, Dtype, HostSlice, Layout, Output, Plan, Precision, PvAccum, QkAccum, Session, Strategy, TensorName};

/// What a check found: `Ok(None)` passed, `Ok(Some(why))` did not apply (the plan was refused
/// for a capability, or the mode has no such overflow), `Err(why)` a violation.
pub type CheckResult = std::result::Result<Option<String>, String>;

/// The policy problem: GQA (4 query heads on 2 KV heads), two batches, causal with
/// `q_len - kv_len = 8` (rows 0..8 see no key), BSHD, LSE returned.
pub fn policy_problem() -> AttentionProblem {
    AttentionProblem::new(2, 4, 40, 64).kv_heads(2).kv_len(32).causal(true).layout(Layout::Bshd).with_lse(true)
}

/// A planted non-finite value: tensor, (batch, head, row), channel, value.
type Plant = (TensorName, (usize, usize, usize), usize, f32);

/// The planted values: a NaN in a Q row that sees keys and in one that sees none, +inf in an
/// early key of batch 1's KV head 0, a NaN in one channel of a late V row of batch 0's KV head
/// 1, -inf in the last key of batch 1's KV head 1 (seen by the last row only).
const PLANTS: [Plant; 5] = [
    (TensorName::Q, (0, 1, 20), 3, f32::NAN),
    (TensorName::Q, (0, 2, 2), 0, f32::NAN),
    (TensorName::K, (1, 0, 10), 7, f32::INFINITY),
    (TensorName::V, (0, 1, 25), 60, f32::NAN),
    (TensorName::K, (1, 1, 31), 0, f32::NEG_INFINITY),
];

/// Whether query row `(b, h, i)` of [`policy_problem`] sees a planted value, by the rule
/// stated independently of the library's screen.
fn sees_plant(p: &AttentionProblem, b: usize, h: usize, i: usize) -> bool {
    let n = p.visible_keys(i);
    n > 0
        && PLANTS.iter().any(|&(t, (pb, ph, pi), _, _)| {
            pb == b
                && match t {
                    TensorName::Q => ph == h && pi == i,
                    _ => ph == p.kv_head_of(h) && pi < n,
                }
        })
}

/// The policy problem's inputs (unit normal with outliers, rounded to `dtype`) with `plants`
/// written in.
fn policy_inputs(p: &AttentionProblem, dtype: Dtype, plants: &[Plant]) -> [Vec<f32>; 3] {
    let (q, k, v) = crate::inputs::qkv(p, 0x4a4e);
    let r = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(dtype);
    let mut t = [r(q), r(k), r(v)];
    let s = p.tensor_strides();
    for &(tensor, (b, h, i), c, value) in plants {
        let (buf, st) = match tensor {
            TensorName::Q => (&mut t[0], s.q),
            TensorName::K => (&mut t[1], s.k),
            _ => (&mut t[2], s.v),
        };
        buf[st.offset(b, h, i) + c] = value;
    }
    t
}

/// Plans `precision` with `strategy`; a capability refusal is `Ok(None)`.
fn plan(session: &Session, p: &AttentionProblem, precision: Precision, strategy: Strategy) -> std::result::Result<Option<Plan>, String> {
    match session.plan(p, precision, strategy) {
        Ok(plan) => Ok(Some(plan)),
        Err(
            Error::UnsupportedPrecision { .. }
            | Error::UnsupportedStrategy { .. }
            | Error::UnsupportedHeadDim { .. }
            | Error::UnsupportedVHeadDim { .. },
        ) => Ok(None),
        Err(e) => Err(format!("plan: {e}")),
    }
}

fn run(session: &Session, plan: &Plan, [q, k, v]: &[Vec<f32>; 3]) -> crate::Result<Output> {
    session.run(plan, q, k, v)
}

/// The NaN policy for `precision` on `strategy`: rows that see a planted NaN or ±inf are NaN
/// (O and LSE), every other row is bit for bit the output of the same call with those values
/// replaced by 0, and rows that see no key are `O = 0`, `LSE = -inf` (a NaN in their Q row
/// included).
pub fn nan_policy(session: &Session, precision: Precision, strategy: Strategy) -> CheckResult {
    let p = policy_problem();
    let Some(plan) = plan(session, &p, precision, strategy)? else { return Ok(Some("refused".into())) };
    let dtype = precision.input_dtype();
    let planted = run(session, &plan, &policy_inputs(&p, dtype, &PLANTS)).map_err(|e| format!("with the planted values: {e}"))?;
    let zeros: Vec<Plant> = PLANTS.iter().map(|&(t, r, c, _)| (t, r, c, 0.0)).collect();
    let clean = run(session, &plan, &policy_inputs(&p, dtype, &zeros)).map_err(|e| format!("with zeros planted: {e}"))?;
    let (lse, clean_lse) = match (&planted.lse, &clean.lse) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err("no LSE returned".into()),
    };
    let os = p.o_strides();
    let mut poisoned = 0;
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            for i in 0..p.q_len {
                let r = (b * p.q_heads + h) * p.q_len + i;
                let off = os.offset(b, h, i);
                let (o, want) = (&planted.o[off..off + p.v_head_dim], &clean.o[off..off + p.v_head_dim]);
                let at = format!("{} ({}) row (b{b}, h{h}, i{i})", plan.kernel_name(), precision);
                if sees_plant(&p, b, h, i) {
                    poisoned += 1;
                    if !o.iter().all(|x| x.is_nan()) || !lse[r].is_nan() {
                        return Err(format!("{at} sees a non-finite input: O and LSE must be NaN, got O[0] {} LSE {}", o[0], lse[r]));
                    }
                } else if p.visible_keys(i) == 0 {
                    if o.iter().any(|&x| x != 0.0) || lse[r] != f32::NEG_INFINITY {
                        return Err(format!("{at} sees no key: O must be 0 and LSE -inf, got O[0] {} LSE {}", o[0], lse[r]));
                    }
                } else if o.iter().zip(want).any(|(a, b)| a.to_bits() != b.to_bits()) || lse[r].to_bits() != clean_lse[r].to_bits() {
                    return Err(format!("{at} sees only finite inputs but differs from the run with zeros planted"));
                }
            }
        }
    }
    // By hand from `PLANTS` (row i sees keys 0..=i-8): Q (0,1,20), 1 row; K (1,0,10), rows 18..40
    // of heads 0 and 1, 44; V (0,1,25), rows 33..40 of heads 2 and 3, 14; K (1,1,31), row 39 of
    // heads 2 and 3, 2. A mismatch means the rule above drifted from the one stated.
    if poisoned != 61 {
        return Err(format!("{poisoned} rows see a planted value, 61 by hand"));
    }
    Ok(None)
}

/// The overflow half of the policy for `precision` on `strategy`: a finite input the plan's
/// element type cannot hold is [`Error::InputOverflow`] naming it, and inputs that fit but
/// overflow the mode's intermediate values (f32 scores from 1e20-sized Q and K rows; f16
/// Q·Kᵀ accumulation from 200-sized rows; f16 P·V accumulation from V rows of 6e4) are
/// [`Error::Overflow`] naming a row that holds them. `Ok(Some(..))` where the mode has neither.
pub fn overflow_policy(session: &Session, precision: Precision, strategy: Strategy) -> CheckResult {
    let p = policy_problem();
    let Some(plan) = plan(session, &p, precision, strategy)? else { return Ok(Some("refused".into())) };
    let dtype = precision.input_dtype();
    let (q, k, v) = crate::inputs::qkv(&p, 0x0f10);
    let mut applies = Vec::new();
    // A finite f32 beyond the input type.
    let beyond = match dtype {
        Dtype::F16 => Some(1.0e5f32),
        Dtype::Bf16 => Some(f32::MAX),
        Dtype::F32 => None,
    };
    if let Some(value) = beyond {
        applies.push("input overflow");
        let mut k2 = k.clone();
        let index = p.k_strides().offset(1, 1, 5) + 9;
        k2[index] = value;
        match session.run(&plan, &q, &k2, &v) {
            Err(Error::InputOverflow { tensor: TensorName::K, index: i, value: x, dtype: d }) if i == index && x == value && d == dtype => {}
            r => return Err(format!("{}: K[{index}] = {value} must be InputOverflow, got {:?}", plan.kernel_name(), r.map(|_| "Ok"))),
        }
    }
    // Intermediate overflow: Q row (b0, h0, i39) and key (b0, kv0, 31) at `big` in every channel
    // (only row 39 of heads 0 and 1 sees that key), or every V row of (b0, kv0) at `big` with Q
    // row (b0, h0, i39) zero (uniform P over the keys).
    let (big, target) = match precision {
        Precision::F32 | Precision::Bf16 { .. } => (Some(1.0e20f32), TensorName::Q),
        Precision::F16 { qk: QkAccum::F16 | QkAccum::TwoStage, .. } => (Some(200.0), TensorName::Q),
        Precision::F16 { pv: PvAccum::F16PerTile, .. } => (Some(60000.0), TensorName::V),
        _ => (None, TensorName::Q),
    };
    if let Some(big) = big {
        applies.push("intermediate overflow");
        let (mut q, mut k, mut v) = (HostSlice::F32(&q).rounded_to(dtype), HostSlice::F32(&k).rounded_to(dtype), HostSlice::F32(&v).rounded_to(dtype));
        let (qs, ks, vs) = (p.q_strides(), p.k_strides(), p.v_strides());
        let qrow = qs.offset(0, 0, 39);
        if target == TensorName::Q {
            q[qrow..qrow + p.head_dim].fill(big);
            let krow = ks.offset(0, 0, 31);
            k[krow..krow + p.head_dim].fill(big);
        } else {
            q[qrow..qrow + p.head_dim].fill(0.0);
            for j in 0..p.kv_len {
                let vrow = vs.offset(0, 0, j);
                v[vrow..vrow + p.v_head_dim].fill(big);
            }
        }
        // Q·Kᵀ overflows in row (b0, h0, i39) alone; the V rows overflow every row of batch 0's
        // heads 0 and 1 whose probabilities in a tile add up to more than 65504 / 6e4.
        match session.run(&plan, &q, &k, &v) {
            Err(Error::Overflow { rows, batch: 0, head, row, .. }) if rows >= 1 && head < 2 && (target == TensorName::V || (head, row) == (0, 39)) => {}
            r => return Err(format!("{} ({precision}): {target} rows of {big} must be Overflow in batch 0, head 0 or 1, got {:?}", plan.kernel_name(), r.map(|_| "Ok"))),
        }
    }
    Ok(if applies.is_empty() { Some(format!("{precision} neither narrows f32 inputs nor accumulates in f16")) } else { None })
}

/// Run-to-run determinism of one plan on `case`'s inputs: two executions on the same resident
/// data and one on a fresh upload give O and LSE bit for bit equal. `Ok(Some(..))` when the
/// plan is refused (refusals are [`super::run_case`]'s business).
pub fn determinism(session: &Session, case: &super::Case) -> CheckResult {
    let plan = match session.plan(&case.problem, case.precision, case.strategy) {
        Ok(plan) => plan,
        Err(e) => return Ok(Some(format!("refused: {e}"))),
    };
    let x = case.inputs();
    let upload = || match case.host {
        Dtype::F32 => session.upload(&plan, &x.q, &x.k, &x.v),
        Dtype::F16 => {
            let c = |t: &[f32]| t.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>();
            session.upload(&plan, &c(&x.q), &c(&x.k), &c(&x.v))
        }
        Dtype::Bf16 => {
            let c = |t: &[f32]| t.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>();
            session.upload(&plan, &c(&x.q), &c(&x.k), &c(&x.v))
        }
    };
    let fail = |what: &str, e: Error| format!("{} ({}): {what}: {e}", plan.kernel_name(), case.precision);
    let mut r = upload().map_err(|e| fail("upload", e))?;
    let mut outs = Vec::new();
    for _ in 0..2 {
        session.execute(&mut r).map_err(|e| fail("execute", e))?;
        outs.push(session.download(&r).map_err(|e| fail("download", e))?);
    }
    let mut fresh = upload().map_err(|e| fail("upload", e))?;
    session.execute(&mut fresh).map_err(|e| fail("execute", e))?;
    outs.push(session.download(&fresh).map_err(|e| fail("download", e))?);
    let bits = |o: &Output| -> (Vec<u32>, Vec<u32>) {
        (o.o.iter().map(|x| x.to_bits()).collect(), o.lse.iter().flatten().map(|x| x.to_bits()).collect())
    };
    let first = bits(&outs[0]);
    for (n, o) in outs.iter().enumerate().skip(1) {
        let b = bits(o);
        if b.0 != first.0 {
            let i = b.0.iter().zip(&first.0).position(|(a, c)| a != c).unwrap_or(0);
            return Err(format!("{} ({}): run {n} differs from run 0 at O[{i}] [{}]", plan.kernel_name(), case.precision, case));
        }
        if b.1 != first.1 {
            return Err(format!("{} ({}): run {n}'s LSE differs from run 0's [{}]", plan.kernel_name(), case.precision, case));
        }
    }
    Ok(None)
}

/// Every plan of `precisions` a session makes with `Auto` or with one of its families forced,
/// one per distinct kernel: `(precision, strategy, kernel name)`, in a stable order. What
/// "every backend and family present" means for the checks above.
pub fn family_plans(session: &Session, p: &AttentionProblem, precisions: &[Precision]) -> Vec<(Precision, Strategy, String)> {
    let mut strategies = vec![Strategy::Auto];
    strategies.extend(crate::Family::ALL.iter().filter_map(|f| match *f {
        crate::Family::Native(k) => Some(Strategy::Native(k)),
        crate::Family::Portable(k) => Some(Strategy::PortableFamily(k)),
        crate::Family::Cpu | crate::Family::Emulation => None,
    }));
    let mut out: Vec<(Precision, Strategy, String)> = Vec::new();
    for &precision in precisions {
        for &strategy in &strategies {
            if let Ok(plan) = session.plan(p, precision, strategy) {
                let name = plan.kernel_name();
                if !out.iter().any(|(pr, _, k)| *pr == precision && *k == name) {
                    out.push((precision, strategy, name));
                }
            }
        }
    }
    out
}
