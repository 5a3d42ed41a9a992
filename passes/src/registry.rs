//! The pass registry: pass names, one-line descriptions, and constructors that take options.
//!
//! A pass is named on the command line as `NAME` or `NAME{key=value,key=value}` (the MLIR
//! spelling), e.g. `--pass bind-batch{size=8}`. Built-in passes register in
//! [`PassRegistry::builtin`]; a plugin's passes join with [`PassRegistry::load_plugin`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::plugin::{PassOrigin, PassPlugin, PluginError};
use crate::{BindBatch, InferShapes, Pass, PassError, VerifyPass};

/// Options given to a pass as `NAME{key=value,...}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassOptions {
    values: BTreeMap<String, String>,
}

impl PassOptions {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// An unsigned integer option.
    pub fn u64(&self, pass: &str, key: &str) -> Result<Option<u64>, PassError> {
        self.get(key)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    PassError::Usage(format!(
                        "pass `{pass}`: option `{key}` must be a non-negative integer, got `{v}`"
                    ))
                })
            })
            .transpose()
    }

    /// Reject keys a pass does not know, naming the ones it does.
    pub fn expect_only(&self, pass: &str, known: &[&str]) -> Result<(), PassError> {
        for k in self.keys() {
            if !known.contains(&k) {
                let list = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                return Err(PassError::Usage(format!(
                    "pass `{pass}` has no option `{k}` (options: {list})"
                )));
            }
        }
        Ok(())
    }
}

/// `key=value,key=value`, sorted by key: what a plugin pass receives.
impl fmt::Display for PassOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.values.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Split `NAME{k=v,...}` into the name and its options.
pub fn parse_pass_spec(spec: &str) -> Result<(String, PassOptions), PassError> {
    let spec = spec.trim();
    let (name, rest) = match spec.find('{') {
        None => (spec, None),
        Some(i) => (&spec[..i], Some(&spec[i + 1..])),
    };
    let mut options = PassOptions::default();
    if let Some(rest) = rest {
        let body = rest
            .strip_suffix('}')
            .ok_or_else(|| PassError::Usage(format!("pass spec `{spec}`: missing closing `}}`")))?;
        for item in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| {
                PassError::Usage(format!(
                    "pass spec `{spec}`: expected key=value, found `{item}`"
                ))
            })?;
            if options
                .values
                .insert(k.trim().to_string(), v.trim().to_string())
                .is_some()
            {
                return Err(PassError::Usage(format!(
                    "pass spec `{spec}`: option `{}` is given twice",
                    k.trim()
                )));
            }
        }
    }
    if name.is_empty() {
        return Err(PassError::Usage(format!("pass spec `{spec}` has no name")));
    }
    Ok((name.to_string(), options))
}

type Constructor = Arc<dyn Fn(&PassOptions) -> Result<Box<dyn Pass>, PassError> + Send + Sync>;

/// A registered pass.
#[derive(Clone)]
pub struct PassInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// Built in, or which plugin it came from (`ppcc-opt --list-passes` shows it).
    pub origin: PassOrigin,
    create: Constructor,
}

/// Name → pass constructor. Later passes register themselves in [`PassRegistry::builtin`].
#[derive(Clone, Default)]
pub struct PassRegistry {
    passes: BTreeMap<&'static str, PassInfo>,
}

impl PassRegistry {
    pub fn empty() -> Self {
        PassRegistry::default()
    }

    /// Every pass that ships with ppcc.
    pub fn builtin() -> Self {
        let mut r = PassRegistry::empty();
        r.register(
            "verify",
            "check the module; fail with every verifier error",
            |o| {
                o.expect_only("verify", &[])?;
                Ok(Box::new(VerifyPass))
            },
        );
        r.register(
            "infer-shapes",
            "recompute every op's result types from its operands, in order",
            |o| {
                o.expect_only("infer-shapes", &[])?;
                Ok(Box::new(InferShapes))
            },
        );
        r.register(
            "bind-batch",
            "replace the symbolic batch dimension `?` by a size: bind-batch{size=N}",
            |o| {
                o.expect_only("bind-batch", &["size"])?;
                let size = o.u64("bind-batch", "size")?.ok_or_else(|| {
                    PassError::Usage("pass `bind-batch` needs an option: bind-batch{size=N}".into())
                })?;
                Ok(Box::new(BindBatch { size }))
            },
        );
        r.register(
            "autodiff",
            "add @grad (loss, parameter gradients split into bwd_input/bwd_weight, new states): autodiff{loss=auto|cross-entropy|mse|output,function=main,train=1|0}",
            |o| Ok(Box::new(crate::autodiff::AutodiffPass::from_options(o)?)),
        );
        r.register(
            "canonicalize",
            "fold constants (with the reference interpreter), drop identities, remove dead code",
            |o| {
                o.expect_only("canonicalize", &["max-fold-elements"])?;
                let mut p = crate::canonicalize::Canonicalize::default();
                if let Some(n) = o.u64("canonicalize", "max-fold-elements")? {
                    p.max_fold_elements = n as usize;
                }
                Ok(Box::new(p))
            },
        );
        r.register(
            "optimizer",
            "add @optim (SGD/AdamW step) and @accumulate: optimizer{kind=sgd|adamw,lr=..,momentum=..,weight_decay=..,microbatches=M}",
            |o| Ok(Box::new(crate::optim::OptimizerPass::from_options(o)?)),
        );
        r.register(
            "rewrite",
            "rewrite a function with e-graphs (egg): split ops into independent pieces: rewrite{split=NODE:K;NODE:K,function=main,iter-limit=16,node-limit=50000,time-limit-ms=5000,report=1}",
            |o| Ok(Box::new(crate::rewrite::RewritePass::from_options(o)?)),
        );
        r.register(
            "partition",
            "set the stage of every op of @main (GraphPipe DAG, PipeDream chain or uniform layers): partition{stages=N,kind=graph|sequential|uniform,microbatches=M,profile=h100|a100,loss=auto,pin=NAME;NAME,memory-limit=BYTES}",
            |o| Ok(Box::new(crate::partition::PartitionPass::from_options(o)?)),
        );
        r.register(
            "recompute",
            "duplicate forward ops into the backward instead of stashing their results, per stage of @grad (run after autodiff, before insert-send-recv): recompute{mode=all|auto|off,budget=BYTES,grad=grad,profile=h100,ilp-time-limit-ms=1000}",
            |o| Ok(Box::new(crate::recompute::RecomputePass::from_options(o)?)),
        );
        r.register(
            "insert-send-recv",
            "split @grad/@optim by op stage into @stage<s>.fwd/.bwd_input/.bwd_weight/.optim joined by send/recv: insert-send-recv{grad=grad,optim=optim}",
            |o| Ok(Box::new(crate::split::InsertSendRecv::from_options(o)?)),
        );
        r
    }

