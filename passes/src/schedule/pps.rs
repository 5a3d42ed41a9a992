//! ppcc's schedule language (`.pps` files): compact per-rank programs over stages and
//! micro-batches that compile to a [`Schedule`] and then go through [`validate`].
//!
//! A file names a layout (`layout chain`, `layout interleaved EXPR`, `layout v`, `layout dag
//! on [...] edges [...]`) and gives one program for every rank (`rank r { ... }`, or
//! `rank 3 { ... }` for one rank), over the parameters `p` (ranks), `m` (micro-batches) and
//! `v` (chunks, from `--chunks`), bound by the caller ([`PpsParams`]) or pinned by the file
//! (`ranks 4`, `microbatches 8`). Programs use integer expressions, `let`, assignment,
//! `for`/`repeat`/`while` loops, `if`/`else`, `require`, procedures (`def`), and actions
//! `F(chunk, mb)`, `I`, `W`, `B`, `SEND_F`, `RECV_F`, `SEND_B`, `RECV_B`, `OPT(chunk)`; an
//! action with only a chunk (`F(1)`) takes that rank's next micro-batch of its kind and
//! chunk and is skipped past the last one; `defer`/`flush` hold actions back; `overlap { F
//! .. I .. W .. }` is DualPipeV's forward/backward pair. The full grammar and semantics are
//! in `docs/schedules.md`.
//!
//! [`parse`] + [`compile`] (or [`read_pps`]) read a file, [`to_pps`] writes any schedule
//! as a flat listing that reads back to the same schedule. Errors are [`PpsError`]s with a
//! line and column; the evaluator bounds its steps, actions and call depth, so a hostile
//! file can neither hang nor exhaust memory.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use super::{validate, Action, ActionKind, Layout, Schedule, ScheduleError};

/// Statements and loop iterations one compile may run.
pub const MAX_STEPS: u64 = 20_000_000;
/// Actions (emitted or deferred) one compile may produce at most; below that, no more than
/// a valid schedule of the layout can hold (8 per stage and micro-batch: F, I, W, B and the
/// four transfers, plus one OPT per stage).
pub const MAX_ACTIONS: usize = 20_000_000;
/// How deep blocks and expressions may nest in the text, and procedure calls at run time.
pub const MAX_DEPTH: usize = 64;

/// Where in the file (both from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A `.pps` error at a line and column.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {kind}")]
pub struct PpsError {
    pub line: usize,
    pub col: usize,
    pub kind: PpsErrorKind,
}

/// What is wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PpsErrorKind {
    #[error("unexpected character `{0}`")]
    Char(char),
    #[error("unterminated string")]
    UnterminatedString,
    #[error("integer literal out of range")]
    IntRange,
    #[error("expected {expected}, found {found}")]
    Expected { expected: String, found: String },
    #[error("nesting deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("unknown name `{0}`")]
    Unbound(String),
    #[error("`{0}` is already defined")]
    Redefined(String),
    #[error("`{0}` cannot be assigned")]
    ReadOnly(String),
    #[error("{name} takes {expected} argument(s), {found} given")]
    Arity {
        name: String,
        expected: usize,
        found: usize,
    },
    #[error("arithmetic overflow")]
    Overflow,
    #[error("division by zero")]
    DivZero,
    #[error("requirement failed: {0}")]
    Require(String),
    #[error("{what} {value} is out of range 0..{limit}")]
    Range {
        what: String,
        value: i64,
        limit: usize,
    },
    #[error("the program runs more than {MAX_STEPS} steps")]
    TooManySteps,
    /// More actions than any valid schedule of the layout and micro-batches has.
    #[error(
        "the program produces more than {0} actions (more than a valid schedule of this size has)"
    )]
    TooManyActions(usize),
    /// A header or parameter problem (layout, ranks, micro-batches, rank programs).
    #[error("{0}")]
    Invalid(String),
    /// The schedule the program built is not valid; the location is the action's statement.
    #[error("{0}")]
    Schedule(ScheduleError),
}

fn err<T>(pos: Pos, kind: PpsErrorKind) -> Result<T, PpsError> {
    Err(PpsError {
        line: pos.line,
        col: pos.col,
        kind,
    })
}

// ---------------------------------------------------------------------------------------
// Lexer

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Int(i64),
    Ident(String),
    Str(String),
    /// Punctuation and operators.
    Sym(&'static str),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Int(n) => write!(f, "`{n}`"),
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::Sym(s) => write!(f, "`{s}`"),
            Tok::Eof => write!(f, "end of file"),
        }
    }
}

const SYMBOLS: &[&str] = &[
    "..", "->", "+=", "-=", "==", "!=", "<=", ">=", "&&", "||", "(", ")", "{", "}", "[", "]", ",",
    ";", "=", "+", "-", "*", "/", "%", "<", ">", "!",
];

fn lex(text: &str) -> Result<Vec<(Tok, Pos)>, PpsError> {
    let mut out = vec![];
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    while i < chars.len() {
        let c = chars[i];
        let pos = Pos { line, col };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            col += i - start;
            let n = s
                .parse::<i64>()
                .or_else(|_| err(pos, PpsErrorKind::IntRange))?;
            out.push((Tok::Int(n), pos));
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            col += i - start;
            out.push((Tok::Ident(chars[start..i].iter().collect()), pos));
            continue;
        }
        if c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != '"' && chars[i] != '\n' {
                i += 1;
            }
            if i >= chars.len() || chars[i] != '"' {
                return err(pos, PpsErrorKind::UnterminatedString);
            }
            col += i + 1 - (start - 1);
            out.push((Tok::Str(chars[start..i].iter().collect()), pos));
            i += 1;
            continue;
        }
        let sym = SYMBOLS.iter().find(|s| {
            let n = s.len();
            i + n <= chars.len() && s.chars().zip(&chars[i..i + n]).all(|(a, &b)| a == b)
        });
        match sym {
            Some(s) => {
                i += s.len();
                col += s.len();
                out.push((Tok::Sym(s), pos));
            }
            None => return err(pos, PpsErrorKind::Char(c)),
        }
    }
    out.push((Tok::Eof, Pos { line, col }));
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Syntax

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

