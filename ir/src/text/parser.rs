//! The parser: recursive descent over the tokens of [`lexer`](super::lexer), building
//! modules through the public API of [`module`](crate::module).
//!
//! It checks syntax, names (defined once, before use) and that an op's signature agrees with
//! its operands; op-specific rules (arity, attributes, shapes) are the verifier's job.

use std::collections::HashMap;

use super::lexer::{lex, Tok, Token};
use super::{ParseError, Pos};
use crate::attr::{Attr, Attrs};
use crate::module::{ArgKind, Function, Module, NewOp, ValueId};
use crate::ops::{OpKind, Phase};
use crate::tensor::{round_to, Tensor, TensorData};
use crate::types::{DType, Dim, TensorType};

type PResult<T> = Result<T, ParseError>;

/// Parse a whole module.
pub fn parse_module(src: &str) -> Result<Module, ParseError> {
    let mut p = Parser::new(src);
    let m = p.module()?;
    p.expect_eof("after the module")?;
    Ok(m)
}

/// Parse one tensor type, such as `tensor<?x784xf32>`.
pub fn parse_type(src: &str) -> Result<TensorType, ParseError> {
    let mut p = Parser::new(src);
    let (ty, _) = p.tensor_type()?;
    p.expect_eof("after the type")?;
    Ok(ty)
}

/// One element of a flat dense list, as written.
enum Elem {
    Int(String),
    Float(String),
    Bool(bool),
}

/// A dense literal before its type is known (in attributes the type comes after it).
enum DenseLit {
    List(Vec<(Elem, Pos)>),
    Hex(String),
}

/// The values of the function being parsed, by name, with where each was defined.
#[derive(Default)]
struct Scope {
    values: HashMap<String, (ValueId, Pos)>,
}

impl Scope {
    /// Check that `name` (about to be defined at `pos`) is new.
    fn check_new(&self, name: &str, pos: Pos) -> PResult<()> {
        match self.values.get(name) {
            Some((_, first)) => Err(redefinition(name, pos, *first)),
            None => Ok(()),
        }
    }

    fn insert(&mut self, name: String, v: ValueId, pos: Pos) {
        self.values.insert(name, (v, pos));
    }

    fn lookup(&self, name: &str, pos: Pos) -> PResult<ValueId> {
        match self.values.get(name) {
            Some(&(v, _)) => Ok(v),
            None => Err(pos.error(format!("use of undefined value {}", value_ref(name)))),
        }
    }
}

fn redefinition(name: &str, pos: Pos, first: Pos) -> ParseError {
    pos.error(format!(
        "redefinition of value {} (first defined at {first})",
        value_ref(name)
    ))
}

