//! Fault injection with a history checker (#21): the [`history`] format a chaos run
//! records, and the [`checker`] that finds the anomalies in one.

pub mod checker;
pub mod history;