#[derive(Clone, Debug)]
enum Expr {
    Int(i64),
    Var(String, Pos),
    Neg(Box<Expr>, Pos),
    Not(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>, Pos),
    /// `min(...)` (`true`) or `max(...)`.
    MinMax(bool, Vec<Expr>),
    /// `next(KIND, chunk)`: the micro-batch the next auto-numbered action gets.
    Next(usize, Box<Expr>, Pos),
}

#[derive(Clone, Debug)]
struct Act {
    kind: ActionKind,
    chunk: Expr,
    /// `None`: auto-numbered.
    micro_batch: Option<Expr>,
    pos: Pos,
}

#[derive(Clone, Copy, Debug)]
enum AssignOp {
    Set,
    Add,
    Sub,
}

#[derive(Clone, Debug)]
enum Stmt {
    Let(String, Expr, Pos),
    Assign(String, AssignOp, Expr, Pos),
    For {
        var: String,
        lo: Expr,
        hi: Expr,
        body: Vec<Stmt>,
        pos: Pos,
    },
    Repeat(Expr, Vec<Stmt>, Pos),
    While(Expr, Vec<Stmt>, Pos),
    If(Vec<(Expr, Vec<Stmt>)>, Option<Vec<Stmt>>),
    Require(Expr, String, Pos),
    Act(Act),
    Defer(Act),
    Flush(Option<Expr>, Pos),
    Overlap(Vec<Act>),
    Call(String, Vec<Expr>, Pos),
}

#[derive(Clone, Debug)]
enum LayoutAst {
    Chain,
    Interleaved(Expr),
    V,
    Dag {
        on: Vec<i64>,
        edges: Vec<(i64, i64)>,
    },
}

#[derive(Clone, Debug)]
struct Def {
    params: Vec<String>,
    body: Vec<Stmt>,
}

/// A parsed `.pps` file, before the parameters are bound.
#[derive(Clone, Debug)]
pub struct Program {
    /// The `schedule "NAME"` line, if any.
    pub name: Option<String>,
    ranks: Option<(i64, Pos)>,
    microbatches: Option<(i64, Pos)>,
    layout: Option<(LayoutAst, Pos)>,
    requires: Vec<(Expr, String, Pos)>,
    defs: HashMap<String, Def>,
    generic: Option<(Vec<Stmt>, Pos)>,
    specific: Vec<(i64, Vec<Stmt>, Pos)>,
}

const KEYWORDS: &[&str] = &[
    "let", "for", "in", "repeat", "while", "if", "else", "require", "defer", "flush", "overlap",
    "def", "rank", "min", "max", "next",
];
const PARAMS: &[&str] = &["p", "m", "v", "r"];

fn action_kind(name: &str) -> Option<ActionKind> {
    Some(match name {
        "F" => ActionKind::Forward,
        "I" => ActionKind::BackwardInput,
        "W" => ActionKind::BackwardWeight,
        "B" => ActionKind::FullBackward,
        "SEND_F" => ActionKind::SendF,
        "RECV_F" => ActionKind::RecvF,
        "SEND_B" => ActionKind::SendB,
        "RECV_B" => ActionKind::RecvB,
        "OPT" => ActionKind::OptimizerStep,
        _ => return None,
    })
}

/// Index of a kind in a rank's auto-numbering counters.
fn kind_index(kind: ActionKind) -> usize {
    match kind {
        ActionKind::Forward => 0,
        ActionKind::BackwardInput => 1,
        ActionKind::BackwardWeight => 2,
        ActionKind::FullBackward => 3,
        ActionKind::SendF => 4,
        ActionKind::RecvF => 5,
        ActionKind::SendB => 6,
        ActionKind::RecvB => 7,
        ActionKind::OptimizerStep => 8,
    }
}

