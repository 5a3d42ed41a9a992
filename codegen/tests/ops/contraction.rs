//! Tests of `lower::contraction` (see common.rs for the harness).
