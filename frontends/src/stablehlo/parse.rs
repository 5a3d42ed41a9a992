//! The StableHLO text reader: both the pretty syntax JAX prints
//! (`jax.jit(f).lower(..).as_text()`) and MLIR's generic op form, into one op list.
//!
//! The generic form is regular (`%r = "stablehlo.add"(%a, %b) <{props}> ({regions}) {attrs}
//! : (types) -> types`). The pretty form has per-op syntax; every pretty op JAX emits is an
//! op name followed by comma-separated items (operands, `key = value` keywords, bare
//! enum words, a slice spec `[a:b:s, ..]`) up to the type signature, plus three ops with
//! parenthesised operands (`reduce`, `convolution`, `call`). Keywords are renamed to the
//! generic attribute names here ([`normalize`]), so the lowering reads one spelling.

use super::{Pos, StableHloError};

/// An element type and a static shape: `tensor<2x8xf32>`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TType {
    pub dims: Vec<u64>,
    pub elem: String,
}

/// An attribute value, as written.
#[derive(Clone, Debug, PartialEq)]
pub enum AVal {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// A bare word: `DEFAULT`, `LT`, `b`.
    Word(String),
    List(Vec<AVal>),
    /// `array<i64: 1, 2>`
    Ints(Vec<i64>),
    /// `dense<raw> : type`
    Dense {
        raw: String,
        ty: TType,
    },
    /// `#name<raw>` (`#stablehlo.dot<...>`, `#stablehlo<comparison_direction LT>`)
    Hash {
        name: String,
        body: String,
    },
    Sym(String),
    Dict(Vec<(String, AVal)>),
    Type(TType),
    FuncType(Vec<TType>, Vec<TType>),
    /// `[0] x [1]` (dot_general's pretty dimension pairs)
    Pair(Box<AVal>, Box<AVal>),
    /// `[0:2, 1:4:2]`: (start, limit, stride) per axis
    Slices(Vec<(i64, i64, i64)>),
}

/// A block: its arguments and ops.
#[derive(Clone, Debug, Default)]
pub struct Block {
    pub args: Vec<(String, TType)>,
    pub ops: Vec<Op>,
}

/// One operation in either form.
#[derive(Clone, Debug)]
pub struct Op {
    /// `stablehlo.add`, `func.func`, `func.call`, `func.return`...
    pub name: String,
    pub results: Vec<String>,
    pub operands: Vec<String>,
    pub attrs: Vec<(String, AVal)>,
    pub regions: Vec<Block>,
    pub operand_types: Vec<TType>,
    pub result_types: Vec<TType>,
    pub pos: Pos,
}

impl Op {
    pub fn attr(&self, name: &str) -> Option<&AVal> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// The most results one op may declare (`%0:N`).
const MAX_RESULTS: i64 = 64;

/// Read a whole file: the top-level ops (a `module`, or functions).
pub fn parse(text: &str) -> Result<Vec<Op>, StableHloError> {
    let mut c = Cursor::new(text);
    let mut ops = vec![];
    loop {
        c.ws();
        if c.at_end() {
            break;
        }
        ops.push(c.op()?);
    }
    Ok(ops)
}

/// The deepest nesting of brackets the reader follows (a hostile file cannot overflow
/// the stack).
const MAX_DEPTH: usize = 64;

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
    line: u32,
    col: u32,
    depth: usize,
}