struct Parser {
    toks: Vec<(Tok, Pos)>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }
    fn peek2(&self) -> &Tok {
        &self.toks[(self.at + 1).min(self.toks.len() - 1)].0
    }
    fn pos(&self) -> Pos {
        self.toks[self.at].1
    }
    fn bump(&mut self) -> (Tok, Pos) {
        let t = self.toks[self.at].clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }
    fn expected<T>(&self, what: &str) -> Result<T, PpsError> {
        err(
            self.pos(),
            PpsErrorKind::Expected {
                expected: what.into(),
                found: self.peek().to_string(),
            },
        )
    }
    fn is_sym(&self, s: &str) -> bool {
        matches!(self.peek(), Tok::Sym(x) if *x == s)
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Tok::Ident(x) if x == w)
    }
    fn eat_sym(&mut self, s: &str) -> bool {
        if self.is_sym(s) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn expect_sym(&mut self, s: &str) -> Result<Pos, PpsError> {
        if self.is_sym(s) {
            Ok(self.bump().1)
        } else {
            self.expected(&format!("`{s}`"))
        }
    }
    fn expect_word(&mut self, w: &str) -> Result<Pos, PpsError> {
        if self.is_word(w) {
            Ok(self.bump().1)
        } else {
            self.expected(&format!("`{w}`"))
        }
    }
    /// A name a program may bind (not a keyword, parameter or action).
    fn name(&mut self) -> Result<(String, Pos), PpsError> {
        match self.peek().clone() {
            Tok::Ident(s)
                if !KEYWORDS.contains(&s.as_str())
                    && !PARAMS.contains(&s.as_str())
                    && action_kind(&s).is_none() =>
            {
                Ok((s, self.bump().1))
            }
            _ => self.expected("a name (not a keyword, parameter or action)"),
        }
    }
    fn int(&mut self) -> Result<i64, PpsError> {
        let neg = self.eat_sym("-");
        match self.peek().clone() {
            Tok::Int(n) => {
                self.bump();
                Ok(if neg { -n } else { n })
            }
            _ => self.expected("an integer"),
        }
    }
    fn string(&mut self) -> Result<String, PpsError> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                Ok(s)
            }
            _ => self.expected("a string in double quotes"),
        }
    }
    fn enter(&mut self) -> Result<(), PpsError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(self.pos(), PpsErrorKind::TooDeep);
        }
        Ok(())
    }

    fn program(&mut self) -> Result<Program, PpsError> {
        let mut prog = Program {
            name: None,
            ranks: None,
            microbatches: None,
            layout: None,
            requires: vec![],
            defs: HashMap::new(),
            generic: None,
            specific: vec![],
        };
        loop {
            let pos = self.pos();
            let word =
                match self.peek().clone() {
                    Tok::Eof => break,
                    Tok::Sym(";") => {
                        self.bump();
                        continue;
                    }
                    Tok::Ident(w) => w,
                    _ => return self.expected(
                        "`schedule`, `layout`, `ranks`, `microbatches`, `require`, `def` or `rank`",
                    ),
                };
            let once = |seen: bool| {
                if seen {
                    err(pos, PpsErrorKind::Redefined(word.clone()))
                } else {
                    Ok(())
                }
            };
            match word.as_str() {
                "schedule" => {
                    once(prog.name.is_some())?;
                    self.bump();
                    prog.name = Some(self.string()?);
                }
                "ranks" => {
                    once(prog.ranks.is_some())?;
                    self.bump();
                    prog.ranks = Some((self.int()?, pos));
                }
                "microbatches" => {
                    once(prog.microbatches.is_some())?;
                    self.bump();
                    prog.microbatches = Some((self.int()?, pos));
                }
                "layout" => {
                    once(prog.layout.is_some())?;
                    self.bump();
                    prog.layout = Some((self.layout()?, pos));
                }
                "require" => {
                    self.bump();
                    let (e, msg) = self.require_rest()?;
                    prog.requires.push((e, msg, pos));
                }
                "def" => {
                    self.bump();
                    let (name, npos) = self.name()?;
                    if prog.defs.contains_key(&name) {
                        return err(npos, PpsErrorKind::Redefined(name));
                    }
                    self.expect_sym("(")?;
                    let mut params: Vec<String> = vec![];
                    while !self.is_sym(")") {
                        let (p, ppos) = self.name()?;
                        if params.contains(&p) {
                            return err(ppos, PpsErrorKind::Redefined(p));
                        }
                        params.push(p);
                        if !self.eat_sym(",") {
                            break;
                        }
                    }
                    self.expect_sym(")")?;
                    let body = self.block()?;
                    prog.defs.insert(name, Def { params, body });
                }
                "rank" => {
                    self.bump();
                    match self.peek().clone() {
                        Tok::Ident(x) if x == "r" => {
                            self.bump();
                            once(prog.generic.is_some())?;
                            prog.generic = Some((self.block()?, pos));
                        }
                        Tok::Int(n) => {
                            self.bump();
                            if prog.specific.iter().any(|s| s.0 == n) {
                                return err(pos, PpsErrorKind::Redefined(format!("rank {n}")));
                            }
                            let body = self.block()?;
                            prog.specific.push((n, body, pos));
                        }
                        _ => return self.expected("`r` (every rank) or a rank number"),
                    }
                }
                _ => {
                    return self.expected(
                        "`schedule`, `layout`, `ranks`, `microbatches`, `require`, `def` or `rank`",
                    )
                }
            }
        }
        Ok(prog)
    }

    fn layout(&mut self) -> Result<LayoutAst, PpsError> {
        let word = match self.peek().clone() {
            Tok::Ident(w) => w,
            _ => return self.expected("`chain`, `interleaved`, `v` or `dag`"),
        };
        match word.as_str() {
            "chain" => {
                self.bump();
                Ok(LayoutAst::Chain)
            }
            "v" => {
                self.bump();
                Ok(LayoutAst::V)
            }
            "interleaved" => {
                self.bump();
                Ok(LayoutAst::Interleaved(self.expr()?))
            }
            "dag" => {
                self.bump();
                self.expect_word("on")?;
                self.expect_sym("[")?;
                let mut on = vec![];
                while !self.is_sym("]") {
                    on.push(self.int()?);
                    if !self.eat_sym(",") {
                        break;
                    }
                }
                self.expect_sym("]")?;
                self.expect_word("edges")?;
                self.expect_sym("[")?;
                let mut edges = vec![];
                while !self.is_sym("]") {
                    let a = self.int()?;
                    self.expect_sym("->")?;
                    let b = self.int()?;
                    edges.push((a, b));
                    if !self.eat_sym(",") {
                        break;
                    }
                }
                self.expect_sym("]")?;
                Ok(LayoutAst::Dag { on, edges })
            }
            _ => self.expected("`chain`, `interleaved`, `v` or `dag`"),
        }
    }

    fn require_rest(&mut self) -> Result<(Expr, String), PpsError> {
        let e = self.expr()?;
        let msg = if self.eat_sym(",") {
            self.string()?
        } else {
            String::new()
        };
        Ok((e, msg))
    }

    fn block(&mut self) -> Result<Vec<Stmt>, PpsError> {
        self.enter()?;
        self.expect_sym("{")?;
        let mut out = vec![];
        while !self.is_sym("}") {
            if self.eat_sym(";") {
                continue;
            }
            if *self.peek() == Tok::Eof {
                return self.expected("`}`");
            }
            out.push(self.stmt()?);
        }
        self.bump();
        self.depth -= 1;
        Ok(out)
    }

    fn action(&mut self) -> Result<Act, PpsError> {
        let pos = self.pos();
        let kind = match self.peek() {
            Tok::Ident(w) => action_kind(w),
            _ => None,
        };
        let Some(kind) = kind else {
            return self.expected("an action (F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, OPT)");
        };
        self.bump();
        self.expect_sym("(")?;
        let chunk = self.expr()?;
        let micro_batch = if self.eat_sym(",") {
            if kind == ActionKind::OptimizerStep {
                return err(
                    pos,
                    PpsErrorKind::Arity {
                        name: "OPT".into(),
                        expected: 1,
                        found: 2,
                    },
                );
            }
            Some(self.expr()?)
        } else {
            None
        };
        self.expect_sym(")")?;
        Ok(Act {
            kind,
            chunk,
            micro_batch,
            pos,
        })
    }

    fn stmt(&mut self) -> Result<Stmt, PpsError> {
        let pos = self.pos();
        let word = match self.peek().clone() {
            Tok::Ident(w) => w,
            _ => return self.expected("a statement"),
        };
        if action_kind(&word).is_some() {
            return Ok(Stmt::Act(self.action()?));
        }
        match word.as_str() {
            "let" => {
                self.bump();
                let (name, npos) = self.name()?;
                self.expect_sym("=")?;
                Ok(Stmt::Let(name, self.expr()?, npos))
            }
            "for" => {
                self.bump();
                let (var, _) = self.name()?;
                self.expect_word("in")?;
                let lo = self.expr()?;
                self.expect_sym("..")?;
                let hi = self.expr()?;
                let body = self.block()?;
                Ok(Stmt::For {
                    var,
                    lo,
                    hi,
                    body,
                    pos,
                })
            }
            "repeat" => {
                self.bump();
                let n = self.expr()?;
                Ok(Stmt::Repeat(n, self.block()?, pos))
            }
            "while" => {
                self.bump();
                let c = self.expr()?;
                Ok(Stmt::While(c, self.block()?, pos))
            }
            "if" => {
                self.bump();
                let mut branches = vec![];
                let c = self.expr()?;
                branches.push((c, self.block()?));
                let mut otherwise = None;
                while self.is_word("else") {
                    self.bump();
                    if self.is_word("if") {
                        self.bump();
                        let c = self.expr()?;
                        branches.push((c, self.block()?));
                    } else {
                        otherwise = Some(self.block()?);
                        break;
                    }
                }
                Ok(Stmt::If(branches, otherwise))
            }
            "require" => {
                self.bump();
                let (e, msg) = self.require_rest()?;
                Ok(Stmt::Require(e, msg, pos))
            }
            "defer" => {
                self.bump();
                Ok(Stmt::Defer(self.action()?))
            }
            "flush" => {
                self.bump();
                // `flush N` when an expression follows on the same line.
                let n = match self.peek() {
                    Tok::Int(_) | Tok::Sym("(") => Some(self.expr()?),
                    Tok::Ident(w)
                        if self.pos().line == pos.line
                            && action_kind(w).is_none()
                            && !KEYWORDS.contains(&w.as_str())
                            && !matches!(self.peek2(), Tok::Sym("=" | "+=" | "-=" | "(")) =>
                    {
                        Some(self.expr()?)
                    }
                    _ => None,
                };
                Ok(Stmt::Flush(n, pos))
            }
            "overlap" => {
                self.bump();
                self.expect_sym("{")?;
                let first = self.action()?;
                if first.kind != ActionKind::Forward {
                    return err(
                        first.pos,
                        PpsErrorKind::Expected {
                            expected: "a forward `F` to open the overlapped pair".into(),
                            found: format!("`{}`", first.kind.code()),
                        },
                    );
                }
                let mut acts = vec![first];
                while !self.is_sym("}") {
                    if self.eat_sym(";") {
                        continue;
                    }
                    let a = self.action()?;
                    if !matches!(
                        a.kind,
                        ActionKind::BackwardInput
                            | ActionKind::BackwardWeight
                            | ActionKind::FullBackward
                    ) {
                        return err(
                            a.pos,
                            PpsErrorKind::Expected {
                                expected: "a backward `I`, `W` or `B` after the pair's forward"
                                    .into(),
                                found: format!("`{}`", a.kind.code()),
                            },
                        );
                    }
                    acts.push(a);
                }
                self.bump();
                if acts.len() < 2 {
                    return err(
                        pos,
                        PpsErrorKind::Invalid(
                            "an overlapped pair needs a forward and a backward".into(),
                        ),
                    );
                }
                Ok(Stmt::Overlap(acts))
            }
            _ => {
                if KEYWORDS.contains(&word.as_str()) {
                    return self.expected("a statement");
                }
                self.bump();
                if let Tok::Sym(s @ ("=" | "+=" | "-=")) = self.peek().clone() {
                    self.bump();
                    let op = match s {
                        "=" => AssignOp::Set,
                        "+=" => AssignOp::Add,
                        _ => AssignOp::Sub,
                    };
                    return Ok(Stmt::Assign(word, op, self.expr()?, pos));
                }
                if self.eat_sym("(") {
                    let args = self.args()?;
                    return Ok(Stmt::Call(word, args, pos));
                }
                self.at -= 1;
                self.expected("a statement (`NAME = ...`, `NAME(...)`, an action or a keyword)")
            }
        }
    }

    /// Arguments after `(`, through `)`.
    fn args(&mut self) -> Result<Vec<Expr>, PpsError> {
        let mut args = vec![];
        while !self.is_sym(")") {
            args.push(self.expr()?);
            if !self.eat_sym(",") {
                break;
            }
        }
        self.expect_sym(")")?;
        Ok(args)
    }

    fn expr(&mut self) -> Result<Expr, PpsError> {
        self.enter()?;
        let e = self.binary(0);
        self.depth -= 1;
        e
    }

    /// Precedence climbing: `||` < `&&` < comparisons < `+ -` < `* / %`.
    fn binary(&mut self, level: usize) -> Result<Expr, PpsError> {
        const LEVELS: &[&[(&str, BinOp)]] = &[
            &[("||", BinOp::Or)],
            &[("&&", BinOp::And)],
            &[
                ("==", BinOp::Eq),
                ("!=", BinOp::Ne),
                ("<=", BinOp::Le),
                (">=", BinOp::Ge),
                ("<", BinOp::Lt),
                (">", BinOp::Gt),
            ],
            &[("+", BinOp::Add), ("-", BinOp::Sub)],
            &[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)],
        ];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut lhs = self.binary(level + 1)?;
        loop {
            let op = LEVELS[level]
                .iter()
                .find(|(s, _)| self.is_sym(s))
                .map(|x| x.1);
            let Some(op) = op else { break };
            let pos = self.bump().1;
            let rhs = self.binary(level + 1)?;
            lhs = Expr::Bin(op, Box::new(lhs), Box::new(rhs), pos);
            // Comparisons do not chain.
            if level == 2 {
                break;
            }
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, PpsError> {
        let pos = self.pos();
        if self.eat_sym("-") {
            self.enter()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Neg(Box::new(e), pos));
        }
        if self.eat_sym("!") {
            self.enter()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(e)));
        }
        match self.peek().clone() {
            Tok::Int(n) => {
                self.bump();
                Ok(Expr::Int(n))
            }
            Tok::Sym("(") => {
                self.bump();
                let e = self.expr()?;
                self.expect_sym(")")?;
                Ok(e)
            }
            Tok::Ident(w) if w == "min" || w == "max" => {
                self.bump();
                self.expect_sym("(")?;
                let args = self.args()?;
                if args.is_empty() {
                    return err(
                        pos,
                        PpsErrorKind::Arity {
                            name: w,
                            expected: 1,
                            found: 0,
                        },
                    );
                }
                Ok(Expr::MinMax(w == "min", args))
            }
            Tok::Ident(w) if w == "next" => {
                self.bump();
                self.expect_sym("(")?;
                let kind = match self.peek() {
                    Tok::Ident(k) => action_kind(k).filter(|k| *k != ActionKind::OptimizerStep),
                    _ => None,
                };
                let Some(kind) = kind else {
                    return self
                        .expected("an action kind (F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B)");
                };
                self.bump();
                self.expect_sym(",")?;
                let c = self.expr()?;
                self.expect_sym(")")?;
                Ok(Expr::Next(kind_index(kind), Box::new(c), pos))
            }
            Tok::Ident(w) if !KEYWORDS.contains(&w.as_str()) && action_kind(&w).is_none() => {
                self.bump();
                Ok(Expr::Var(w, pos))
            }
            _ => self.expected("an expression"),
        }
    }
}

