//! Tests of `lower::movement` (see common.rs for the harness).
