//! The lexer of the textual form: source text to a flat list of tokens with positions.
//!
//! The whole input is lexed up front. A lexical error does not stop the parser at once: it
//! becomes a final [`Tok::Error`] token, so a syntax error earlier in the file is still the
//! one reported (errors come out in source order).

use super::{is_name_char, Pos};

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `%name` or `%"any name"`, without the sigil.
    ValueName(String),
    /// `@name` or `@"any name"`, without the sigil.
    SymName(String),
    /// A bare word: keywords, attribute names, element types, `inf`, `nan`, `true`.
    Ident(String),
    /// An integer literal as written (with its sign).
    Int(String),
    /// A float literal as written (with its sign); also `-inf`.
    Float(String),
    /// A string literal, escapes decoded.
    Str(String),
    /// `tensor<...>`: the text between the angle brackets, which is ASCII.
    TensorType(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Less,
    Greater,
    Comma,
    Colon,
    Equal,
    Arrow,
    Eof,
    /// A lexical error; always the last token.
    Error(String),
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub pos: Pos,
    /// Byte range in the source, for "found ..." in error messages.
    pub start: usize,
    pub end: usize,
}

struct Lexer<'a> {
    src: &'a str,
    /// Byte offset of the next character.
    off: usize,
    line: usize,
    col: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')
}