/// Parse a `.pps` file (syntax only; [`compile`] binds the parameters and runs it).
pub fn parse(text: &str) -> Result<Program, PpsError> {
    let toks = lex(text)?;
    Parser {
        toks,
        at: 0,
        depth: 0,
    }
    .program()
}

// ---------------------------------------------------------------------------------------
// Evaluation

/// The caller's values of the parameters (`--stages`, `--microbatches`, `--chunks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PpsParams {
    /// `p`; the file's `ranks N` line pins it (a different value here is an error).
    pub ranks: Option<usize>,
    /// `m`; the file's `microbatches N` line pins it.
    pub microbatches: Option<usize>,
    /// `v` (default 1).
    pub chunks: Option<usize>,
}

/// One rank's run of its program.
struct Run<'a> {
    prog: &'a Program,
    /// Stages of this rank, by chunk.
    stages: Vec<usize>,
    p: i64,
    m: i64,
    v: i64,
    r: i64,
    scopes: Vec<Vec<(String, i64)>>,
    next: Vec<[i64; 9]>,
    out: Vec<(Action, Pos)>,
    deferred: VecDeque<(Action, Pos)>,
    steps: &'a mut u64,
    actions: &'a mut usize,
    max_actions: usize,
    calls: usize,
}

fn checked(pos: Pos, v: Option<i64>) -> Result<i64, PpsError> {
    match v {
        Some(v) => Ok(v),
        None => err(pos, PpsErrorKind::Overflow),
    }
}

