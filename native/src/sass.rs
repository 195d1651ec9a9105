//! Disassembling cubins (cuobjdump -sass, else nvdisasm) and counting opcodes, so that tests and
//! CI can check that the tensor-core instructions a variant is built around are really there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{NativeError, Result};
use crate::tools::{find_any_disassembler, Disassembler};

/// SASS text of a cubin.
pub fn disassemble(cubin: &[u8]) -> Result<String> {
    let (tool, path) = find_any_disassembler().ok_or(NativeError::Disassembler {
        tool: "cuobjdump",
        message: format!(
            "neither cuobjdump nor nvdisasm found (set {} / {}, or pip install \
             nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
            crate::tools::ENV_CUOBJDUMP,
            crate::tools::ENV_NVDISASM
        ),
    })?;
    let name = tool.binary_name();
    let err = |message: String| NativeError::Disassembler { tool: name, message };

    // Both tools read files only; a unique temp name keeps parallel reports apart.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let file: PathBuf = std::env::temp_dir().join(format!(
        "quattn-{}-{}.cubin",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&file, cubin).map_err(|e| err(format!("writing {}: {e}", file.display())))?;
    let mut cmd = Command::new(&path);
    match tool {
        Disassembler::Cuobjdump => cmd.arg("-sass").arg(&file),
        Disassembler::Nvdisasm => cmd.arg(&file),
    };
    let out = cmd.output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| err(format!("running {}: {e}", path.display())))?;
    if !out.status.success() {
        return Err(err(format!(
            "{} exited with {}: {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Opcode (with modifiers, e.g. `HMMA.16816.F32.BF16`) -> occurrences.
pub fn opcode_histogram(sass: &str) -> BTreeMap<String, usize> {
    let mut hist = BTreeMap::new();
    for line in sass.lines() {
        if let Some(op) = opcode_of(line) {
            *hist.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    hist
}

/// The address and text (from the opcode, predicate and `;` dropped) of one instruction line of
/// either tool's output:
/// `        /*0040*/   @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x... */`.
fn instruction_of(line: &str) -> Option<(usize, &str)> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if !addr.chars().all(|c| c.is_ascii_hexdigit()) || addr.is_empty() {
        return None;
    }
    let addr = usize::from_str_radix(addr, 16).ok()?;
    let mut text = rest.split(';').next()?.trim_start().trim_start_matches('{').trim_start();
    if text.starts_with('@') {
        text = text.split_once(char::is_whitespace)?.1.trim_start();
    }
    let text = text.trim_end();
    text.chars().next().filter(|c| c.is_ascii_uppercase()).map(|_| (addr, text))
}

/// The opcode of one instruction line (see [`instruction_of`]).
fn opcode_of(line: &str) -> Option<&str> {
    instruction_of(line)?.1.split_whitespace().next()
}

/// One loop of a SASS listing: the instructions from a backward branch's target to the
/// branch, and their opcodes (modifiers kept) with counts.
pub struct SassLoop {
    pub start: usize,
    pub end: usize,
    pub instructions: usize,
    pub opcodes: BTreeMap<String, usize>,
}

impl SassLoop {
    /// `N instructions: OP n, ...`, the most frequent opcodes first (modifiers dropped).
    pub fn summary(&self, top: usize) -> String {
        let mut base = BTreeMap::<&str, usize>::new();
        for (op, n) in &self.opcodes {
            *base.entry(op.split('.').next().unwrap_or(op)).or_default() += n;
        }
        let mut ops: Vec<(&str, usize)> = base.into_iter().collect();
        ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mix: Vec<String> = ops.iter().take(top).map(|(op, n)| format!("{op} {n}")).collect();
        format!("{} instructions: {}", self.instructions, mix.join(", "))
    }
}

/// The loops of a SASS listing (branch targets as addresses), in address order of their
/// branch: what one iteration of a kernel's loop issues, counted statically (a branch inside
/// the body, such as a conditional rescale, counts its whole side).
pub fn loops(sass: &str) -> Vec<SassLoop> {
    let ins: Vec<(usize, &str)> = sass.lines().filter_map(instruction_of).collect();
    let mut loops = Vec::new();
    for &(addr, text) in &ins {
        if !text.starts_with("BRA") {
            continue;
        }
        let target = text.split([' ', ',']).filter_map(|t| t.strip_prefix("0x")).find_map(|h| usize::from_str_radix(h, 16).ok());
        let Some(start) = target.filter(|&t| t < addr) else { continue };
        let mut opcodes = BTreeMap::new();
        let mut instructions = 0;
        for (_, t) in ins.iter().filter(|(a, _)| (start..=addr).contains(a)) {
            *opcodes.entry(t.split_whitespace().next().unwrap_or("").to_string()).or_insert(0) += 1;
            instructions += 1;
        }
        loops.push(SassLoop { start, end: addr, instructions, opcodes });
    }
    loops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_tool_formats() {
        let sass = "\
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x0000000c0804723c */\n\
                                                                      /* 0x000fe20000001804 */\n\
        /*0050*/              @!P0 HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n\
        /*0060*/                   EXIT ;\n\
        .text.k:\n";
        let h = opcode_histogram(sass);
        assert_eq!(h.get("HMMA.16816.F32"), Some(&1));
        assert_eq!(h.get("HMMA.16816.F32.BF16"), Some(&1));
        assert_eq!(h.get("EXIT"), Some(&1));
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn finds_a_backward_branch_loop() {
        let sass = "\
        /*0000*/                   MOV R1, c[0x0][0x28] ;\n\
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;\n\
        /*0020*/              @!P0 FMUL R4, R4, 0.5 ;\n\
        /*0030*/               @P1 BRA 0x10 ;\n\
        /*0040*/                   BRA 0x50 ;\n\
        /*0050*/                   EXIT ;\n";
        let l = loops(sass);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].start, l[0].end, l[0].instructions), (0x10, 0x30, 3));
        assert_eq!(l[0].summary(2), "3 instructions: BRA 1, FMUL 1");
    }
}