type R<T> = Result<T, StableHloError>;

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$' | b'-')
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor {
            s: text.as_bytes(),
            i: 0,
            line: 1,
            col: 1,
            depth: 0,
        }
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col,
        }
    }

    fn err<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(StableHloError::syntax(self.pos(), msg))
    }

    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn peek_at(&self, k: usize) -> Option<u8> {
        self.s.get(self.i + k).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        if b == b'\n' {
            self.line += 1;
            self.col = 1;
        } else if b & 0xC0 != 0x80 {
            self.col += 1;
        }
        Some(b)
    }

    fn ws(&mut self) {
        while let Some(b) = self.peek() {
            if b.is_ascii_whitespace() {
                self.bump();
            } else if b == b'/' && self.peek_at(1) == Some(b'/') {
                while let Some(b) = self.bump() {
                    if b == b'\n' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
    }

    fn starts(&self, t: &str) -> bool {
        self.s[self.i.min(self.s.len())..].starts_with(t.as_bytes())
    }

    /// Skip white space, then consume `t` if it is next.
    fn eat(&mut self, t: &str) -> bool {
        self.ws();
        if self.starts(t) {
            for _ in 0..t.len() {
                self.bump();
            }
            true
        } else {
            false
        }
    }

    /// Consume the word `w` if it is next and not the start of a longer word.
    fn eat_word(&mut self, w: &str) -> bool {
        self.ws();
        if self.starts(w) && !self.peek_at(w.len()).is_some_and(is_ident) {
            for _ in 0..w.len() {
                self.bump();
            }
            true
        } else {
            false
        }
    }

    fn expect_token(&mut self, t: &str) -> R<()> {
        if self.eat(t) {
            Ok(())
        } else {
            let found = self.found();
            self.err(format!("expected `{t}`, found {found}"))
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the file".into(),
            Some(_) => {
                let rest = &self.s[self.i..];
                let n = rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .unwrap_or(rest.len())
                    .min(24);
                format!("`{}`", String::from_utf8_lossy(&rest[..n]))
            }
        }
    }

    fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err(format!("nesting deeper than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn ident(&mut self) -> R<String> {
        self.ws();
        match self.peek() {
            Some(b) if is_ident_start(b) => {
                let start = self.i;
                while self.peek().is_some_and(is_ident) {
                    self.bump();
                }
                Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
            }
            _ => {
                let found = self.found();
                self.err(format!("expected a name, found {found}"))
            }
        }
    }

    /// `%name` (returned without the `%`).
    fn value_name(&mut self) -> R<String> {
        self.ws();
        if self.peek() != Some(b'%') {
            let found = self.found();
            return self.err(format!("expected a value (`%name`), found {found}"));
        }
        self.bump();
        let start = self.i;
        while self.peek().is_some_and(|b| is_ident(b) || b == b'#') {
            self.bump();
        }
        if start == self.i {
            return self.err("expected a value name after `%`");
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn symbol(&mut self) -> R<String> {
        self.ws();
        if !self.eat("@") {
            let found = self.found();
            return self.err(format!("expected a symbol (`@name`), found {found}"));
        }
        if self.peek() == Some(b'"') {
            return self.string();
        }
        let start = self.i;
        while self.peek().is_some_and(is_ident) {
            self.bump();
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn string(&mut self) -> R<String> {
        self.ws();
        if self.peek() != Some(b'"') {
            let found = self.found();
            return self.err(format!("expected a string, found {found}"));
        }
        self.bump();
        let mut out = vec![];
        loop {
            match self.bump() {
                None => return self.err("unterminated string"),
                Some(b'"') => break,
                Some(b'\\') => match self.bump() {
                    Some(b'n') => out.push(b'\n'),
                    Some(b't') => out.push(b'\t'),
                    Some(b) if b.is_ascii_hexdigit() => {
                        let Some(b2) = self.bump().filter(u8::is_ascii_hexdigit) else {
                            return self.err("bad escape in a string");
                        };
                        let hex = [b, b2];
                        let s = std::str::from_utf8(&hex).unwrap_or("00");
                        out.push(u8::from_str_radix(s, 16).unwrap_or(0));
                    }
                    Some(b) => out.push(b),
                    None => return self.err("unterminated string"),
                },
                Some(b) => out.push(b),
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The raw text up to the `>` that closes an already consumed `<` (nested `<>`,
    /// `()`, `[]` and strings are skipped over).
    fn raw_angle(&mut self) -> R<String> {
        let start = self.i;
        let open = Pos {
            line: self.line,
            col: self.col.saturating_sub(1),
        };
        let mut depth = 1usize;
        loop {
            match self.peek() {
                None => {
                    return Err(StableHloError::syntax(
                        open,
                        "unterminated `<...>`: no `>` closes this `<`",
                    ))
                }
                Some(b'"') => {
                    self.string()?;
                    continue;
                }
                Some(b'<') => depth += 1,
                Some(b'>') => {
                    // `->` inside `#stablehlo.conv<..->..>` is not a closing bracket.
                    if self.i > start && self.s[self.i - 1] == b'-' {
                        self.bump();
                        continue;
                    }
                    depth -= 1;
                    if depth == 0 {
                        let raw = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                        self.bump();
                        return Ok(raw);
                    }
                }
                _ => {}
            }
            self.bump();
        }
    }

    fn ttype(&mut self) -> R<TType> {
        self.ws();
        let pos = self.pos();
        if !self.eat_word("tensor") {
            let found = self.found();
            return self.err(format!("expected a tensor type, found {found}"));
        }
        self.expect_token("<")?;
        let raw = self.raw_angle()?;
        parse_tensor_type(&raw).map_err(|m| StableHloError::syntax(pos, m))
    }

    /// `T` or `(T, ..)` → a type list (for results).
    fn type_list(&mut self) -> R<Vec<TType>> {
        if self.eat("(") {
            let mut v = vec![];
            if self.eat(")") {
                return Ok(v);
            }
            loop {
                v.push(self.ttype()?);
                self.skip_dict_if_any()?;
                if self.eat(")") {
                    return Ok(v);
                }
                self.expect_token(",")?;
            }
        }
        Ok(vec![self.ttype()?])
    }

    fn skip_dict_if_any(&mut self) -> R<()> {
        self.ws();
        if self.peek() == Some(b'{') {
            self.dict()?;
        }
        Ok(())
    }

    /// The signature after `:`: `(T, ..) -> R`, `T, T`, or `T -> T`. Returns operand
    /// types (possibly empty when not written) and result types.
    fn signature(&mut self) -> R<(Vec<TType>, Vec<TType>)> {
        self.ws();
        if self.peek() == Some(b'(') {
            let ins = self.type_list()?;
            self.expect_token("->")?;
            let outs = self.type_list()?;
            return Ok((ins, outs));
        }
        let mut list = vec![self.ttype()?];
        loop {
            if self.eat("->") {
                let outs = self.type_list()?;
                return Ok((list, outs));
            }
            // A comma followed by a type continues the list (select's `: T1, T2`).
            let save = (self.i, self.line, self.col);
            if self.eat(",") {
                self.ws();
                if self.starts("tensor") {
                    list.push(self.ttype()?);
                    continue;
                }
                (self.i, self.line, self.col) = save;
            }
            let last = list.last().cloned().into_iter().collect();
            return Ok((list, last));
        }
    }

    fn number(&mut self) -> R<AVal> {
        self.ws();
        let start = self.i;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.bump();
        }
        if self.starts("0x") {
            self.bump();
            self.bump();
            while self.peek().is_some_and(|b| b.is_ascii_hexdigit()) {
                self.bump();
            }
            let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
            let neg = text.starts_with('-');
            let digits = text.trim_start_matches(['-', '+']).trim_start_matches("0x");
            return match u64::from_str_radix(digits, 16) {
                Ok(v) if !neg => Ok(AVal::Int(v as i64)),
                _ => self.err(format!("bad hexadecimal number `{text}`")),
            };
        }
        let mut float = false;
        while let Some(b) = self.peek() {
            if b.is_ascii_digit() {
                self.bump();
            } else if b == b'.' || b == b'e' || b == b'E' {
                float = true;
                self.bump();
                if (b == b'e' || b == b'E') && matches!(self.peek(), Some(b'-' | b'+')) {
                    self.bump();
                }
            } else {
                break;
            }
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        if float {
            match text.parse::<f64>() {
                Ok(v) => Ok(AVal::Float(v)),
                Err(_) => self.err(format!("bad number `{text}`")),
            }
        } else {
            match text.parse::<i64>() {
                Ok(v) => Ok(AVal::Int(v)),
                Err(_) => self.err(format!("bad integer `{text}`")),
            }
        }
    }

    /// An attribute value (without a trailing `: type`).
    fn value(&mut self) -> R<AVal> {
        self.enter()?;
        let v = self.value_inner();
        self.leave();
        v
    }

    fn value_inner(&mut self) -> R<AVal> {
        self.ws();
        let Some(b) = self.peek() else {
            return self.err("expected a value, found the end of the file");
        };
        match b {
            b'[' => {
                self.bump();
                let mut v = vec![];
                if !self.eat("]") {
                    loop {
                        v.push(self.value()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect_token(",")?;
                    }
                }
                let list = AVal::List(v);
                // `[0] x [1]`
                let save = (self.i, self.line, self.col);
                if self.eat_word("x") {
                    self.ws();
                    if self.peek() == Some(b'[') {
                        let rhs = self.value()?;
                        return Ok(AVal::Pair(Box::new(list), Box::new(rhs)));
                    }
                    (self.i, self.line, self.col) = save;
                }
                Ok(list)
            }
            b'{' => Ok(AVal::Dict(self.dict()?)),
            b'"' => Ok(AVal::Str(self.string()?)),
            b'@' => Ok(AVal::Sym(self.symbol()?)),
            b'#' => {
                self.bump();
                let name = self.ident()?;
                let body = if self.peek() == Some(b'<') {
                    self.bump();
                    self.raw_angle()?
                } else {
                    String::new()
                };
                Ok(AVal::Hash { name, body })
            }
            b'(' => {
                let ins = self.type_list()?;
                self.expect_token("->")?;
                let outs = self.type_list()?;
                Ok(AVal::FuncType(ins, outs))
            }
            b'-' | b'+' | b'0'..=b'9' => self.number(),
            _ if is_ident_start(b) => {
                if self.starts("tensor<") {
                    return Ok(AVal::Type(self.ttype()?));
                }
                let word = self.ident()?;
                match word.as_str() {
                    "true" => Ok(AVal::Bool(true)),
                    "false" => Ok(AVal::Bool(false)),
                    "dense" | "dense_resource" => {
                        if word == "dense_resource" {
                            return self.err("`dense_resource` constants (blobs stored outside the text) are not supported: print the module with its constants inline");
                        }
                        self.expect_token("<")?;
                        let raw = self.raw_angle()?;
                        self.expect_token(":")?;
                        let ty = self.ttype()?;
                        Ok(AVal::Dense { raw, ty })
                    }
                    "array" => {
                        self.expect_token("<")?;
                        let raw = self.raw_angle()?;
                        let body = match raw.split_once(':') {
                            Some((_, b)) => b,
                            None => "",
                        };
                        let mut v = vec![];
                        for t in body.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                            match t {
                                "true" => v.push(1),
                                "false" => v.push(0),
                                _ => match t.parse::<i64>() {
                                    Ok(x) => v.push(x),
                                    Err(_) => return self.err(format!("bad array element `{t}`")),
                                },
                            }
                        }
                        Ok(AVal::Ints(v))
                    }
                    _ => Ok(AVal::Word(word)),
                }
            }
            _ => {
                let found = self.found();
                self.err(format!("expected a value, found {found}"))
            }
        }
    }

    /// `{key = value [: type], key, ...}`
    fn dict(&mut self) -> R<Vec<(String, AVal)>> {
        self.enter()?;
        let r = self.dict_inner();
        self.leave();
        r
    }

    fn dict_inner(&mut self) -> R<Vec<(String, AVal)>> {
        self.expect_token("{")?;
        let mut v = vec![];
        if self.eat("}") {
            return Ok(v);
        }
        loop {
            self.ws();
            let key = if self.peek() == Some(b'"') {
                self.string()?
            } else {
                self.ident()?
            };
            let val = if self.eat("=") {
                let val = self.value()?;
                if self.eat(":") {
                    // an integer's or float's type: `0 : i64`
                    self.ws();
                    if self.starts("tensor") {
                        self.ttype()?;
                    } else {
                        self.ident()?;
                    }
                }
                val
            } else {
                AVal::Bool(true)
            };
            v.push((key, val));
            if self.eat("}") {
                return Ok(v);
            }
            self.expect_token(",")?;
        }
    }

    /// `{ [^bb0(%a: T, ..):] ops }`
    fn region(&mut self) -> R<Block> {
        self.enter()?;
        let r = self.region_inner();
        self.leave();
        r
    }

    fn region_inner(&mut self) -> R<Block> {
        self.expect_token("{")?;
        let mut block = Block::default();
        if self.eat("^") {
            self.ident()?;
            if self.eat("(") && !self.eat(")") {
                loop {
                    let name = self.value_name()?;
                    self.expect_token(":")?;
                    let ty = self.ttype()?;
                    self.skip_loc()?;
                    block.args.push((name, ty));
                    if self.eat(")") {
                        break;
                    }
                    self.expect_token(",")?;
                }
            }
            self.expect_token(":")?;
        }
        loop {
            if self.eat("}") {
                return Ok(block);
            }
            if self.at_end() {
                return self.err("unterminated region: expected `}`");
            }
            block.ops.push(self.op()?);
        }
    }

    /// A trailing `loc(...)`.
    fn skip_loc(&mut self) -> R<()> {
        if self.eat_word("loc") {
            self.expect_token("(")?;
            let mut depth = 1usize;
            while depth > 0 {
                match self.bump() {
                    None => return self.err("unterminated `loc(`"),
                    Some(b'(') => depth += 1,
                    Some(b')') => depth -= 1,
                    Some(b'"') => {
                        self.i -= 1;
                        self.col -= 1;
                        self.string()?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn op(&mut self) -> R<Op> {
        self.enter()?;
        let r = self.op_inner();
        self.leave();
        r
    }

    fn op_inner(&mut self) -> R<Op> {
        self.ws();
        let pos = self.pos();
        let mut results = vec![];
        if self.peek() == Some(b'%') {
            loop {
                let name = self.value_name()?;
                if self.eat(":") {
                    // `%0:2 = ...` (several results, used as `%0#0`, `%0#1`)
                    let n = match self.number()? {
                        AVal::Int(n) if (1..=MAX_RESULTS).contains(&n) => n,
                        _ => return self.err("expected a result count"),
                    };
                    results.extend((0..n).map(|i| format!("{name}#{i}")));
                } else {
                    results.push(name);
                }
                if !self.eat(",") {
                    break;
                }
            }
            self.expect_token("=")?;
        }
        self.ws();
        let mut op = if self.peek() == Some(b'"') {
            self.generic_op(pos)?
        } else {
            self.pretty_op(pos)?
        };
        op.results = results;
        self.skip_loc()?;
        Ok(op)
    }

    fn generic_op(&mut self, pos: Pos) -> R<Op> {
        let name = self.string()?;
        let mut op = new_op(name, pos);
        self.expect_token("(")?;
        if !self.eat(")") {
            loop {
                op.operands.push(self.value_name()?);
                if self.eat(")") {
                    break;
                }
                self.expect_token(",")?;
            }
        }
        if self.eat("<") {
            self.ws();
            op.attrs.extend(self.dict()?);
            self.expect_token(">")?;
        }
        if self.eat("(") {
            loop {
                op.regions.push(self.region()?);
                if self.eat(")") {
                    break;
                }
                self.expect_token(",")?;
            }
        }
        self.ws();
        if self.peek() == Some(b'{') {
            op.attrs.extend(self.dict()?);
        }
        self.expect_token(":")?;
        let (ins, outs) = self.signature()?;
        op.operand_types = ins;
        op.result_types = outs;
        Ok(op)
    }

    fn pretty_op(&mut self, pos: Pos) -> R<Op> {
        let name = self.ident()?;
        match name.as_str() {
            "module" | "builtin.module" => self.pretty_module(pos),
            "func.func" => self.pretty_func(pos),
            "call" | "func.call" => {
                let mut op = new_op("func.call".into(), pos);
                let callee = self.symbol()?;
                op.attrs.push(("callee".into(), AVal::Sym(callee)));
                self.paren_operands(&mut op)?;
                self.sig_into(&mut op)?;
                Ok(op)
            }
            "return" | "func.return" | "stablehlo.return" => {
                let name = if name == "stablehlo.return" {
                    name
                } else {
                    "func.return".into()
                };
                let mut op = new_op(name, pos);
                self.ws();
                if self.peek() == Some(b'%') {
                    loop {
                        op.operands.push(self.value_name()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                    self.expect_token(":")?;
                    loop {
                        op.operand_types.push(self.ttype()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                }
                Ok(op)
            }
            "stablehlo.reduce" => self.pretty_reduce(pos),
            "stablehlo.convolution" => self.pretty_convolution(pos),
            _ => self.pretty_items(name, pos),
        }
    }

    fn sig_into(&mut self, op: &mut Op) -> R<()> {
        self.expect_token(":")?;
        let (ins, outs) = self.signature()?;
        op.operand_types = ins;
        op.result_types = outs;
        Ok(())
    }

    fn paren_operands(&mut self, op: &mut Op) -> R<()> {
        self.expect_token("(")?;
        if self.eat(")") {
            return Ok(());
        }
        loop {
            op.operands.push(self.value_name()?);
            if self.eat(")") {
                return Ok(());
            }
            self.expect_token(",")?;
        }
    }

    /// `name item, item, ... : signature` (most ops).
    fn pretty_items(&mut self, name: String, pos: Pos) -> R<Op> {
        let mut op = new_op(name, pos);
        let mut words = vec![];
        self.ws();
        if self.peek() != Some(b':') {
            loop {
                self.ws();
                match self.peek() {
                    Some(b'%') => op.operands.push(self.value_name()?),
                    Some(b'[') => {
                        // slice's `[start:limit(:stride), ..]`
                        self.bump();
                        let mut spec = vec![];
                        loop {
                            let a = self.int()?;
                            self.expect_token(":")?;
                            let b = self.int()?;
                            let s = if self.eat(":") { self.int()? } else { 1 };
                            spec.push((a, b, s));
                            if self.eat("]") {
                                break;
                            }
                            self.expect_token(",")?;
                        }
                        op.attrs.push(("slice".into(), AVal::Slices(spec)));
                    }
                    Some(b) if is_ident_start(b) && !self.starts("dense<") => {
                        let word = self.ident()?;
                        if self.eat("=") {
                            let v = self.value()?;
                            op.attrs.push((word, v));
                        } else {
                            words.push(AVal::Word(word));
                        }
                    }
                    _ => {
                        let v = self.value()?;
                        op.attrs.push(("value".into(), v));
                    }
                }
                self.ws();
                if self.peek() == Some(b'{') {
                    op.attrs.extend(self.dict()?);
                }
                // slice's spec follows its operand without a comma
                if !self.eat(",") && self.peek() != Some(b'[') {
                    break;
                }
            }
        }
        if !words.is_empty() {
            op.attrs.push(("words".into(), AVal::List(words)));
        }
        // The constant's value carries its own type (`dense<..> : T`), which is the
        // result type.
        if let Some(AVal::Dense { ty, .. }) = op.attr("value") {
            if op.operands.is_empty() && op.name == "stablehlo.constant" {
                op.result_types = vec![ty.clone()];
                return Ok(op);
            }
        }
        self.sig_into(&mut op)?;
        Ok(op)
    }

    fn int(&mut self) -> R<i64> {
        match self.number()? {
            AVal::Int(v) => Ok(v),
            _ => self.err("expected an integer"),
        }
    }

    /// `stablehlo.reduce(%x init: %i) applies OP across dimensions = [..] : sig` or with
    /// `reducer(%a: T, %b: T) { .. }` after the signature.
    fn pretty_reduce(&mut self, pos: Pos) -> R<Op> {
        let mut op = new_op("stablehlo.reduce".into(), pos);
        self.expect_token("(")?;
        let mut inits = vec![];
        // `(%x init: %i)`, several as `(%x init: %i), (%y init: %j)`.
        loop {
            op.operands.push(self.value_name()?);
            self.expect_token("init")?;
            self.expect_token(":")?;
            inits.push(self.value_name()?);
            if self.eat(")") {
                if self.eat(",") {
                    self.expect_token("(")?;
                    continue;
                }
                break;
            }
            self.expect_token(",")?;
        }
        op.operands.extend(inits);
        let applies = if self.eat_word("applies") {
            Some(self.ident()?)
        } else {
            None
        };
        self.expect_token("across")?;
        self.expect_token("dimensions")?;
        self.expect_token("=")?;
        let dims = self.value()?;
        op.attrs.push(("dimensions".into(), dims));
        self.sig_into(&mut op)?;
        match applies {
            Some(body_op) => op.attrs.push(("applies".into(), AVal::Word(body_op))),
            None => {
                self.expect_token("reducer")?;
                let mut args = vec![];
                while self.eat("(") {
                    let name = self.value_name()?;
                    self.expect_token(":")?;
                    let ty = self.ttype()?;
                    self.expect_token(",")?;
                    let name2 = self.value_name()?;
                    self.expect_token(":")?;
                    let ty2 = self.ttype()?;
                    self.expect_token(")")?;
                    args.push((name, ty, name2, ty2));
                }
                let mut block = self.region()?;
                // Operand pairs are (accumulator_i, element_i); the block's argument
                // order is all accumulators, then all elements.
                let mut firsts: Vec<(String, TType)> = vec![];
                let mut seconds: Vec<(String, TType)> = vec![];
                for (a, ta, b, tb) in args {
                    firsts.push((a, ta));
                    seconds.push((b, tb));
                }
                firsts.extend(seconds);
                block.args = firsts;
                op.regions.push(block);
            }
        }
        Ok(op)
    }

    fn pretty_convolution(&mut self, pos: Pos) -> R<Op> {
        let mut op = new_op("stablehlo.convolution".into(), pos);
        self.paren_operands(&mut op)?;
        self.expect_token("dim_numbers")?;
        self.expect_token("=")?;
        self.ws();
        let start = self.i;
        while !self.at_end() && !self.starts(", window") && self.peek() != Some(b'{') {
            self.bump();
        }
        let raw = String::from_utf8_lossy(&self.s[start..self.i])
            .trim()
            .to_string();
        op.attrs.push((
            "dimension_numbers".into(),
            AVal::Hash {
                name: "stablehlo.conv".into(),
                body: raw,
            },
        ));
        if self.eat(",") {
            self.expect_token("window")?;
            self.expect_token("=")?;
            for (k, v) in self.dict()? {
                let key = match k.as_str() {
                    "stride" => "window_strides",
                    "pad" => "padding",
                    "lhs_dilate" => "lhs_dilation",
                    "rhs_dilate" => "rhs_dilation",
                    "reverse" => "window_reversal",
                    other => other,
                };
                op.attrs.push((key.to_string(), v));
            }
        }
        self.ws();
        if self.peek() == Some(b'{') {
            op.attrs.extend(self.dict()?);
        }
        self.sig_into(&mut op)?;
        Ok(op)
    }

    /// `module [@name] [attributes {..}] { ops }`
    fn pretty_module(&mut self, pos: Pos) -> R<Op> {
        let mut op = new_op("builtin.module".into(), pos);
        self.ws();
        if self.peek() == Some(b'@') {
            self.symbol()?;
        }
        if self.eat_word("attributes") {
            self.dict()?;
        }
        op.regions.push(self.region()?);
        Ok(op)
    }

    /// `func.func [public|private] @name(%a: T {attrs}, ..) [-> T | -> (T {attrs}, ..)]
    /// [attributes {..}] { body }`
    fn pretty_func(&mut self, pos: Pos) -> R<Op> {
        let mut op = new_op("func.func".into(), pos);
        let mut visibility = "public".to_string();
        self.ws();
        if self.peek() != Some(b'@') {
            visibility = self.ident()?;
        }
        let name = self.symbol()?;
        self.expect_token("(")?;
        let mut args = vec![];
        if !self.eat(")") {
            loop {
                let n = self.value_name()?;
                self.expect_token(":")?;
                let t = self.ttype()?;
                self.skip_dict_if_any()?;
                self.skip_loc()?;
                args.push((n, t));
                if self.eat(")") {
                    break;
                }
                self.expect_token(",")?;
            }
        }
        let outs = if self.eat("->") {
            self.type_list()?
        } else {
            vec![]
        };
        if self.eat_word("attributes") {
            self.dict()?;
        }
        let mut body = self.region()?;
        body.args = args.clone();
        op.operand_types = args.into_iter().map(|(_, t)| t).collect();
        op.result_types = outs;
        op.attrs.push(("sym_name".into(), AVal::Str(name)));
        op.attrs
            .push(("sym_visibility".into(), AVal::Str(visibility)));
        op.regions.push(body);
        Ok(op)
    }
}

fn new_op(name: String, pos: Pos) -> Op {
    Op {
        name,
        results: vec![],
        operands: vec![],
        attrs: vec![],
        regions: vec![],
        operand_types: vec![],
        result_types: vec![],
        pos,
    }
}

/// `2x8xf32` (the inside of `tensor<...>`).
pub fn parse_tensor_type(raw: &str) -> Result<TType, String> {
    let raw = raw.trim();
    if raw.contains(',') {
        return Err(format!(
            "tensor type `tensor<{raw}>` has an encoding, which is not supported"
        ));
    }
    let parts: Vec<&str> = raw.split('x').collect();
    let (elem, dims) = match parts.split_last() {
        Some(x) => x,
        None => return Err("empty tensor type".into()),
    };
    let mut out = vec![];
    for d in dims {
        match d.trim().parse::<u64>() {
            Ok(v) => out.push(v),
            Err(_) if d.trim() == "?" => {
                return Err(format!(
                    "tensor<{raw}> has a dynamic dimension; export the module with static shapes"
                ))
            }
            Err(_) => return Err(format!("bad dimension `{d}` in tensor<{raw}>")),
        }
    }
    let elem = elem.trim();
    if elem.is_empty() || !elem.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("bad element type in tensor<{raw}>"));
    }
    Ok(TType {
        dims: out,
        elem: elem.to_string(),
    })
}

/// Rename the pretty form's keywords to the generic form's attribute names, per op.
pub fn normalize(op: &mut Op) {
    let rename: &[(&str, &str)] = match op.name.as_str() {
        "stablehlo.broadcast_in_dim" => &[("dims", "broadcast_dimensions")],
        "stablehlo.transpose" => &[("dims", "permutation")],
        "stablehlo.iota" => &[("dim", "iota_dimension")],
        "stablehlo.dynamic_slice" => &[("sizes", "slice_sizes")],
        "stablehlo.concatenate" => &[("dim", "dimension")],
        "stablehlo.pad" => &[
            ("low", "edge_padding_low"),
            ("high", "edge_padding_high"),
            ("interior", "interior_padding"),
        ],
        _ => &[],
    };
    for (k, _) in op.attrs.iter_mut() {
        if let Some((_, to)) = rename.iter().find(|(from, _)| k == from) {
            *k = to.to_string();
        }
    }
    let mut extra = vec![];
    for (k, v) in &op.attrs {
        match (op.name.as_str(), k.as_str(), v) {
            ("stablehlo.dot_general", "batching_dims", AVal::Pair(l, r)) => {
                extra.push(("lhs_batching_dimensions".to_string(), (**l).clone()));
                extra.push(("rhs_batching_dimensions".to_string(), (**r).clone()));
            }
            ("stablehlo.dot_general", "contracting_dims", AVal::Pair(l, r)) => {
                extra.push(("lhs_contracting_dimensions".to_string(), (**l).clone()));
                extra.push(("rhs_contracting_dimensions".to_string(), (**r).clone()));
            }
            ("stablehlo.dot_general", "dot_dimension_numbers", AVal::Hash { body, .. }) => {
                for (k, v) in hash_fields(body) {
                    extra.push((k, v));
                }
            }
            ("stablehlo.compare", "words", AVal::List(words)) => {
                if let Some(AVal::Word(w)) = words.first() {
                    extra.push(("comparison_direction".into(), AVal::Word(w.clone())));
                }
            }
            ("stablehlo.compare", "comparison_direction", AVal::Hash { body, .. }) => {
                let w = body.split_whitespace().last().unwrap_or("").to_string();
                extra.push(("comparison_direction".into(), AVal::Word(w)));
            }
            ("stablehlo.slice", "slice", AVal::Slices(spec)) => {
                extra.push((
                    "start_indices".into(),
                    AVal::Ints(spec.iter().map(|s| s.0).collect()),
                ));
                extra.push((
                    "limit_indices".into(),
                    AVal::Ints(spec.iter().map(|s| s.1).collect()),
                ));
                extra.push((
                    "strides".into(),
                    AVal::Ints(spec.iter().map(|s| s.2).collect()),
                ));
            }
            _ => {}
        }
    }
    // Later entries win in lookups by `attr` (first match), so replace in place.
    for (k, v) in extra {
        match op.attrs.iter_mut().find(|(kk, _)| *kk == k) {
            Some(slot) => slot.1 = v,
            None => op.attrs.push((k, v)),
        }
    }
}

/// The `key = [ints]` / `key = int` fields of a `#stablehlo.dot<..>` or
/// `#stablehlo.gather<..>` body.
pub fn hash_fields(body: &str) -> Vec<(String, AVal)> {
    let mut out = vec![];
    let mut rest = body;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        rest = &rest[eq + 1..];
        let rest_t = rest.trim_start();
        if let Some(stripped) = rest_t.strip_prefix('[') {
            let end = stripped.find(']').unwrap_or(stripped.len());
            let ints: Vec<i64> = stripped[..end]
                .split(',')
                .filter_map(|t| t.trim().parse().ok())
                .collect();
            out.push((key, AVal::Ints(ints)));
            rest = stripped.get(end + 1..).unwrap_or("");
        } else {
            let end = rest_t.find(',').unwrap_or(rest_t.len());
            if let Ok(v) = rest_t[..end].trim().parse::<i64>() {
                out.push((key, AVal::Int(v)));
            }
            rest = rest_t.get(end..).unwrap_or("");
        }
    }
    out
}