impl Run<'_> {
    fn step(&mut self, pos: Pos) -> Result<(), PpsError> {
        *self.steps += 1;
        if *self.steps > MAX_STEPS {
            return err(pos, PpsErrorKind::TooManySteps);
        }
        Ok(())
    }

    fn lookup(&self, name: &str, pos: Pos) -> Result<i64, PpsError> {
        match name {
            "p" => return Ok(self.p),
            "m" => return Ok(self.m),
            "v" => return Ok(self.v),
            "r" => return Ok(self.r),
            _ => {}
        }
        if let Some(scope) = self.scopes.last() {
            // The innermost scope list holds the current procedure's (or rank's) frames.
            if let Some((_, v)) = scope.iter().rev().find(|(n, _)| n == name) {
                return Ok(*v);
            }
        }
        err(pos, PpsErrorKind::Unbound(name.into()))
    }

    fn eval(&self, e: &Expr) -> Result<i64, PpsError> {
        Ok(match e {
            Expr::Int(n) => *n,
            Expr::Var(name, pos) => self.lookup(name, *pos)?,
            Expr::Neg(x, pos) => checked(*pos, self.eval(x)?.checked_neg())?,
            Expr::Not(x) => (self.eval(x)? == 0) as i64,
            Expr::Bin(op, a, b, pos) => {
                let a = self.eval(a)?;
                // Short-circuit.
                match op {
                    BinOp::And if a == 0 => return Ok(0),
                    BinOp::Or if a != 0 => return Ok(1),
                    _ => {}
                }
                let b = self.eval(b)?;
                match op {
                    BinOp::Add => checked(*pos, a.checked_add(b))?,
                    BinOp::Sub => checked(*pos, a.checked_sub(b))?,
                    BinOp::Mul => checked(*pos, a.checked_mul(b))?,
                    BinOp::Div | BinOp::Rem if b == 0 => return err(*pos, PpsErrorKind::DivZero),
                    BinOp::Div => checked(*pos, a.checked_div(b))?,
                    BinOp::Rem => checked(*pos, a.checked_rem(b))?,
                    BinOp::Eq => (a == b) as i64,
                    BinOp::Ne => (a != b) as i64,
                    BinOp::Lt => (a < b) as i64,
                    BinOp::Le => (a <= b) as i64,
                    BinOp::Gt => (a > b) as i64,
                    BinOp::Ge => (a >= b) as i64,
                    BinOp::And | BinOp::Or => (b != 0) as i64,
                }
            }
            Expr::MinMax(is_min, args) => {
                let mut acc = self.eval(&args[0])?;
                for a in &args[1..] {
                    let x = self.eval(a)?;
                    acc = if *is_min { acc.min(x) } else { acc.max(x) };
                }
                acc
            }
            Expr::Next(k, c, pos) => {
                let c = self.chunk(self.eval(c)?, *pos)?;
                self.next[c][*k]
            }
        })
    }

    fn chunk(&self, c: i64, pos: Pos) -> Result<usize, PpsError> {
        if c < 0 || c as u64 >= self.stages.len() as u64 {
            return err(
                pos,
                PpsErrorKind::Range {
                    what: format!("chunk of rank {}", self.r),
                    value: c,
                    limit: self.stages.len(),
                },
            );
        }
        Ok(c as usize)
    }

    /// The action `a` names now (`None`: an auto-numbered one past the last micro-batch).
    fn action(&mut self, a: &Act) -> Result<Option<Action>, PpsError> {
        let c = self.chunk(self.eval(&a.chunk)?, a.pos)?;
        let mb = match &a.micro_batch {
            Some(e) => {
                let mb = self.eval(e)?;
                if mb < 0 || mb >= self.m {
                    return err(
                        a.pos,
                        PpsErrorKind::Range {
                            what: "micro-batch".into(),
                            value: mb,
                            limit: self.m as usize,
                        },
                    );
                }
                mb
            }
            None if a.kind == ActionKind::OptimizerStep => 0,
            None => {
                let slot = &mut self.next[c][kind_index(a.kind)];
                let mb = *slot;
                *slot += 1;
                if mb >= self.m {
                    return Ok(None);
                }
                mb
            }
        };
        *self.actions += 1;
        if *self.actions > self.max_actions {
            return err(a.pos, PpsErrorKind::TooManyActions(self.max_actions));
        }
        Ok(Some(Action::new(a.kind, self.stages[c], mb as usize, c)))
    }

    fn emit(&mut self, a: &Act) -> Result<(), PpsError> {
        if let Some(x) = self.action(a)? {
            self.out.push((x, a.pos));
        }
        Ok(())
    }

    fn frame(&mut self) -> &mut Vec<(String, i64)> {
        if self.scopes.is_empty() {
            self.scopes.push(vec![]);
        }
        let n = self.scopes.len();
        &mut self.scopes[n - 1]
    }

    /// Run a block: names it binds go out of scope at its end.
    fn block(&mut self, body: &[Stmt]) -> Result<(), PpsError> {
        let mark = self.frame().len();
        let r = body.iter().try_for_each(|s| self.stmt(s));
        self.frame().truncate(mark);
        r
    }

    fn set(&mut self, name: &str, value: i64, pos: Pos) -> Result<(), PpsError> {
        if PARAMS.contains(&name) {
            return err(pos, PpsErrorKind::ReadOnly(name.into()));
        }
        match self.frame().iter_mut().rev().find(|(n, _)| n == name) {
            Some(slot) => {
                slot.1 = value;
                Ok(())
            }
            None => err(pos, PpsErrorKind::Unbound(name.into())),
        }
    }

    fn count(&self, e: &Expr, pos: Pos, what: &str) -> Result<i64, PpsError> {
        let n = self.eval(e)?;
        if n < 0 {
            return err(
                pos,
                PpsErrorKind::Invalid(format!("{what} count {n} is negative")),
            );
        }
        Ok(n)
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), PpsError> {
        match s {
            Stmt::Let(name, e, pos) => {
                self.step(*pos)?;
                let v = self.eval(e)?;
                // Names only pile up within one block's straight-line code, bounded by the
                // program's length; a loop's are dropped at the end of each iteration.
                self.frame().push((name.clone(), v));
            }
            Stmt::Assign(name, op, e, pos) => {
                self.step(*pos)?;
                let v = self.eval(e)?;
                let v = match op {
                    AssignOp::Set => v,
                    AssignOp::Add => checked(*pos, self.lookup(name, *pos)?.checked_add(v))?,
                    AssignOp::Sub => checked(*pos, self.lookup(name, *pos)?.checked_sub(v))?,
                };
                self.set(name, v, *pos)?;
            }
            Stmt::For {
                var,
                lo,
                hi,
                body,
                pos,
            } => {
                self.step(*pos)?;
                let (lo, hi) = (self.eval(lo)?, self.eval(hi)?);
                let mut i = lo;
                while i < hi {
                    self.step(*pos)?;
                    self.frame().push((var.clone(), i));
                    let r = self.block(body);
                    self.frame().pop();
                    r?;
                    i += 1;
                }
            }
            Stmt::Repeat(n, body, pos) => {
                self.step(*pos)?;
                let n = self.count(n, *pos, "repeat")?;
                for _ in 0..n {
                    self.step(*pos)?;
                    self.block(body)?;
                }
            }
            Stmt::While(c, body, pos) => {
                self.step(*pos)?;
                while self.eval(c)? != 0 {
                    self.step(*pos)?;
                    self.block(body)?;
                }
            }
            Stmt::If(branches, otherwise) => {
                for (c, body) in branches {
                    if self.eval(c)? != 0 {
                        return self.block(body);
                    }
                }
                if let Some(body) = otherwise {
                    self.block(body)?;
                }
            }
            Stmt::Require(c, msg, pos) => {
                self.step(*pos)?;
                if self.eval(c)? == 0 {
                    return err(*pos, PpsErrorKind::Require(msg.clone()));
                }
            }
            Stmt::Act(a) => {
                self.step(a.pos)?;
                self.emit(a)?;
            }
            Stmt::Defer(a) => {
                self.step(a.pos)?;
                if let Some(x) = self.action(a)? {
                    self.deferred.push_back((x, a.pos));
                }
            }
            Stmt::Flush(n, pos) => {
                self.step(*pos)?;
                let n = match n {
                    Some(e) => self.count(e, *pos, "flush")? as u64,
                    None => u64::MAX,
                };
                let mut k = 0u64;
                while k < n {
                    let Some(x) = self.deferred.pop_front() else {
                        break;
                    };
                    self.out.push(x);
                    k += 1;
                }
            }
            Stmt::Overlap(acts) => {
                for a in acts {
                    self.step(a.pos)?;
                    self.emit(a)?;
                }
            }
            Stmt::Call(name, args, pos) => {
                self.step(*pos)?;
                let prog = self.prog;
                let Some(def) = prog.defs.get(name) else {
                    return err(*pos, PpsErrorKind::Unbound(name.clone()));
                };
                if def.params.len() != args.len() {
                    return err(
                        *pos,
                        PpsErrorKind::Arity {
                            name: name.clone(),
                            expected: def.params.len(),
                            found: args.len(),
                        },
                    );
                }
                let values = args
                    .iter()
                    .map(|a| self.eval(a))
                    .collect::<Result<Vec<_>, _>>()?;
                if self.calls >= MAX_DEPTH {
                    return err(*pos, PpsErrorKind::TooDeep);
                }
                self.calls += 1;
                // A procedure sees the parameters, `r` and its own arguments only.
                self.scopes
                    .push(def.params.iter().cloned().zip(values).collect());
                let r = self.block(&def.body);
                self.scopes.pop();
                self.calls -= 1;
                r?;
            }
        }
        Ok(())
    }
}

