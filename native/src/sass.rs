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

/// The opcode of one instruction line of either tool's output:
/// `        /*0040*/   @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x... */`.
fn opcode_of(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if !addr.chars().all(|c| c.is_ascii_hexdigit()) || addr.is_empty() {
        return None;
    }
    let mut tokens = rest.split_whitespace().skip_while(|t| *t == "{");
    let mut op = tokens.next()?;
    if op.starts_with('@') {
        op = tokens.next()?;
    }
    let op = op.trim_end_matches(';');
    op.chars().next().filter(|c| c.is_ascii_uppercase()).map(|_| op)
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
}
