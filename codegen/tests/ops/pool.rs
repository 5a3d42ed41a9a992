//! Tests of `lower::pool` (see common.rs for the harness).