fn to_usize(v: i64, pos: Pos, what: &str) -> Result<usize, PpsError> {
    usize::try_from(v).or_else(|_| {
        err(
            pos,
            PpsErrorKind::Invalid(format!("{what} {v} is negative")),
        )
    })
}

/// Bind one parameter: the file's pinned value, the caller's, or an error.
fn bind(
    pinned: Option<(i64, Pos)>,
    given: Option<usize>,
    name: &str,
    option: &str,
) -> Result<usize, PpsError> {
    let value = match (pinned, given) {
        (Some((v, pos)), Some(g)) => {
            let v = to_usize(v, pos, name)?;
            if v != g {
                return err(
                    pos,
                    PpsErrorKind::Invalid(format!(
                        "the file is written for {v} {name}, {option} gives {g}"
                    )),
                );
            }
            v
        }
        (Some((v, pos)), None) => to_usize(v, pos, name)?,
        (None, Some(g)) => g,
        (None, None) => {
            return err(
                Pos { line: 1, col: 1 },
                PpsErrorKind::Invalid(format!(
                    "the number of {name} is not given ({option}, or a `{}` line in the file)",
                    if name == "ranks" {
                        "ranks N"
                    } else {
                        "microbatches N"
                    }
                )),
            )
        }
    };
    if value == 0 {
        let pos = pinned.map_or(Pos { line: 1, col: 1 }, |x| x.1);
        return err(
            pos,
            PpsErrorKind::Invalid(format!("the number of {name} must be at least 1")),
        );
    }
    Ok(value)
}

