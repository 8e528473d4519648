//! `sb-test-worker`: a cluster worker process for the tests (being built).

fn main() {}
