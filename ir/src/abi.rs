//! Names and signatures shared by the code generator and the runtime's loader of native
//! stage modules (`module.so`), so the two agree on one spelling.
//!
//! A ppir function `@f` becomes the C entry `ppcc_call_<mangle(f)>` and the signature
//! accessor `ppcc_sig_<mangle(f)>`. Function names such as `stage0.fwd` hold characters a
//! C symbol cannot: [`mangle`] keeps ASCII letters and digits, doubles `_`, and writes any
//! other byte as `_` plus two lower-case hex digits (`stage0.fwd` → `stage0_2efwd`), which
//! is reversible and always a valid identifier.

use crate::types::DType;

/// A C identifier for a function name (see the module docs).
pub fn mangle(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 4);
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => s.push(b as char),
            b'_' => s.push_str("__"),
            _ => s.push_str(&format!("_{b:02x}")),
        }
    }
    s
}

/// The entry symbol of function `name`.
pub fn entry_symbol(name: &str) -> String {
    format!("ppcc_call_{}", mangle(name))
}

/// The signature accessor symbol of function `name`.
pub fn signature_symbol(name: &str) -> String {
    format!("ppcc_sig_{}", mangle(name))
}

/// The one-line spelling of a signature compiled into `ppcc_sig_*`:
/// `f32[4,8] i64[4] -> f32[]` (inputs, then outputs, in order).
pub fn signature_text<'a>(
    inputs: impl IntoIterator<Item = (DType, &'a [u64])>,
    outputs: impl IntoIterator<Item = (DType, &'a [u64])>,
) -> String {
    let one = |(d, s): (DType, &[u64])| {
        let dims: Vec<String> = s.iter().map(|x| x.to_string()).collect();
        format!("{}[{}]", d.name(), dims.join(","))
    };
    let ins: Vec<String> = inputs.into_iter().map(one).collect();
    let outs: Vec<String> = outputs.into_iter().map(one).collect();
    format!("{} -> {}", ins.join(" "), outs.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangling_is_an_identifier_and_injective() {
        assert_eq!(mangle("stage0.fwd"), "stage0_2efwd");
        assert_eq!(mangle("a_b"), "a__b");
        assert_eq!(mangle("a.b"), "a_2eb");
        // `_2e` literally is not the same as `.`.
        assert_ne!(mangle("a_2eb"), mangle("a.b"));
        assert_eq!(entry_symbol("grad"), "ppcc_call_grad");
        for n in ["stage12.bwd_input", "x/y-z", "ü"] {
            let m = mangle(n);
            assert!(
                m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{m}"
            );
        }
    }

    #[test]
    fn signature_spelling() {
        let a = [2u64, 3];
        let t = signature_text(
            [(DType::F32, &a[..]), (DType::I64, &[][..])],
            [(DType::Bool, &a[..])],
        );
        assert_eq!(t, "f32[2,3] i64[] -> i1[2,3]");
    }
}