impl Program {
    fn layout_of(&self, p: usize, scratch: &Run) -> Result<Layout, PpsError> {
        let Some((ast, pos)) = &self.layout else {
            return err(
                Pos { line: 1, col: 1 },
                PpsErrorKind::Invalid(
                    "no `layout` line (`layout chain`, `layout interleaved v`, `layout v`, `layout dag ...`)"
                        .into(),
                ),
            );
        };
        Ok(match ast {
            LayoutAst::Chain => Layout::chain(p),
            LayoutAst::V => Layout::VShape { ranks: p },
            LayoutAst::Interleaved(e) => {
                let v = scratch.eval(e)?;
                if v < 1 {
                    return err(
                        *pos,
                        PpsErrorKind::Invalid(format!(
                            "an interleaved layout needs at least 1 chunk, not {v}"
                        )),
                    );
                }
                let chunks = to_usize(v, *pos, "chunks")?;
                Layout::Interleaved { ranks: p, chunks }
            }
            LayoutAst::Dag { on, edges } => {
                let mut rank_of = vec![];
                for &r in on {
                    if r < 0 || r as u64 >= p as u64 {
                        return err(
                            *pos,
                            PpsErrorKind::Range {
                                what: "the rank of a stage".into(),
                                value: r,
                                limit: p,
                            },
                        );
                    }
                    rank_of.push(r as usize);
                }
                let n = rank_of.len();
                let mut es = vec![];
                for &(a, b) in edges {
                    for x in [a, b] {
                        if x < 0 || x as u64 >= n as u64 {
                            return err(
                                *pos,
                                PpsErrorKind::Range {
                                    what: "the stage of an edge".into(),
                                    value: x,
                                    limit: n,
                                },
                            );
                        }
                    }
                    es.push((a as usize, b as usize));
                }
                Layout::Dag {
                    ranks: p,
                    rank_of,
                    edges: es,
                }
            }
        })
    }
}

