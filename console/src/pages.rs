//! One module per section of the console; each handler reads what it shows, checks the
//! caller's ACLs, and renders through `layout`.

pub(crate) mod audit;
pub(crate) mod groups;
pub(crate) mod loads;
pub(crate) mod mirror;
pub(crate) mod overview;
pub(crate) mod schemas;
pub(crate) mod topics;
