//! Tests of `lower::reduce` (see common.rs for the harness).
