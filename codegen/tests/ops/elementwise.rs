//! Tests of `lower::elementwise` (see common.rs for the harness).
