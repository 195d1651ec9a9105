//! `quattn selftest --fuzz N`: the reliability cases of `quattn::fuzz` on every device present,
//! as selftest cases. Per session: N generator cases of each seed (the fixed one and one that
//! changes every run, or `--fuzz-seed`), the NaN-policy and overflow checks and the determinism
//! check on every kernel family the session plans (the emulation's once, on the first
//! session). Jobs are numbered in one fixed order and dealt round-robin like the matrix, so
//! `--shard I/N` processes together run each once.

use quattn::fuzz::policy::{determinism, family_plans, nan_policy, overflow_policy, policy_problem, CheckResult};
use quattn::fuzz::{self, Generator, Outcome, Profile, Summary};
use quattn::{AttentionProblem, Precision, Session, Strategy};

use crate::run::Shape;
use crate::selftest::Case;

/// Kernel configurations each seed's generator cases come from on a GPU (`Profile::palette`):
/// compiling, not running, is what a GPU spends its time on.
const GPU_PALETTE: usize = 16;
/// Generator cases per family plan in the determinism check.
const DETERMINISM_CASES: usize = 2;

enum Job {
    Fuzz { session: usize, seed: u64, index: u64 },
    Nan { session: usize, precision: Precision, strategy: Strategy },
    Overflow { session: usize, precision: Precision, strategy: Strategy },
    Determinism { session: usize, case: Box<fuzz::Case> },
}

fn profile(s: &Session) -> Profile {
    // The f64 reference of every case runs on the host: 1e7 keeps it near 20 ms on 16 cores.
    let p = Profile::probe(s).with_budget(600, 1.0e7);
    if s.info().kind == "cpu" {
        p
    } else {
        p.with_palette(GPU_PALETTE)
    }
}

/// Generator cases with the kernel configuration fixed to a family plan (head dim 64, causal,
/// LSE): the sizes, strides, layouts, scales and data still vary.
fn determinism_cases(profile: &Profile, precision: Precision, strategy: Strategy) -> Vec<fuzz::Case> {
    let g = Generator::new(fuzz::FIXED_SEED ^ 0xde7, Profile { palette: None, ..profile.clone() });
    (0..)
        .map(|i| {
            let mut c = g.case(i);
            c.problem = AttentionProblem { head_dim: 64, v_head_dim: 64, causal: true, return_lse: true, ..c.problem };
            c.precision = precision;
            c.strategy = strategy;
            c
        })
        .filter(|c| c.problem.validate().is_ok())
        .take(DETERMINISM_CASES)
        .collect()
}

/// The reliability cases of shard `shard` of `shards`, printed as JSON lines when `json`.
pub fn cases(sessions: &[Session], n: u64, seed: Option<u64>, (shard, shards): (usize, usize), json: bool) -> Vec<Case> {
    let seeds = match seed {
        Some(s) => vec![s],
        None => vec![fuzz::FIXED_SEED, fuzz::rotating_seed()],
    };
    eprintln!("selftest --fuzz {n}: seeds {} (replay one with --fuzz-seed)", seeds.iter().map(|s| format!("{s:#x}")).collect::<Vec<_>>().join(", "));
    let profiles: Vec<Profile> = sessions.iter().map(profile).collect();
    let mut jobs = Vec::new();
    let probe = AttentionProblem::new(1, 2, 8, 64).causal(true).with_lse(true);
    let all = Precision::all_named();
    for (si, session) in sessions.iter().enumerate() {
        for &seed in &seeds {
            jobs.extend((0..n).map(|index| Job::Fuzz { session: si, seed, index }));
        }
        let mut plans: Vec<(Precision, Strategy)> = family_plans(session, &policy_problem(), &all).into_iter().map(|(p, s, _)| (p, s)).collect();
        if si == 0 {
            plans.extend(all.iter().map(|&p| (p, Strategy::Reference)));
        }
        for &(precision, strategy) in &plans {
            jobs.push(Job::Nan { session: si, precision, strategy });
            jobs.push(Job::Overflow { session: si, precision, strategy });
        }
        let mut det: Vec<(Precision, Strategy)> = family_plans(session, &probe, &all).into_iter().map(|(p, s, _)| (p, s)).collect();
        if si == 0 {
            det.extend(all.iter().map(|&p| (p, Strategy::Reference)));
        }
        for (precision, strategy) in det {
            for case in determinism_cases(&profiles[si], precision, strategy) {
                jobs.push(Job::Determinism { session: si, case: Box::new(case) });
            }
        }
    }
    let mut summaries = vec![Summary::default(); sessions.len()];
    let mut out = Vec::new();
    for (_, job) in jobs.into_iter().enumerate().filter(|(i, _)| i % shards == shard) {
        let case = match job {
            Job::Fuzz { session, seed, index } => {
                let s = &sessions[session];
                let verdict = fuzz::run_case(s, &Generator::new(seed, profiles[session].clone()).case(index));
                summaries[session].add(&verdict);
                fuzz_case(s, &verdict)
            }
            Job::Nan { session, precision, strategy } => {
                check_case(&sessions[session], "NanPolicy", precision, strategy, &policy_problem(), nan_policy(&sessions[session], precision, strategy))
            }
            Job::Overflow { session, precision, strategy } => check_case(
                &sessions[session],
                "Overflow",
                precision,
                strategy,
                &policy_problem(),
                overflow_policy(&sessions[session], precision, strategy),
            ),
            Job::Determinism { session, case } => {
                check_case(&sessions[session], "Determinism", case.precision, case.strategy, &case.problem, determinism(&sessions[session], &case))
            }
        };
        if json {
            println!("{}", serde_json::to_string(&case).unwrap_or_default());
        }
        out.push(case);
    }
    for (s, summary) in sessions.iter().zip(&summaries) {
        if summary.cases > 0 {
            // stderr in JSON mode: stdout stays one JSON object per line.
            let line = format!("fuzz on {} ({}): {summary}", s.info().kind, s.info().adapter);
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
    }
    out
}

fn base(session: &Session, strategy: String, precision: Precision, problem: &AttentionProblem) -> Case {
    let info = session.info();
    Case {
        device: info.kind.into(),
        adapter: info.adapter,
        strategy,
        precision: precision.name(),
        kernel: None,
        shape: Shape::of(problem),
        status: "skip",
        accuracy: None,
        vs_emulation_rel_l2: None,
        reason: None,
        error_over_tolerance: None,
    }
}

fn fuzz_case(session: &Session, v: &fuzz::Verdict) -> Case {
    let mut c = base(session, format!("Fuzz({:?})", v.case.strategy), v.case.precision, &v.case.problem);
    c.kernel = v.kernel.clone();
    c.reason = Some(v.to_string());
    match v.outcome {
        Outcome::Passed { ratio } => {
            c.status = "pass";
            c.error_over_tolerance = Some(ratio);
        }
        Outcome::Mismatch { ratio, .. } => {
            c.status = "fail";
            c.error_over_tolerance = Some(ratio);
        }
        Outcome::Refused { .. } => c.status = "skip",
        Outcome::Failed(_) => c.status = "fail",
    }
    c
}

fn check_case(session: &Session, what: &str, precision: Precision, strategy: Strategy, problem: &AttentionProblem, r: CheckResult) -> Case {
    let mut c = base(session, format!("{what}({strategy:?})"), precision, problem);
    c.kernel = session.plan(problem, precision, strategy).ok().map(|p| p.kernel_name());
    match r {
        Ok(None) => c.status = "pass",
        Ok(Some(why)) => c.reason = Some(why),
        Err(e) => {
            c.status = "fail";
            c.reason = Some(e);
        }
    }
    c
}
