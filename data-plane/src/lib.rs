//! `nereid-data-plane`: everything that runs models on one node.

pub mod backend;
