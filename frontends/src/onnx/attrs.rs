//! Typed access to a node's `AttributeProto`s.
//!
//! Files from before IR version 2 leave `type` unset; the value's kind is then read from
//! whichever field is filled, as onnx's own checker does.

use super::proto::{attribute_type as at, AttributeProto, NodeProto, TensorProto};

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

    fn wrong(a: &AttributeProto, expected: &str) -> String {
        format!(
            "attribute `{}` must be {expected} (attribute type {})",
            a.name, a.r#type
        )
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::INT => Ok(Some(a.i)),
            Some(a) => Err(Self::wrong(a, "an integer")),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// A float; an integer attribute is accepted.
    pub fn float(&self, name: &str) -> Result<Option<f64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::FLOAT => Ok(Some(a.f as f64)),
            Some(a) if Self::kind(a) == at::INT => Ok(Some(a.i as f64)),
            Some(a) => Err(Self::wrong(a, "a float")),
        }
    }

    pub fn float_or(&self, name: &str, default: f64) -> Result<f64, String> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn string(&self, name: &str) -> Result<Option<String>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a)
                if Self::kind(a) == at::STRING || (a.r#type == at::UNDEFINED && a.s.is_empty()) =>
            {
                String::from_utf8(a.s.clone())
                    .map(Some)
                    .map_err(|_| format!("attribute `{name}` is not UTF-8"))
            }
            Some(a) => Err(Self::wrong(a, "a string")),
        }
    }

    pub fn string_or(&self, name: &str, default: &str) -> Result<String, String> {
        Ok(self.string(name)?.unwrap_or_else(|| default.to_string()))
    }

    /// An integer list (an explicitly typed empty list reads as empty).
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::INTS => Ok(Some(a.ints.clone())),
            Some(a) if a.r#type == at::UNDEFINED && a.ints.is_empty() && a.floats.is_empty() => {
                Ok(Some(vec![]))
            }
            Some(a) => Err(Self::wrong(a, "an integer list")),
        }
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f64>>, String> {
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

    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::STRINGS => a
                .strings
                .iter()
                .map(|s| {
                    String::from_utf8(s.clone())
                        .map_err(|_| format!("attribute `{name}` is not UTF-8"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => Err(Self::wrong(a, "a string list")),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if Self::kind(a) == at::TENSOR => {
                a.t.as_ref()
                    .map(Some)
                    .ok_or_else(|| format!("attribute `{name}` has no tensor"))
            }
            Some(a) => Err(Self::wrong(a, "a tensor")),
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
