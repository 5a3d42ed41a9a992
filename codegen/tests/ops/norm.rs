//! Tests of `lower::norm` (see common.rs for the harness).