/// Characters allowed between `tensor<` and `>`: dimensions, `x`, `?`, the element type.
fn is_type_body_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '?' | '_')
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.off..].chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.src[self.off..].chars().nth(n)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.off += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col,
        }
    }

    fn skip_trivia(&mut self) {
        loop {
            match self.peek() {
                Some(' ' | '\t' | '\r' | '\n') => {
                    self.bump();
                }
                Some('/') if self.peek_at(1) == Some('/') => {
                    while let Some(c) = self.peek() {
                        if c == '\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn take_while(&mut self, pred: impl Fn(char) -> bool) -> &'a str {
        let start = self.off;
        while let Some(c) = self.peek() {
            if !pred(c) {
                break;
            }
            self.bump();
        }
        &self.src[start..self.off]
    }

    /// A string literal; the opening quote is next. Errors carry their own position.
    fn string(&mut self) -> Result<String, (Pos, String)> {
        let open = self.pos();
        self.bump();
        let mut bytes = Vec::new();
        loop {
            let here = self.pos();
            match self.bump() {
                None | Some('\n') => return Err((open, "unterminated string".into())),
                Some('"') => break,
                Some('\\') => match self.bump() {
                    Some('"') => bytes.push(b'"'),
                    Some('\\') => bytes.push(b'\\'),
                    Some('n') => bytes.push(b'\n'),
                    Some('t') => bytes.push(b'\t'),
                    Some('r') => bytes.push(b'\r'),
                    Some(h) if h.is_ascii_hexdigit() => match self.peek() {
                        Some(l) if l.is_ascii_hexdigit() => {
                            self.bump();
                            let hi = h.to_digit(16).unwrap_or(0) as u8;
                            let lo = l.to_digit(16).unwrap_or(0) as u8;
                            bytes.push(hi * 16 + lo);
                        }
                        _ => {
                            return Err((
                                here,
                                "expected two hex digits after '\\' in string".into(),
                            ))
                        }
                    },
                    None | Some('\n') => return Err((open, "unterminated string".into())),
                    Some(c) => {
                        return Err((here, format!("invalid escape sequence '\\{c}' in string")))
                    }
                },
                Some(c) => {
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        String::from_utf8(bytes).map_err(|_| (open, "string is not valid UTF-8".into()))
    }

    /// A name after `%` or `@`: bare characters or a quoted string.
    fn name(&mut self, sigil: char) -> Result<String, (Pos, String)> {
        match self.peek() {
            Some('"') => self.string(),
            Some(c) if is_name_char(c) => Ok(self.take_while(is_name_char).to_string()),
            other => {
                let found = match other {
                    None => "end of file".to_string(),
                    Some(c) => format!("'{c}'"),
                };
                Err((
                    self.pos(),
                    format!("expected a name after '{sigil}', found {found}"),
                ))
            }
        }
    }

    /// A number; the first character is a digit or a '-' followed by a digit.
    fn number(&mut self) -> Tok {
        let start = self.off;
        if self.peek() == Some('-') {
            self.bump();
        }
        self.take_while(|c| c.is_ascii_digit());
        let mut float = false;
        if self.peek() == Some('.') {
            float = true;
            self.bump();
            self.take_while(|c| c.is_ascii_digit());
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let exp_digits = match self.peek_at(1) {
                Some(d) if d.is_ascii_digit() => true,
                Some('+' | '-') => matches!(self.peek_at(2), Some(d) if d.is_ascii_digit()),
                _ => false,
            };
            if exp_digits {
                float = true;
                self.bump();
                if matches!(self.peek(), Some('+' | '-')) {
                    self.bump();
                }
                self.take_while(|c| c.is_ascii_digit());
            }
        }
        let text = self.src[start..self.off].to_string();
        if float {
            Tok::Float(text)
        } else {
            Tok::Int(text)
        }
    }

    /// `tensor<...>`; `tensor` has been consumed and `<` is next.
    fn tensor_type(&mut self) -> Result<Tok, (Pos, String)> {
        self.bump();
        let body = self.take_while(is_type_body_char).to_string();
        match self.peek() {
            Some('>') => {
                self.bump();
                Ok(Tok::TensorType(body))
            }
            other => {
                let found = match other {
                    None => "end of file".to_string(),
                    Some(c) => format!("'{c}'"),
                };
                Err((
                    self.pos(),
                    format!("expected '>' to close the tensor type, found {found}"),
                ))
            }
        }
    }

    fn token(&mut self) -> Result<Tok, (Pos, String)> {
        let Some(c) = self.peek() else {
            return Ok(Tok::Eof);
        };
        let punct = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            '[' => Some(Tok::LBracket),
            ']' => Some(Tok::RBracket),
            '<' => Some(Tok::Less),
            '>' => Some(Tok::Greater),
            ',' => Some(Tok::Comma),
            ':' => Some(Tok::Colon),
            '=' => Some(Tok::Equal),
            _ => None,
        };
        if let Some(t) = punct {
            self.bump();
            return Ok(t);
        }
        match c {
            '%' => {
                self.bump();
                self.name('%').map(Tok::ValueName)
            }
            '@' => {
                self.bump();
                self.name('@').map(Tok::SymName)
            }
            '"' => self.string().map(Tok::Str),
            '-' => match self.peek_at(1) {
                Some('>') => {
                    self.bump();
                    self.bump();
                    Ok(Tok::Arrow)
                }
                Some(d) if d.is_ascii_digit() => Ok(self.number()),
                Some('i')
                    if self.src[self.off + 1..].starts_with("inf")
                        && !self.peek_at(4).is_some_and(is_ident_char) =>
                {
                    for _ in 0..4 {
                        self.bump();
                    }
                    Ok(Tok::Float("-inf".into()))
                }
                _ => Err((self.pos(), "unexpected character '-'".into())),
            },
            d if d.is_ascii_digit() => Ok(self.number()),
            c if is_ident_start(c) => {
                let word = self.take_while(is_ident_char);
                if word == "tensor" && self.peek() == Some('<') {
                    self.tensor_type()
                } else {
                    Ok(Tok::Ident(word.to_string()))
                }
            }
            c => Err((self.pos(), format!("unexpected character {c:?}"))),
        }
    }
}

/// Lex all of `src`. The result ends with [`Tok::Eof`] or [`Tok::Error`].
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let mut lx = Lexer {
        src,
        off: 0,
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        lx.skip_trivia();
        let pos = lx.pos();
        let start = lx.off;
        match lx.token() {
            Ok(tok) => {
                let eof = tok == Tok::Eof;
                out.push(Token {
                    tok,
                    pos,
                    start,
                    end: lx.off,
                });
                if eof {
                    return out;
                }
            }
            Err((pos, msg)) => {
                out.push(Token {
                    tok: Tok::Error(msg),
                    pos,
                    start,
                    end: lx.off,
                });
                return out;
            }
        }
    }
}