    /// Register a built-in pass (replacing one of the same name).
    pub fn register(
        &mut self,
        name: &'static str,
        description: &'static str,
        create: fn(&PassOptions) -> Result<Box<dyn Pass>, PassError>,
    ) {
        self.passes.insert(
            name,
            PassInfo {
                name,
                description,
                origin: PassOrigin::Builtin,
                create: Arc::new(create),
            },
        );
    }

    /// Add every pass of `plugin`. A name that is already registered (built in, or by
    /// another plugin) is an error, and then nothing of the plugin is added.
    pub fn add_plugin(&mut self, plugin: &PassPlugin) -> Result<(), PluginError> {
        for p in plugin.passes() {
            if let Some(existing) = self.passes.get(p.name) {
                return Err(PluginError::NameTaken {
                    path: plugin.path().to_path_buf(),
                    pass: p.name.to_string(),
                    existing: existing.origin.clone(),
                });
            }
        }
        let origin = plugin.origin();
        for p in plugin.passes() {
            let info = p.clone();
            self.passes.insert(
                p.name,
                PassInfo {
                    name: p.name,
                    description: p.description,
                    origin: origin.clone(),
                    create: Arc::new(move |o: &PassOptions| {
                        Ok(Box::new(info.instantiate(o.to_string())) as Box<dyn Pass>)
                    }),
                },
            );
        }
        Ok(())
    }

    /// Load the plugin at `path` ([`PassPlugin::load`]) and add its passes.
    pub fn load_plugin(&mut self, path: impl AsRef<Path>) -> Result<PassPlugin, PluginError> {
        let plugin = PassPlugin::load(path)?;
        self.add_plugin(&plugin)?;
        Ok(plugin)
    }

    pub fn get(&self, name: &str) -> Option<&PassInfo> {
        self.passes.get(name)
    }

    pub fn list(&self) -> impl Iterator<Item = &PassInfo> {
        self.passes.values()
    }

    /// Build a pass from `NAME` or `NAME{k=v,...}`.
    pub fn create(&self, spec: &str) -> Result<Box<dyn Pass>, PassError> {
        let (name, options) = parse_pass_spec(spec)?;
        let info = self.passes.get(name.as_str()).ok_or_else(|| {
            let names: Vec<&str> = self.passes.keys().copied().collect();
            PassError::Usage(format!(
                "unknown pass `{name}` (passes: {})",
                names.join(", ")
            ))
        })?;
        (info.create)(&options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let (n, o) = parse_pass_spec("bind-batch{size=8, x = y}").unwrap();
        assert_eq!(n, "bind-batch");
        assert_eq!(o.get("size"), Some("8"));
        assert_eq!(o.get("x"), Some("y"));
        assert!(parse_pass_spec("a{b=1").is_err());
        assert!(parse_pass_spec("a{b}").is_err());
    }

    #[test]
    fn registry_errors_name_the_problem() {
        let r = PassRegistry::builtin();
        let e = r.create("nope").err().unwrap().to_string();
        assert!(
            e.contains("unknown pass `nope`") && e.contains("canonicalize"),
            "{e}"
        );
        let e = r.create("bind-batch").err().unwrap().to_string();
        assert!(e.contains("size=N"), "{e}");
        let e = r.create("verify{x=1}").err().unwrap().to_string();
        assert!(e.contains("no option `x`"), "{e}");
        let e = r.create("bind-batch{size=-3}").err().unwrap().to_string();
        assert!(e.contains("non-negative"), "{e}");
        assert!(r.create("canonicalize{max-fold-elements=10}").is_ok());
    }
}