/// Run a parsed program for the given parameters and [`validate`] the schedule; a problem
/// with an action (or a deadlock) is reported at the statement that emitted it.
pub fn compile(prog: &Program, params: PpsParams) -> Result<Schedule, PpsError> {
    let p = bind(prog.ranks, params.ranks, "ranks", "--stages")?;
    let m = bind(
        prog.microbatches,
        params.microbatches,
        "micro-batches",
        "--microbatches",
    )?;
    let v = params.chunks.unwrap_or(1);
    let start = Pos { line: 1, col: 1 };
    let as_i64 = |x: usize| {
        i64::try_from(x).or_else(|_| err(start, PpsErrorKind::Invalid(format!("{x} is too large"))))
    };
    let (pi, mi, vi) = (as_i64(p)?, as_i64(m)?, as_i64(v)?);
    // Top-level requirements and the layout see p, m and v (r is 0).
    let layout = {
        let mut dummy_steps = 0u64;
        let mut dummy_actions = 0usize;
        let scratch = Run {
            prog,
            stages: vec![],
            p: pi,
            m: mi,
            v: vi,
            r: 0,
            scopes: vec![vec![]],
            next: vec![],
            out: vec![],
            deferred: VecDeque::new(),
            steps: &mut dummy_steps,
            actions: &mut dummy_actions,
            max_actions: 0,
            calls: 0,
        };
        for (c, msg, pos) in &prog.requires {
            if scratch.eval(c)? == 0 {
                return err(*pos, PpsErrorKind::Require(msg.clone()));
            }
        }
        prog.layout_of(p, &scratch)?
    };
    super::generators::check_size(layout.num_virtual_stages(), m).map_err(|e| PpsError {
        line: prog.layout.as_ref().map_or(1, |l| l.1.line),
        col: prog.layout.as_ref().map_or(1, |l| l.1.col),
        kind: PpsErrorKind::Schedule(e),
    })?;
    let max_actions = layout
        .num_virtual_stages()
        .saturating_mul(m)
        .saturating_mul(8)
        .saturating_add(layout.num_virtual_stages())
        .min(MAX_ACTIONS);
    let (mut steps, mut actions) = (0u64, 0usize);
    let mut run = |r: usize, body: &[Stmt], stages: Vec<usize>| {
        let mut run = Run {
            prog,
            next: vec![[0; 9]; stages.len()],
            stages,
            p: pi,
            m: mi,
            v: vi,
            r: r as i64,
            scopes: vec![vec![]],
            out: vec![],
            deferred: VecDeque::new(),
            steps: &mut steps,
            actions: &mut actions,
            max_actions,
            calls: 0,
        };
        run.block(body)?;
        let mut out = run.out;
        // What is still deferred at the end runs at the end.
        out.extend(run.deferred);
        Ok::<_, PpsError>(out)
    };
    for (n, _, pos) in &prog.specific {
        if *n < 0 || *n as u64 >= p as u64 {
            return err(
                *pos,
                PpsErrorKind::Range {
                    what: "rank".into(),
                    value: *n,
                    limit: p,
                },
            );
        }
    }
    let mut schedule = Schedule::empty(layout.clone(), m);
    let mut positions: Vec<Vec<Pos>> = vec![vec![]; p];
    let mut stages_of: Vec<Vec<usize>> = vec![vec![]; p];
    for s in 0..layout.num_virtual_stages() {
        stages_of[layout.rank_of(s)].push(s);
    }
    for (r, stages) in stages_of.into_iter().enumerate() {
        let body = match prog.specific.iter().find(|s| s.0 as u64 == r as u64) {
            Some((_, body, _)) => body,
            None => match &prog.generic {
                Some((body, _)) => body,
                None => {
                    return err(
                        start,
                        PpsErrorKind::Invalid(format!(
                        "no program for rank {r} (add `rank r {{ ... }}` or `rank {r} {{ ... }}`)"
                    )),
                    )
                }
            },
        };
        for (a, pos) in run(r, body, stages)? {
            schedule.per_rank[r].push(a);
            positions[r].push(pos);
        }
    }
    let first_rank = prog
        .generic
        .as_ref()
        .map(|g| g.1)
        .or_else(|| prog.specific.first().map(|s| s.2))
        .unwrap_or(start);
    match validate(&schedule) {
        Ok(()) => Ok(schedule),
        Err(e) => {
            let at = match &e {
                ScheduleError::Action { rank, position, .. } => {
                    positions.get(*rank).and_then(|l| l.get(*position)).copied()
                }
                ScheduleError::Deadlock(blocked) => blocked
                    .first()
                    .and_then(|b| positions.get(b.rank).and_then(|l| l.get(b.position)))
                    .copied(),
                _ => None,
            };
            err(at.unwrap_or(first_rank), PpsErrorKind::Schedule(e))
        }
    }
}

/// [`parse`] then [`compile`].
pub fn read_pps(text: &str, params: PpsParams) -> Result<Schedule, PpsError> {
    compile(&parse(text)?, params)
}

/// Any schedule as `.pps`: its ranks, micro-batches and layout pinned, and a flat listing of
/// each rank's actions (`F(chunk, mb)`), which [`read_pps`] reads back to the same schedule.
pub fn to_pps(s: &Schedule) -> String {
    let mut out = String::from("# written by ppcc: one explicit program per rank\n");
    out.push_str(&format!(
        "ranks {}\nmicrobatches {}\n",
        s.layout.num_ranks(),
        s.num_microbatches
    ));
    match &s.layout {
        Layout::Interleaved { chunks: 1, .. } => out.push_str("layout chain\n"),
        Layout::Interleaved { chunks, .. } => {
            out.push_str(&format!("layout interleaved {chunks}\n"))
        }
        Layout::VShape { .. } => out.push_str("layout v\n"),
        Layout::Dag { rank_of, edges, .. } => {
            let on: Vec<String> = rank_of.iter().map(|r| r.to_string()).collect();
            let es: Vec<String> = edges.iter().map(|(a, b)| format!("{a} -> {b}")).collect();
            out.push_str(&format!(
                "layout dag on [{}] edges [{}]\n",
                on.join(", "),
                es.join(", ")
            ));
        }
    }
    for (r, list) in s.per_rank.iter().enumerate() {
        out.push_str(&format!("rank {r} {{\n"));
        for line in list.chunks(8) {
            let cells: Vec<String> = line
                .iter()
                .map(|a| {
                    let c = s.layout.chunk_of(a.stage);
                    if a.kind == ActionKind::OptimizerStep {
                        format!("OPT({c})")
                    } else {
                        format!("{}({c}, {})", a.kind.code(), a.micro_batch)
                    }
                })
                .collect();
            out.push_str("  ");
            out.push_str(&cells.join(" "));
            out.push('\n');
        }
        out.push_str("}\n");
    }
    out
}
