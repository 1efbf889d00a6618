//! The segment's budget: how long it runs before it yields (steps and time, `loop.yieldAfter`),
//! and the model's context budget (`model.contextWindow`) the loop compacts against.
//!
//! Invariant: both are fixed when the segment opens; only the clock moves.

use std::time::{Duration, Instant};

use crate::agent::context::Budget;
use crate::nylorun::turn::turn_start::TurnStart;

/// What the segment may spend.
pub(super) struct SegmentBudget {
    /// When the segment started.
    pub(super) started: Instant,
    /// The segment yields at this step, or after this long.
    pub(super) yield_steps: u32,
    pub(super) yield_after: Duration,
    /// The model's context budget, if it has one.
    pub(super) context: Option<Budget>,
}

impl SegmentBudget {
    /// The budget `ts` grants, starting now.
    pub(super) fn new(ts: &TurnStart) -> Self {
        let (yield_steps, yield_after) = ts.yield_after();
        SegmentBudget {
            started: Instant::now(),
            yield_steps,
            yield_after,
            context: ts.budget(),
        }
    }

    /// Whether the segment yields before step `step`.
    pub(super) fn should_yield(&self, step: u32) -> bool {
        step >= self.yield_steps || self.started.elapsed() >= self.yield_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_yields_at_its_step_or_its_time() {
        let budget = |steps, after| SegmentBudget {
            started: Instant::now(),
            yield_steps: steps,
            yield_after: after,
            context: None,
        };
        let b = budget(3, Duration::from_secs(3600));
        assert!(!b.should_yield(2));
        assert!(b.should_yield(3));
        assert!(budget(50, Duration::ZERO).should_yield(0));
    }
}
