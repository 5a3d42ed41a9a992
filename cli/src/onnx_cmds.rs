//! `ppcc import`, `ppcc eval`, `ppcc conform`. (Being written.)

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ImportArgs {}
#[derive(clap::Args)]
pub struct EvalArgs {}
#[derive(clap::Args)]
pub struct ConformArgs {}

pub fn import(_a: ImportArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
pub fn eval(_a: EvalArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
pub fn conform(_a: ConformArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
