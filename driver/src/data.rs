//! Training data: synthetic labels and the arrays of an `.npz` bound to the training
//! program's inputs.

use std::collections::HashMap;

use ppcc_runtime::{ArraySource, Distribution, InputSpec};
use ppir::{DType, Tensor, TensorData, TensorType};

use crate::error::{bail, Context, Result};

/// Synthetic labels: class ids below the logits' last dimension, or N(0,1) targets.
pub fn label_spec(ty: &TensorType, first_output: Option<&TensorType>) -> Result<InputSpec> {
    let dist = if ty.dtype.is_float() {
        Distribution::Normal
    } else {
        let classes = first_output
            .and_then(|t| t.dims.last())
            .and_then(|d| d.known())
            .context(
                "cannot tell the number of classes: the first output has no static last axis",
            )?;
        Distribution::Uniform {
            low: 0,
            high: classes as i64,
        }
    };
    Ok(InputSpec {
        name: "labels".into(),
        ty: ty.clone(),
        dist,
    })
}

/// The arrays `wanted` (IR name → global-batch type) from an `.npz`'s arrays (by ONNX
/// name), converted to the wanted element types where that loses nothing meaningful.
pub fn npz_source(
    path: &str,
    arrays: Vec<(String, Tensor)>,
    wanted: &[(String, TensorType)],
    onnx_name: &HashMap<String, String>,
    global: usize,
) -> Result<ArraySource> {
    let mut by_name: HashMap<String, Tensor> = arrays.into_iter().collect();
    let mut selected = vec![];
    for (ir, ty) in wanted {
        let key = onnx_name.get(ir).cloned().unwrap_or_else(|| ir.clone());
        let t = by_name.remove(&key).with_context(|| {
            let mut have: Vec<&String> = by_name.keys().collect();
            have.sort();
            format!(
                "{path} has no array `{key}` (it has: {})",
                have.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let t = convert(&key, t, ty.dtype)?;
        if t.shape.len() != ty.rank()
            || t.shape[1..]
                .iter()
                .zip(&ty.dims[1..])
                .any(|(&n, d)| d.known() != Some(n as u64))
        {
            let want: Vec<String> = std::iter::once("N".to_string())
                .chain(ty.dims[1..].iter().map(|d| d.to_string()))
                .collect();
            bail!(
                "array `{key}` in {path} has shape {:?}; the model wants [{}] (N rows)",
                t.shape,
                want.join(", ")
            );
        }
        selected.push((ir.clone(), t));
    }
    Ok(ArraySource::new(selected, global)?)
}

/// `t` as `dtype`: floats to floats (rounded), integers to integers; never float ↔ integer.
pub fn convert(name: &str, t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype == dtype {
        return Ok(t);
    }
    match (&t.data, dtype.is_float()) {
        (TensorData::Float(v), true) => Ok(Tensor::from_f64(dtype, t.shape.clone(), v.clone())),
        (TensorData::Int(v), false) => Ok(Tensor::from_i64(dtype, t.shape.clone(), v.clone())),
        _ => bail!(
            "array `{name}` has element type {}, the model wants {dtype}",
            t.dtype
        ),
    }
}