/// `%name` as the printer would write it, for messages.
fn value_ref(name: &str) -> String {
    let mut s = String::new();
    if !name.is_empty() && name.chars().all(super::is_name_char) {
        s.push('%');
        s.push_str(name);
    } else {
        s.push('%');
        super::printer::write_string(&mut s, name);
    }
    s
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    i: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser {
            src,
            toks: lex(src),
            i: 0,
        }
    }

    // ---- token plumbing ----

    fn peek(&self) -> &Tok {
        &self.toks[self.i].tok
    }

    fn pos(&self) -> Pos {
        self.toks[self.i].pos
    }

    /// Consume the current token and return it. Consumed tokens are moved out (a weight's
    /// hex string can be large); the last token (Eof or Error) is never consumed.
    fn bump(&mut self) -> Tok {
        if self.i + 1 < self.toks.len() {
            let t = std::mem::replace(&mut self.toks[self.i].tok, Tok::Comma);
            self.i += 1;
            t
        } else {
            self.toks[self.i].tok.clone()
        }
    }

    /// Consume the current token and return its text payload (empty for punctuation).
    fn bump_text(&mut self) -> String {
        match self.bump() {
            Tok::ValueName(s)
            | Tok::SymName(s)
            | Tok::Ident(s)
            | Tok::Int(s)
            | Tok::Float(s)
            | Tok::Str(s)
            | Tok::TensorType(s)
            | Tok::Error(s) => s,
            _ => String::new(),
        }
    }

    fn at(&self, t: &Tok) -> bool {
        self.peek() == t
    }

    fn at_keyword(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Ident(w) if w == kw)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.at(t) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn eat_keyword(&mut self, kw: &str) -> bool {
        if self.at_keyword(kw) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// How the current token reads in a message.
    fn found(&self) -> String {
        let t = &self.toks[self.i];
        match &t.tok {
            Tok::Eof => "end of file".to_string(),
            _ => {
                let text = &self.src[t.start..t.end];
                let mut short: String = text.chars().take(40).collect();
                if short.len() < text.len() {
                    short.push_str("...");
                }
                match t.tok {
                    Tok::Str(_) => format!("string {short}"),
                    _ => format!("'{short}'"),
                }
            }
        }
    }

    /// "expected {what}, found {current token}" at the current token; a lexical error there
    /// is reported as itself.
    fn unexpected(&self, what: &str) -> ParseError {
        if let Tok::Error(msg) = self.peek() {
            return self.pos().error(msg.clone());
        }
        self.pos()
            .error(format!("expected {what}, found {}", self.found()))
    }

    fn expect(&mut self, t: &Tok, what: &str) -> PResult<Pos> {
        let pos = self.pos();
        if self.eat(t) {
            Ok(pos)
        } else {
            Err(self.unexpected(what))
        }
    }

    fn expect_keyword(&mut self, kw: &str, what: &str) -> PResult<Pos> {
        let pos = self.pos();
        if self.eat_keyword(kw) {
            Ok(pos)
        } else {
            Err(self.unexpected(what))
        }
    }

    fn expect_eof(&mut self, after: &str) -> PResult<()> {
        if self.at(&Tok::Eof) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("end of file {after}")))
        }
    }

    fn value_name(&mut self, what: &str) -> PResult<(String, Pos)> {
        let pos = self.pos();
        match self.peek() {
            Tok::ValueName(_) => {
                let n = self.bump_text();
                if n.is_empty() {
                    return Err(pos.error("empty value name"));
                }
                Ok((n, pos))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn sym_name(&mut self, what: &str) -> PResult<(String, Pos)> {
        let pos = self.pos();
        match self.peek() {
            Tok::SymName(_) => {
                let n = self.bump_text();
                Ok((n, pos))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn string(&mut self, what: &str) -> PResult<(String, Pos)> {
        let pos = self.pos();
        match self.peek() {
            Tok::Str(_) => {
                let s = self.bump_text();
                Ok((s, pos))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    // ---- types ----

    fn tensor_type(&mut self) -> PResult<(TensorType, Pos)> {
        let pos = self.pos();
        let Tok::TensorType(body) = self.peek() else {
            return Err(self.unexpected("a tensor type"));
        };
        let ty = type_body(body, pos)?;
        self.bump();
        Ok((ty, pos))
    }

    /// `(T, T)` or `()`; the `(` is next.
    fn type_list(&mut self, close_what: &str) -> PResult<Vec<(TensorType, Pos)>> {
        self.expect(&Tok::LParen, "'('")?;
        let mut types = Vec::new();
        if !self.at(&Tok::RParen) {
            loop {
                types.push(self.tensor_type()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RParen, close_what)?;
        Ok(types)
    }

    /// Result types after `->`: a parenthesised list or one bare type.
    fn result_types(&mut self) -> PResult<Vec<(TensorType, Pos)>> {
        if self.at(&Tok::LParen) {
            self.type_list("')' after result types")
        } else if matches!(self.peek(), Tok::TensorType(_)) {
            Ok(vec![self.tensor_type()?])
        } else {
            Err(self.unexpected("result types after '->'"))
        }
    }

    // ---- module level ----

    fn module(&mut self) -> PResult<Module> {
        self.expect_keyword("module", "'module'")?;
        let mut m = Module::new();
        if matches!(self.peek(), Tok::SymName(_)) {
            m.name = Some(self.sym_name("module name")?.0);
        }
        self.expect(&Tok::LBrace, "'{' to start the module body")?;
        let mut functions: HashMap<String, Pos> = HashMap::new();
        loop {
            if self.at_keyword("func") {
                let (f, name_pos) = self.function()?;
                if let Some(first) = functions.get(&f.name) {
                    return Err(name_pos.error(format!(
                        "redefinition of function {} (first defined at {first})",
                        sym_ref(&f.name)
                    )));
                }
                functions.insert(f.name.clone(), name_pos);
                m.functions.push(f);
            } else if self.at_keyword("weight") {
                self.weight(&mut m)?;
            } else if self.eat(&Tok::RBrace) {
                return Ok(m);
            } else {
                return Err(self.unexpected("'func', 'weight' or '}'"));
            }
        }
    }

    fn weight(&mut self, m: &mut Module) -> PResult<()> {
        self.expect_keyword("weight", "'weight'")?;
        let (name, name_pos) = self.sym_name("weight name after 'weight'")?;
        self.expect(&Tok::Colon, "':' after the weight name")?;
        let (ty, ty_pos) = self.tensor_type()?;
        self.expect(&Tok::Equal, "'=' after the weight type")?;
        if self.eat_keyword("elided") {
            return Ok(());
        }
        if !self.at_keyword("dense") {
            return Err(self.unexpected("'dense' or 'elided'"));
        }
        let (lit, lit_pos) = self.dense_literal()?;
        let t = make_tensor(lit, lit_pos, &ty, ty_pos)?;
        if m.weights.contains_key(&name) {
            return Err(name_pos.error(format!("redefinition of weight {}", sym_ref(&name))));
        }
        m.weights.insert(name, t);
        Ok(())
    }

    /// A function; returns it with the position of its name.
    fn function(&mut self) -> PResult<(Function, Pos)> {
        self.expect_keyword("func", "'func'")?;
        let (name, name_pos) = self.sym_name("function name after 'func'")?;
        let mut f = Function::new(name);
        let mut scope = Scope::default();

        self.expect(&Tok::LParen, "'(' to start the argument list")?;
        if !self.at(&Tok::RParen) {
            loop {
                let (arg, pos) = self.value_name("argument name")?;
                self.expect(&Tok::Colon, "':' after the argument name")?;
                let (ty, _) = self.tensor_type()?;
                let mut kind = ArgKind::Input;
                if self.eat(&Tok::LBrace) {
                    kind = if self.eat_keyword("param") {
                        ArgKind::Param
                    } else if self.eat_keyword("state") {
                        ArgKind::State
                    } else {
                        return Err(self.unexpected("'param' or 'state'"));
                    };
                    self.expect(&Tok::RBrace, "'}' after the argument kind")?;
                }
                scope.check_new(&arg, pos)?;
                let v = f.add_arg(arg.clone(), ty, kind);
                scope.insert(arg, v, pos);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RParen, "')' after the arguments")?;
        self.expect(&Tok::Arrow, "'->' after the argument list")?;
        let declared = self.result_types()?;
        if self.eat_keyword("attributes") {
            if !self.at(&Tok::LBrace) {
                return Err(self.unexpected("'{' after 'attributes'"));
            }
            f.attrs = self
                .attr_dict()?
                .into_iter()
                .map(|(k, v, _)| (k, v))
                .collect();
        }
        self.expect(&Tok::LBrace, "'{' to start the function body")?;
        loop {
            match self.peek() {
                Tok::Ident(w) if w == "return" => break,
                Tok::ValueName(_) | Tok::Str(_) => self.op(&mut f, &mut scope)?,
                _ => return Err(self.unexpected("an op or 'return'")),
            }
        }
        self.return_stmt(&mut f, &scope, &declared)?;
        self.expect(&Tok::RBrace, "'}' after 'return'")?;
        Ok((f, name_pos))
    }

    fn return_stmt(
        &mut self,
        f: &mut Function,
        scope: &Scope,
        declared: &[(TensorType, Pos)],
    ) -> PResult<()> {
        let ret_pos = self.expect_keyword("return", "'return'")?;
        let mut values = Vec::new();
        if matches!(self.peek(), Tok::ValueName(_)) {
            loop {
                let (name, pos) = self.value_name("returned value")?;
                values.push((scope.lookup(&name, pos)?, pos));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            self.expect(&Tok::Colon, "':' before the returned types")?;
            let mut types = Vec::new();
            loop {
                types.push(self.tensor_type()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            if types.len() != values.len() {
                return Err(ret_pos.error(format!(
                    "'return' has {} values but {} types",
                    values.len(),
                    types.len()
                )));
            }
            for (i, ((v, _), (t, tpos))) in values.iter().zip(&types).enumerate() {
                if f.ty(*v) != t {
                    return Err(tpos.error(format!(
                        "returned value {i} ({}) has type {} but the 'return' says {t}",
                        value_ref(&f.value(*v).name),
                        f.ty(*v)
                    )));
                }
            }
        }
        if values.len() != declared.len() {
            return Err(ret_pos.error(format!(
                "function {} declares {} results but returns {} values",
                sym_ref(&f.name),
                declared.len(),
                values.len()
            )));
        }
        for (i, ((v, vpos), (t, _))) in values.iter().zip(declared).enumerate() {
            if f.ty(*v) != t {
                return Err(vpos.error(format!(
                    "function {} declares result {i} as {t} but returns {} of type {}",
                    sym_ref(&f.name),
                    value_ref(&f.value(*v).name),
                    f.ty(*v)
                )));
            }
        }
        f.set_results(values.into_iter().map(|(v, _)| v).collect());
        Ok(())
    }

    fn op(&mut self, f: &mut Function, scope: &mut Scope) -> PResult<()> {
        // results
        let mut results: Vec<(String, Pos)> = Vec::new();
        if matches!(self.peek(), Tok::ValueName(_)) {
            loop {
                let (name, pos) = self.value_name("result name")?;
                if let Some((_, first)) = results.iter().find(|(n, _)| *n == name) {
                    return Err(redefinition(&name, pos, *first));
                }
                scope.check_new(&name, pos)?;
                results.push((name, pos));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            self.expect(&Tok::Equal, "'=' after the op's results")?;
        }

        // name
        let (op_name, name_pos) = self.string("an op name such as \"pp.add\"")?;
        let kind = op_kind(&op_name, name_pos)?;
        let quoted = format!("\"{op_name}\"");

        // operands
        self.expect(&Tok::LParen, "'(' to start the operands")?;
        let mut operands: Vec<(ValueId, Pos)> = Vec::new();
        if !self.at(&Tok::RParen) {
            loop {
                let (name, pos) = self.value_name("operand name")?;
                operands.push((scope.lookup(&name, pos)?, pos));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RParen, "')' after operands")?;

        // attributes, stage and phase
        let mut attrs = Attrs::new();
        let mut stage = None;
        let mut phase = None;
        if self.at(&Tok::LBrace) {
            for (key, value, pos) in self.attr_dict()? {
                match key.as_str() {
                    "stage" => match value {
                        Attr::Int(s) if (0..=u32::MAX as i64).contains(&s) => {
                            stage = Some(s as u32)
                        }
                        other => {
                            return Err(pos.error(format!(
                                "attribute `stage` must be a non-negative integer (a pipeline \
                                 stage), found {}",
                                describe_attr(&other)
                            )))
                        }
                    },
                    "phase" => match value.clone() {
                        Attr::Str(s) if Phase::from_name(&s).is_some() => {
                            phase = Phase::from_name(&s)
                        }
                        other => {
                            let names: Vec<String> = Phase::ALL
                                .iter()
                                .map(|p| format!("\"{}\"", p.name()))
                                .collect();
                            return Err(pos.error(format!(
                                "attribute `phase` must be one of {}, found {}",
                                names.join(", "),
                                describe_attr(&other)
                            )));
                        }
                    },
                    _ => {
                        attrs.set(key, value);
                    }
                }
            }
        }

        // signature
        self.expect(&Tok::Colon, "':' before the op's type signature")?;
        let sig_pos = self.pos();
        if !self.at(&Tok::LParen) {
            return Err(self.unexpected("'(' to start the operand types"));
        }
        let operand_types = self.type_list("')' after operand types")?;
        self.expect(&Tok::Arrow, "'->' after operand types")?;
        let result_pos = self.pos();
        let result_types = self.result_types()?;

        // location
        let mut loc = None;
        if self.eat_keyword("loc") {
            self.expect(&Tok::LParen, "'(' after 'loc'")?;
            loc = Some(self.string("a location string")?.0);
            self.expect(&Tok::RParen, "')' after the location")?;
        }

        // checks
        if operand_types.len() != operands.len() {
            return Err(sig_pos.error(format!(
                "{quoted} has {} operand{} but its signature lists {} operand type{}",
                operands.len(),
                plural(operands.len()),
                operand_types.len(),
                plural(operand_types.len())
            )));
        }
        if result_types.len() != results.len() {
            return Err(result_pos.error(format!(
                "{quoted} has {} result{} but its signature lists {} result type{}",
                results.len(),
                plural(results.len()),
                result_types.len(),
                plural(result_types.len())
            )));
        }
        for (i, ((v, _), (t, tpos))) in operands.iter().zip(&operand_types).enumerate() {
            if f.ty(*v) != t {
                return Err(tpos.error(format!(
                    "operand {i} of {quoted} ({}) has type {} but the signature says {t}",
                    value_ref(&f.value(*v).name),
                    f.ty(*v)
                )));
            }
        }

        let names: Vec<String> = results.iter().map(|(n, _)| n.clone()).collect();
        let new = NewOp {
            kind,
            operands: operands.into_iter().map(|(v, _)| v).collect(),
            attrs,
            result_types: result_types.into_iter().map(|(t, _)| t).collect(),
            result_names: names,
            stage,
            phase,
            loc,
        };
        let id = f.push_op(new);
        for ((name, pos), &v) in results.into_iter().zip(f.op(id).results()) {
            scope.insert(name, v, pos);
        }
        Ok(())
    }

    // ---- attributes ----

    /// `{k = v, ...}` as (key, value, position of the key), in source order; duplicates are
    /// an error.
    fn attr_dict(&mut self) -> PResult<Vec<(String, Attr, Pos)>> {
        self.expect(&Tok::LBrace, "'{'")?;
        let mut entries: Vec<(String, Attr, Pos)> = Vec::new();
        if !self.at(&Tok::RBrace) {
            loop {
                let pos = self.pos();
                let key = match self.peek() {
                    Tok::Ident(_) | Tok::Str(_) => self.bump_text(),
                    _ => return Err(self.unexpected("an attribute name")),
                };
                if entries.iter().any(|(k, _, _)| *k == key) {
                    return Err(pos.error(format!("duplicate attribute `{key}`")));
                }
                self.expect(&Tok::Equal, &format!("'=' after attribute name `{key}`"))?;
                let value = self.attr_value()?;
                entries.push((key, value, pos));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RBrace, "',' or '}' in the attribute dictionary")?;
        Ok(entries)
    }

    fn attr_value(&mut self) -> PResult<Attr> {
        let pos = self.pos();
        match self.peek() {
            Tok::Int(_) => {
                let t = self.bump_text();
                parse_i64(&t).map(Attr::Int).ok_or_else(|| {
                    pos.error(format!("integer {t} does not fit in a 64-bit attribute"))
                })
            }
            Tok::Float(_) => parse_f64(&self.bump_text(), pos).map(Attr::Float),
            Tok::Ident(w) if w == "inf" || w == "nan" => {
                parse_f64(&self.bump_text(), pos).map(Attr::Float)
            }
            Tok::Ident(w) if DType::from_name(w).is_some() => {
                let d = DType::from_name(w).unwrap_or(DType::F32);
                self.bump();
                Ok(Attr::DType(d))
            }
            Tok::Ident(w) if w == "dense" => {
                let (lit, lit_pos) = self.dense_literal()?;
                self.expect(&Tok::Colon, "':' and the type after a dense literal")?;
                let (ty, ty_pos) = self.tensor_type()?;
                Ok(Attr::Tensor(make_tensor(lit, lit_pos, &ty, ty_pos)?))
            }
            Tok::Str(_) => Ok(Attr::Str(self.bump_text())),
            Tok::LBracket => self.number_list(),
            _ => Err(self.unexpected("an attribute value")),
        }
    }

    /// `[1, 2]` (integers) or `[1.0, 2]` (floats); the `[` is next.
    fn number_list(&mut self) -> PResult<Attr> {
        self.expect(&Tok::LBracket, "'['")?;
        let mut items: Vec<(Tok, Pos)> = Vec::new();
        if !self.at(&Tok::RBracket) {
            loop {
                let pos = self.pos();
                match self.peek() {
                    Tok::Int(_) | Tok::Float(_) => {}
                    Tok::Ident(w) if w == "inf" || w == "nan" => {}
                    _ => return Err(self.unexpected("a number in the list")),
                }
                items.push((self.bump(), pos));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RBracket, "',' or ']' in the list")?;
        if items.iter().all(|(t, _)| matches!(t, Tok::Int(_))) {
            let mut v = Vec::with_capacity(items.len());
            for (t, pos) in items {
                if let Tok::Int(s) = t {
                    v.push(parse_i64(&s).ok_or_else(|| {
                        pos.error(format!("integer {s} does not fit in a 64-bit attribute"))
                    })?);
                }
            }
            Ok(Attr::Ints(v))
        } else {
            let mut v = Vec::with_capacity(items.len());
            for (t, pos) in items {
                match t {
                    Tok::Int(s) | Tok::Float(s) | Tok::Ident(s) => v.push(parse_f64(&s, pos)?),
                    _ => {}
                }
            }
            Ok(Attr::Floats(v))
        }
    }

    /// `dense<[...]>` or `dense<"0x...">`, with the position of the literal inside.
    fn dense_literal(&mut self) -> PResult<(DenseLit, Pos)> {
        self.expect_keyword("dense", "'dense'")?;
        self.expect(&Tok::Less, "'<' after 'dense'")?;
        let pos = self.pos();
        let lit = match self.peek() {
            Tok::Str(_) => DenseLit::Hex(self.bump_text()),
            Tok::LBracket => {
                self.bump();
                let mut elems = Vec::new();
                if !self.at(&Tok::RBracket) {
                    loop {
                        let epos = self.pos();
                        let e = match self.peek() {
                            Tok::Int(_) => Elem::Int(self.bump_text()),
                            Tok::Float(_) => Elem::Float(self.bump_text()),
                            Tok::Ident(w) if w == "inf" || w == "nan" => {
                                Elem::Float(self.bump_text())
                            }
                            Tok::Ident(w) if w == "true" || w == "false" => {
                                Elem::Bool(self.bump_text() == "true")
                            }
                            _ => return Err(self.unexpected("a tensor element")),
                        };
                        elems.push((e, epos));
                        if !self.eat(&Tok::Comma) {
                            break;
                        }
                    }
                }
                self.expect(&Tok::RBracket, "',' or ']' in the dense list")?;
                DenseLit::List(elems)
            }
            _ => return Err(self.unexpected("'[' or a hex string in the dense literal")),
        };
        self.expect(&Tok::Greater, "'>' to close the dense literal")?;
        Ok((lit, pos))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn sym_ref(name: &str) -> String {
    let v = value_ref(name);
    format!("@{}", &v[1..])
}

fn describe_attr(a: &Attr) -> String {
    let mut s = String::new();
    super::printer::write_attr(&mut s, a);
    let short: String = s.chars().take(40).collect();
    if short.len() < s.len() {
        format!("{} {short}...", a.kind_name())
    } else {
        format!("{} {short}", a.kind_name())
    }
}

/// The body of `tensor<...>`: dimensions and an element type separated by `x`. `pos` is
/// where `tensor<` starts.
fn type_body(body: &str, pos: Pos) -> PResult<TensorType> {
    // The body is ASCII (the lexer only lets [A-Za-z0-9?_] through), so byte offsets are
    // column offsets; "tensor<" is 7 columns.
    let at = |off: usize| Pos {
        line: pos.line,
        col: pos.col + 7 + off,
    };
    let mut segments = Vec::new();
    let mut start = 0;
    for (i, c) in body.char_indices() {
        if c == 'x' {
            segments.push((start, &body[start..i]));
            start = i + 1;
        }
    }
    let (dt_off, dt) = (start, &body[start..]);
    let dtype = match DType::from_name(dt) {
        Some(d) => d,
        None if dt.is_empty() => {
            return Err(at(dt_off).error("expected an element type at the end of the tensor type"))
        }
        None => {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            return Err(at(dt_off).error(format!(
                "unknown element type '{dt}' (expected one of {})",
                names.join(", ")
            )));
        }
    };
    let mut dims = Vec::with_capacity(segments.len());
    for (off, s) in segments {
        if s == "?" {
            dims.push(Dim::Batch);
        } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            match s.parse::<u64>() {
                Ok(n) => dims.push(Dim::Known(n)),
                Err(_) => return Err(at(off).error(format!("dimension {s} is too large"))),
            }
        } else if s.is_empty() {
            return Err(at(off).error("expected a dimension (a size or '?') before 'x'"));
        } else {
            return Err(at(off).error(format!("invalid dimension '{s}' (expected a size or '?')")));
        }
    }
    let ty = TensorType::new(dtype, dims);
    ty.check_size().map_err(|e| at(0).error(e.to_string()))?;
    Ok(ty)
}

fn op_kind(name: &str, pos: Pos) -> PResult<OpKind> {
    if let Some(kind) = name.strip_prefix("pp.").and_then(OpKind::from_name) {
        return Ok(kind);
    }
    if !name.starts_with("pp.") && OpKind::from_name(name).is_some() {
        return Err(pos.error(format!(
            "unknown op \"{name}\" (op names start with \"pp.\": did you mean \"pp.{name}\"?)"
        )));
    }
    let bare = name.strip_prefix("pp.").unwrap_or(name);
    let mut close: Vec<(usize, &str)> = OpKind::ALL
        .iter()
        .map(|k| (edit_distance(bare, k.name()), k.name()))
        .filter(|&(d, _)| d <= 2)
        .collect();
    close.sort();
    // Only the closest few: "reluu" suggests "relu", not every two-letter neighbour.
    let best = close.first().map_or(0, |c| c.0);
    close.retain(|c| c.0 == best);
    if close.is_empty() {
        Err(pos.error(format!("unknown op \"{name}\"")))
    } else {
        let names: Vec<String> = close
            .iter()
            .take(3)
            .map(|(_, n)| format!("\"pp.{n}\""))
            .collect();
        Err(pos.error(format!(
            "unknown op \"{name}\" (did you mean {}?)",
            names.join(" or ")
        )))
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Long inputs cannot be close to a short op name; skip the quadratic work.
    if a.len() > b.len() + 2 {
        return usize::MAX;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn parse_i64(s: &str) -> Option<i64> {
    s.parse::<i64>().ok()
}

/// A float literal as an f64 (`inf`, `-inf`, `nan` included).
fn parse_f64(s: &str, pos: Pos) -> PResult<f64> {
    match s {
        "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        "nan" => Ok(f64::NAN),
        _ => s
            .parse::<f64>()
            .map_err(|_| pos.error(format!("invalid number '{s}'"))),
    }
}

/// A float literal as an element of `dtype`, rounded once from the literal: f32, f16 and
/// bf16 go through f32, whose shortest form the printer uses for all three.
fn parse_float_elem(s: &str, dtype: DType, pos: Pos) -> PResult<f64> {
    match s {
        "inf" | "-inf" | "nan" => parse_f64(s, pos),
        _ if dtype == DType::F64 => parse_f64(s, pos),
        _ => match s.parse::<f32>() {
            Ok(x) => Ok(round_to(dtype, x as f64)),
            Err(_) => Err(pos.error(format!("invalid number '{s}'"))),
        },
    }
}

/// The number of elements of a static type, or an error at `pos` saying why there is none.
fn static_count(ty: &TensorType, pos: Pos) -> PResult<(Vec<usize>, usize)> {
    let mut shape = Vec::with_capacity(ty.dims.len());
    let mut n: usize = 1;
    for d in &ty.dims {
        let Dim::Known(k) = *d else {
            return Err(pos.error(format!("a dense tensor needs a static type, found {ty}")));
        };
        let too_large = || pos.error(format!("{ty} is too large"));
        let k = usize::try_from(k).map_err(|_| too_large())?;
        n = n.checked_mul(k).ok_or_else(too_large)?;
        shape.push(k);
    }
    if n.checked_mul(ty.dtype.size_bytes()).is_none() {
        return Err(pos.error(format!("{ty} is too large")));
    }
    Ok((shape, n))
}

/// Check a dense literal against its type and build the tensor.
fn make_tensor(lit: DenseLit, lit_pos: Pos, ty: &TensorType, ty_pos: Pos) -> PResult<Tensor> {
    let (shape, n) = static_count(ty, ty_pos)?;
    let dtype = ty.dtype;
    let data = match lit {
        DenseLit::List(elems) => {
            if elems.len() != n {
                return Err(lit_pos.error(format!(
                    "dense literal has {} element{} but {ty} has {n}",
                    elems.len(),
                    plural(elems.len())
                )));
            }
            if dtype.is_float() {
                let mut v = Vec::with_capacity(n);
                for (e, pos) in elems {
                    v.push(match e {
                        Elem::Int(s) | Elem::Float(s) => parse_float_elem(&s, dtype, pos)?,
                        Elem::Bool(_) => {
                            return Err(
                                pos.error(format!("expected a number for {dtype}, found a bool"))
                            )
                        }
                    });
                }
                TensorData::Float(v)
            } else {
                let mut v = Vec::with_capacity(n);
                for (e, pos) in elems {
                    v.push(int_elem(e, dtype, pos)?);
                }
                TensorData::Int(v)
            }
        }
        DenseLit::Hex(s) => {
            let bytes = decode_hex(&s, lit_pos)?;
            let size = dtype.size_bytes();
            if bytes.len() != n * size {
                return Err(lit_pos.error(format!(
                    "dense literal has {} bytes but {ty} needs {} ({n} element{} of {size} byte{})",
                    bytes.len(),
                    n * size,
                    plural(n),
                    plural(size)
                )));
            }
            let chunks = bytes.chunks_exact(size);
            match dtype {
                DType::F64 => TensorData::Float(
                    chunks
                        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect(),
                ),
                DType::F32 => TensorData::Float(
                    chunks
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64)
                        .collect(),
                ),
                DType::F16 => TensorData::Float(
                    chunks
                        .map(|c| half::f16::from_le_bytes(c.try_into().unwrap_or([0; 2])).to_f64())
                        .collect(),
                ),
                DType::BF16 => TensorData::Float(
                    chunks
                        .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap_or([0; 2])).to_f64())
                        .collect(),
                ),
                DType::I64 => TensorData::Int(
                    chunks
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect(),
                ),
                DType::I32 => TensorData::Int(
                    chunks
                        .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                        .collect(),
                ),
                DType::I8 => TensorData::Int(bytes.iter().map(|&b| b as i8 as i64).collect()),
                DType::Bool => {
                    if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                        return Err(lit_pos
                            .error(format!("i1 elements must be bytes 00 or 01, found {b:02X}")));
                    }
                    TensorData::Int(bytes.iter().map(|&b| b as i64).collect())
                }
            }
        }
    };
    Ok(Tensor { dtype, shape, data })
}

fn int_elem(e: Elem, dtype: DType, pos: Pos) -> PResult<i64> {
    let x = match e {
        Elem::Bool(b) if dtype == DType::Bool => return Ok(b as i64),
        Elem::Bool(_) => {
            return Err(pos.error(format!("expected an integer for {dtype}, found a bool")))
        }
        Elem::Float(s) => {
            return Err(pos.error(format!("expected an integer for {dtype}, found '{s}'")))
        }
        Elem::Int(s) => parse_i64(&s),
    };
    let (lo, hi) = match dtype {
        DType::I64 => (i64::MIN, i64::MAX),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        _ => (0, 1),
    };
    match x {
        Some(x) if (lo..=hi).contains(&x) => Ok(x),
        _ => Err(pos.error(format!(
            "integer out of range for {dtype} (expected {lo} to {hi})"
        ))),
    }
}

fn decode_hex(s: &str, pos: Pos) -> PResult<Vec<u8>> {
    let Some(digits) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) else {
        return Err(pos.error("a dense string literal must be hex starting with \"0x\""));
    };
    if let Some(c) = digits.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(pos.error(format!("invalid hex digit {c:?} in dense literal")));
    }
    if digits.len() % 2 != 0 {
        return Err(pos.error("dense hex literal has an odd number of digits"));
    }
    let b = digits.as_bytes();
    Ok(b.chunks_exact(2)
        .map(|p| {
            let hi = (p[0] as char).to_digit(16).unwrap_or(0) as u8;
            let lo = (p[1] as char).to_digit(16).unwrap_or(0) as u8;
            hi * 16 + lo
        })
        .collect())
}
