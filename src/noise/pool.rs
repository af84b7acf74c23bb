//! The noise pool (issue 3).
