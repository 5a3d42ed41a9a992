//! Typed access to a node's `AttributeProto`s.
//!
//! Files from before IR version 2 leave `type` unset; the value's kind is then read from
//! whichever field is filled, as onnx's own checker does.

use super::proto::{attribute_type as at, AttributeProto, GraphProto, NodeProto, TensorProto};

/// Why a node attribute cannot be read as asked (the caller adds the node).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeAttrError {
    /// The attribute holds another kind of value; `attr_type` is its `AttributeProto.type`.
    #[error("attribute `{name}` must be {expected} (attribute type {attr_type})")]
    WrongType {
        name: String,
        expected: &'static str,
        attr_type: i32,
    },
    #[error("attribute `{name}` is not UTF-8")]
    NotUtf8 { name: String },
    #[error("attribute `{name}` has no tensor")]
    NoTensor { name: String },
}

type Res<T> = Result<T, NodeAttrError>;

pub struct NodeAttrs<'a> {
    attrs: &'a [AttributeProto],
}

impl<'a> NodeAttrs<'a> {
    pub fn new(node: &'a NodeProto) -> Self {
        NodeAttrs {
            attrs: &node.attribute,
        }
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.attrs.iter().find(|a| a.name == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn names(&self) -> impl Iterator<Item = &'a str> {
        self.attrs.iter().map(|a| a.name.as_str())
    }

    fn kind(a: &AttributeProto) -> i32 {
        if a.r#type != at::UNDEFINED {
            return a.r#type;
        }
        if !a.floats.is_empty() {
            at::FLOATS
        } else if !a.ints.is_empty() {
            at::INTS
        } else if !a.strings.is_empty() {
            at::STRINGS
        } else if !a.tensors.is_empty() {
            at::TENSORS
        } else if a.t.is_some() {
            at::TENSOR
        } else if a.g.is_some() {
            at::GRAPH
        } else if !a.s.is_empty() {
            at::STRING
        } else if a.f != 0.0 {
            at::FLOAT
        } else {
            at::INT
        }
    }

    fn wrong(a: &AttributeProto, expected: &'static str) -> NodeAttrError {
        NodeAttrError::WrongType {
            name: a.name.clone(),
            expected,
            attr_type: a.r#type,
        }
    }

    fn not_utf8(name: &str) -> NodeAttrError {
        NodeAttrError::NotUtf8 {
            name: name.to_string(),
        }
    }

    pub fn int(&self, name: &str) -> Res<Option<i64>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::INT => Ok(Some(a.i)),
            Some(a) => Err(Self::wrong(a, "an integer")),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Res<i64> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// A float; an integer attribute is accepted.
    pub fn float(&self, name: &str) -> Res<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::FLOAT => Ok(Some(a.f as f64)),
            Some(a) if Self::kind(a) == at::INT => Ok(Some(a.i as f64)),
            Some(a) => Err(Self::wrong(a, "a float")),
        }
    }

    pub fn float_or(&self, name: &str, default: f64) -> Res<f64> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn string(&self, name: &str) -> Res<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(a)
                if Self::kind(a) == at::STRING || (a.r#type == at::UNDEFINED && a.s.is_empty()) =>
            {
                String::from_utf8(a.s.clone())
                    .map(Some)
                    .map_err(|_| Self::not_utf8(name))
            }
            Some(a) => Err(Self::wrong(a, "a string")),
        }
    }

    pub fn string_or(&self, name: &str, default: &str) -> Res<String> {
        Ok(self.string(name)?.unwrap_or_else(|| default.to_string()))
    }

    /// An integer list (an explicitly typed empty list reads as empty).
    pub fn ints(&self, name: &str) -> Res<Option<Vec<i64>>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::INTS => Ok(Some(a.ints.clone())),
            Some(a) if a.r#type == at::UNDEFINED && a.ints.is_empty() && a.floats.is_empty() => {
                Ok(Some(vec![]))
            }
            Some(a) => Err(Self::wrong(a, "an integer list")),
        }
    }

    pub fn floats(&self, name: &str) -> Res<Option<Vec<f64>>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::FLOATS => {
                Ok(Some(a.floats.iter().map(|&x| x as f64).collect()))
            }
            Some(a) if Self::kind(a) == at::INTS => {
                Ok(Some(a.ints.iter().map(|&x| x as f64).collect()))
            }
            Some(a) => Err(Self::wrong(a, "a float list")),
        }
    }

    pub fn strings(&self, name: &str) -> Res<Option<Vec<String>>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::STRINGS => a
                .strings
                .iter()
                .map(|s| String::from_utf8(s.clone()).map_err(|_| Self::not_utf8(name)))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => Err(Self::wrong(a, "a string list")),
        }
    }

    pub fn tensor(&self, name: &str) -> Res<Option<&'a TensorProto>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::TENSOR => {
                a.t.as_ref()
                    .map(Some)
                    .ok_or_else(|| NodeAttrError::NoTensor {
                        name: name.to_string(),
                    })
            }
            Some(a) => Err(Self::wrong(a, "a tensor")),
        }
    }

    /// A graph (an `If` branch, a `Loop` or `Scan` body).
    pub fn graph(&self, name: &str) -> Res<Option<&'a GraphProto>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::GRAPH => match &a.g {
                Some(g) => Ok(Some(g)),
                None => Err(Self::wrong(a, "a graph")),
            },
            Some(a) => Err(Self::wrong(a, "a graph")),
        }
    }

    /// Whether the attribute refers to an enclosing function's attribute (unsupported).
    pub fn any_ref_attr(&self) -> Option<&'a str> {
        self.attrs
            .iter()
            .find(|a| !a.ref_attr_name.is_empty())
            .map(|a| a.name.as_str())
    }
}
