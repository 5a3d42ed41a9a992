//! Op attributes: a sorted name → value dictionary, printed `{axis = 1, perm = [0, 2, 1]}`.
//!
//! Booleans are `Int` 0/1 as in ONNX. Accessors take the attribute name and a default, and
//! return an [`AttrError`] (never panic) when the attribute has the wrong kind.

use std::collections::BTreeMap;

use crate::tensor::Tensor;
use crate::types::DType;

#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    DType(DType),
    Tensor(Tensor),
}

impl Attr {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Attr::Int(_) => "integer",
            Attr::Float(_) => "float",
            Attr::Str(_) => "string",
            Attr::Ints(_) => "integer list",
            Attr::Floats(_) => "float list",
            Attr::DType(_) => "element type",
            Attr::Tensor(_) => "tensor",
        }
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("attribute `{name}`: expected {expected}, found {found}")]
pub struct AttrError {
    pub name: String,
    pub expected: &'static str,
    pub found: String,
}

impl AttrError {
    /// A required attribute that is absent.
    pub fn missing(name: &str, expected: &'static str) -> AttrError {
        AttrError {
            name: name.to_string(),
            expected,
            found: "nothing (it is required)".to_string(),
        }
    }
}

/// Attribute dictionary of an op or function, sorted by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    pub fn new() -> Self {
        Attrs(BTreeMap::new())
    }

    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.get(name)
    }

    pub fn set(&mut self, name: impl Into<String>, value: Attr) -> &mut Self {
        self.0.insert(name.into(), value);
        self
    }

    /// Builder form: `Attrs::new().with("axis", Attr::Int(1))`.
    pub fn with(mut self, name: impl Into<String>, value: Attr) -> Self {
        self.0.insert(name.into(), value);
        self
    }

    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        self.0.remove(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attr)> {
        self.0.iter()
    }

    fn err(name: &str, expected: &'static str, found: &Attr) -> AttrError {
        AttrError {
            name: name.to_string(),
            expected,
            found: found.kind_name().to_string(),
        }
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(a) => Err(Self::err(name, "an integer", a)),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, AttrError> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// A float attribute; an integer is accepted and converted.
    pub fn float(&self, name: &str) -> Result<Option<f64>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(Attr::Int(v)) => Ok(Some(*v as f64)),
            Some(a) => Err(Self::err(name, "a float", a)),
        }
    }

    pub fn float_or(&self, name: &str, default: f64) -> Result<f64, AttrError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn str(&self, name: &str) -> Result<Option<&str>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Str(s)) => Ok(Some(s)),
            Some(a) => Err(Self::err(name, "a string", a)),
        }
    }

    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, AttrError> {
        Ok(self.str(name)?.unwrap_or(default))
    }

    /// An integer list; an empty float list (`[]` parses as either) is accepted.
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Floats(v)) if v.is_empty() => Ok(Some(vec![])),
            Some(a) => Err(Self::err(name, "an integer list", a)),
        }
    }

    pub fn ints_or(&self, name: &str, default: Vec<i64>) -> Result<Vec<i64>, AttrError> {
        Ok(self.ints(name)?.unwrap_or(default))
    }

    /// A float list; an integer list is accepted and converted.
    pub fn floats(&self, name: &str) -> Result<Option<Vec<f64>>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v.clone())),
            Some(Attr::Ints(v)) => Ok(Some(v.iter().map(|&x| x as f64).collect())),
            Some(a) => Err(Self::err(name, "a float list", a)),
        }
    }

    pub fn dtype(&self, name: &str) -> Result<Option<DType>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::DType(d)) => Ok(Some(*d)),
            Some(a) => Err(Self::err(name, "an element type", a)),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&Tensor>, AttrError> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Tensor(t)) => Ok(Some(t)),
            Some(a) => Err(Self::err(name, "a tensor", a)),
        }
    }
}

impl FromIterator<(String, Attr)> for Attrs {
    fn from_iter<T: IntoIterator<Item = (String, Attr)>>(iter: T) -> Self {
        Attrs(iter.into_iter().collect())
    }
}
