//! Fault injection with a history checker (#21).
//!
//! - [`history`]: the JSON-lines history a chaos run records;
//! - [`checker`]: the pure function that finds the anomalies in one;
//! - [`schedule`]: the seeded fault schedule;
//! - [`netns`], [`proxy`], [`nodes`]: ZooKeeper and brokers, each in a network
//!   namespace of its own, the delaying proxy, and the faults;
//! - [`workload`]: the clients (fjord-client) in their namespace;
//! - [`run`]: one run, from namespaces to verdict (`cargo xtask chaos`).

pub mod checker;
pub mod history;
pub mod netns;
pub mod nodes;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod workload;
