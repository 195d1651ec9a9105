//! `quattn run`: one call on random inputs, checked against the f64 reference.

use anyhow::Context;
use quattn::metrics::flops;
use quattn::{Layout, Session};
use serde::Serialize;

use crate::args::RunArgs;
use crate::check::{self, Accuracy};

#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub kv_seq: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub layout: &'static str,
    /// Score modifiers set (`AttentionProblem::modifiers`); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modifiers: Vec<String>,
    /// Keys per page of a paged K/V cache; absent for contiguous K/V.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
    /// Per-sequence query lengths of a variable-length batch (`seq` / `kv_seq` are then the
    /// longest); absent for a dense batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub varlen: Option<Vec<usize>>,
}

impl Shape {
    pub fn of(p: &quattn::AttentionProblem) -> Shape {
        Shape {
            batch: p.batch,
            heads: p.q_heads,
            kv_heads: p.kv_heads,
            seq: p.q_len,
            kv_seq: p.kv_len,
            head_dim: p.head_dim,
            causal: p.causal,
            layout: match p.layout {
                Layout::Bhsd => "bhsd",
                Layout::Bshd => "bshd",
            },
            modifiers: describe_modifiers(p),
            page_size: p.paged.as_ref().map(|x| x.page_size),
            varlen: p.varlen.as_ref().map(|vl| (0..vl.batch()).map(|b| vl.q_len(b)).collect()),
        }
    }
}

/// The modifiers with their parameters, e.g. `window(4096,0)`, `softcap(30)`.
fn describe_modifiers(p: &quattn::AttentionProblem) -> Vec<String> {
    let mut m = Vec::new();
    if let Some(w) = p.window {
        m.push(format!("window({},{})", w.left, w.right));
    }
    if let Some(c) = p.softcap {
        m.push(format!("softcap({c})"));
    }
    if p.sinks.is_some() {
        m.push("sinks".into());
    }
    if p.alibi_slopes.is_some() {
        m.push("alibi".into());
    }
    if p.causal_align == quattn::CausalAlign::TopLeft {
        m.push("top-left".into());
    }
    m
}

#[derive(Serialize)]
struct RunReport {
    device: String,
    adapter: String,
    strategy: String,
    kernel: String,
    precision: String,
    shape: Shape,
    ms: f64,
    tflops: f64,
    rel_l2: Option<f64>,
    cos_sim: Option<f64>,
    max_abs: Option<f64>,
    accuracy: Option<Accuracy>,
}

pub fn main(a: &RunArgs) -> anyhow::Result<i32> {
    let problem = a.problem();
    let session = Session::new(a.dev.device())?;
    let info = session.info();
    let plan = session.plan(&problem, a.precision, a.dev.strategy())?;
    let (q, k, v) = if a.k_outlier_channels {
        let (q, k, v) = quattn::inputs::qkv_k_outlier_channels(&problem, a.seed, 8.0);
        let r = |x: Vec<f32>| quattn::HostSlice::F32(&x).rounded_to(a.precision.input_dtype());
        (r(q), r(k), r(v))
    } else {
        check::inputs(&problem, a.precision, a.seed)
    };
    let mut resident = session.upload(&plan, &q, &k, &v)?;
    let mut times = session.time(&mut resident, 1, a.iters.max(1))?;
    let ms = check::median(&mut times);
    let out = session.download(&resident)?;
    let accuracy = if a.no_check {
        None
    } else {
        Some(check::check(&problem, a.precision, &q, &k, &v, &out).context("reference check")?)
    };
    let report = RunReport {
        device: info.kind.to_string(),
        adapter: info.adapter.clone(),
        strategy: format!("{:?}", plan.strategy),
        kernel: out.kernel.clone(),
        precision: a.precision.name(),
        shape: Shape::of(&problem),
        ms,
        tflops: flops(&problem) / (ms * 1e-3) / 1e12,
        rel_l2: accuracy.as_ref().map(|x| x.rel_l2),
        cos_sim: accuracy.as_ref().map(|x| x.cos_sim),
        max_abs: accuracy.as_ref().map(|x| x.max_abs),
        accuracy,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let s = &report.shape;
        println!("device    {} ({})", report.device, report.adapter);
        println!("kernel    {} [{} / {}]", report.kernel, report.strategy, report.precision);
        println!(
            "shape     batch {} heads {}/{} seq {}x{} head_dim {}{} {}{}",
            s.batch,
            s.heads,
            s.kv_heads,
            s.seq,
            s.kv_seq,
            s.head_dim,
            if s.causal { " causal" } else { "" },
            s.layout,
            if s.modifiers.is_empty() { String::new() } else { format!(" {}", s.modifiers.join(" ")) }
        );
        if let Some(ps) = s.page_size {
            println!("kv cache  paged, {ps} keys a page");
        }
        if let Some(lens) = &s.varlen {
            println!("varlen    {} sequences, {} tokens (longest {})", lens.len(), lens.iter().sum::<usize>(), s.seq);
        }
        println!("time      {:.4} ms  ({:.3} TFLOP/s)", report.ms, report.tflops);
        if let Some(acc) = &report.accuracy {
            println!(
                "accuracy  rel_l2 {:.3e}  cos_sim {:.7}  max_abs {:.3e}  lse_max_abs {}  -> {}",
                acc.rel_l2,
                acc.cos_sim,
                acc.max_abs,
                acc.lse_max_abs.map_or("-".into(), |x| format!("{x:.3e}")),
                if acc.passed { "PASS".to_string() } else { format!("FAIL: {}", acc.failure.clone().unwrap_or_default()) }
            );
        }
    }
    Ok(match &report.accuracy {
        Some(acc) if !acc.passed => 1,
        _ => 0,
    })
}
