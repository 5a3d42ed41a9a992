//! The textual form of ppir: a printer and a separate parser that round-trip exactly.
//!
//! The syntax follows MLIR's generic op form so people who know MLIR can read it. The
//! printer ([`print_module`]) is the canonical form; the parser ([`parse_module`]) accepts
//! it back and a little more (comments, free whitespace, either dense form). For every
//! module `m`, `print(parse(print(m))) == print(m)`.
//!
//! ```text
//! module @mlp {
//!   func @main(%x: tensor<?x784xf32>, %w1: tensor<784x128xf32> {param}) -> (tensor<?x128xf32>) attributes {stage = 0} {
//!     %0 = "pp.matmul"(%x, %w1) {stage = 0, phase = "fwd"} : (tensor<?x784xf32>, tensor<784x128xf32>) -> tensor<?x128xf32> loc("fc1/MatMul")
//!     %a, %b = "pp.split"(%0) {axis = 1, split = [64, 64]} : (tensor<?x128xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>)
//!     "pp.send"(%a) {channel = 3, peer = 1} : (tensor<?x64xf32>) -> ()
//!     return %b : tensor<?x64xf32>
//!   }
//!   weight @w1 : tensor<784x128xf32> = dense<"0x0000803F...">
//! }
//! ```
//!
//! # Grammar
//!
//! Whitespace (including newlines) separates tokens and is otherwise free; `//` starts a
//! comment that runs to the end of the line.
//!
//! ```text
//! module     ::= 'module' sym-name? '{' (func | weight)* '}' EOF
//! func       ::= 'func' sym-name '(' (arg (',' arg)*)? ')' '->' result-types
//!                ('attributes' attr-dict)? '{' op* return '}'
//! arg        ::= value-name ':' type ('{' ('param' | 'state') '}')?
//! result-types ::= '(' (type (',' type)*)? ')' | type
//! op         ::= (value-name (',' value-name)* '=')? string '(' (value-name (',' value-name)*)? ')'
//!                attr-dict? ':' '(' (type (',' type)*)? ')' '->' result-types
//!                ('loc' '(' string ')')?
//! return     ::= 'return' (value-name (',' value-name)* ':' type (',' type)*)?
//! weight     ::= 'weight' sym-name ':' type '=' (dense | 'elided')
//! attr-dict  ::= '{' (attr-entry (',' attr-entry)*)? '}'
//! attr-entry ::= (ident | string) '=' attr-value
//! attr-value ::= int | float | string | dtype | '[' (number (',' number)*)? ']' | dense ':' type
//! dense      ::= 'dense' '<' ('[' (element (',' element)*)? ']' | string) '>'
//! element    ::= int | float | 'true' | 'false'
//! type       ::= 'tensor<' (dim 'x')* dtype '>'        (no spaces inside)
//! dim        ::= [0-9]+ | '?'
//! dtype      ::= 'f32' | 'f64' | 'f16' | 'bf16' | 'i64' | 'i32' | 'i8' | 'i1'
//! value-name ::= '%' (name-chars | string)
//! sym-name   ::= '@' (name-chars | string)
//! name-chars ::= [A-Za-z0-9_.$/-]+
//! ident      ::= [A-Za-z_][A-Za-z0-9_.$]*
//! int        ::= '-'? [0-9]+
//! float      ::= '-'? [0-9]+ ('.' [0-9]*)? ([eE] [+-]? [0-9]+)? (with a '.' or an exponent)
//!              | 'inf' | '-inf' | 'nan'
//! string     ::= '"' (char | '\"' | '\\' | '\n' | '\t' | '\r' | '\' hex hex)* '"'
//! ```
//!
//! Meanings and rules:
//! - An op's name is `"pp."` followed by [`OpKind::name`](crate::ops::OpKind::name). Its
//!   signature lists one type per operand (each must equal the operand's type) and one per
//!   result; a single result type is printed bare, none or several in parentheses.
//! - In an op's attribute dictionary the keys `stage` (an integer) and `phase` (`"fwd"`,
//!   `"bwd_input"`, `"bwd_weight"`, `"optim"`) set [`OpData::stage`](crate::OpData) and
//!   [`OpData::phase`](crate::OpData); they print last, after the sorted attributes. In a
//!   function's `attributes` dictionary they are ordinary attributes.
//! - Attribute lists: all integers is an integer list; any float makes a float list; `[]`
//!   is an (empty) integer list.
//! - Names print bare when they are non-empty and made of name-chars, quoted otherwise.
//!   Values must be defined before use and only once per function.
//! - Dense tensors need a static type. Up to 16 elements print as a flat row-major list
//!   (floats in the shortest form that re-reads exactly in the dtype, `i1` as
//!   `true`/`false`); larger ones as `"0x..."`, the little-endian bytes of the elements in
//!   uppercase hex. Either form is accepted for any size.
//! - `weight @w : T = elided` (printed with [`PrintOptions::elide_weights_over`]) reads back
//!   as no weight at all.

mod lexer;
mod parser;
mod printer;
#[cfg(test)]
mod tests;

use std::fmt;

pub use parser::{parse_module, parse_type};
pub use printer::{print_function, print_module, print_op};

#[derive(Clone, Debug, Default)]
pub struct PrintOptions {
    /// Print weights with more elements than this as `elided` (lossy, for humans).
    pub elide_weights_over: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    pub message: String,
}

/// A 1-based source position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    pub(crate) fn error(self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col: self.col,
            message: message.into(),
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Characters of a bare `%value` or `@symbol` name.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '/' | '-')
}
