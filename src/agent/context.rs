//! The context budget: how large the next prompt is, when the history must be compacted, and
//! the compaction itself — the same for every front.
//!
//! Owns: the token estimate ([`estimate_tokens`]), the prompt's size as the loop tracks it (each
//! call's measured `usage` plus an estimate of what was added since: [`Tracker`]), the working
//! window (the model's, shrunk to what the server said after an overflow), and the plan of a
//! compaction (which units of the history are summarized, which are kept verbatim, whether the
//! kept tail's tool results shrink to previews: [`plan`]). Running a compaction through the
//! host is [`super::compaction`]'s.
//!
//! A host describes its history as [`Unit`]s, in order: what the model must always see
//! (`Pinned`: a dataset's system message), a summary an earlier compaction wrote, a turn's
//! input, and steps (one model answer with the results of its tool calls). The loop cuts only
//! between units, so a tool result never goes without its call.
//!
//! Invariants:
//! * Every decision is a pure function of the host's history, the recorded answers' `usage` and
//!   the recorded failures: a replayed segment compacts at the same steps, with the same summary
//!   calls (the host gives them ids from the step, the trigger and the part), so it asks for the
//!   same effects with the same hashes.
//! * Never a loop: a compaction runs at most once per model call (the threshold before it, or
//!   an overflow after it, which also allows one retry); a prompt that still cannot fit ends the
//!   turn with an error that says so.
//! * What is kept verbatim is the pinned units, the latest input, and the most recent steps (at
//!   least the last one, its tool results shrunk to previews when it alone is past the budget).
//!   Everything else becomes one summary, written in parts when it is itself past the window.
//!
//! Non-goals: effects (the compaction module runs them through the host), how a front stores the
//! compacted history or words a summary call (its host does), exact token counts (the estimate
//! is calibrated by each answer's `usage`, never trusted alone).

use std::sync::OnceLock;

use super::model::{ModelFailure, Usage};
use crate::floor::text::truncate_middle;

/// The share of the usable window at which the loop compacts, unless configured otherwise.
pub const DEFAULT_THRESHOLD: f64 = 0.8;
/// The room an answer needs when the model's settings name none: at most this many tokens,
/// and at most an eighth of the window.
pub const DEFAULT_ANSWER_TOKENS: u64 = 4096;
/// What a compaction aims for: this share of the usable window, summary and tail included.
const TARGET_AFTER: f64 = 0.5;
/// A summary's room: a tenth of the usable window, within these bounds.
const SUMMARY_MIN_TOKENS: u64 = 128;
const SUMMARY_MAX_TOKENS: u64 = 4096;

/// Estimated tokens of `text`: a byte count over three. English runs nearer four bytes a token
/// and CJK text three, so this errs towards too many; each answer's `usage` calibrates it.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(3)
}

/// Estimated tokens of a JSON value as it is sent.
pub fn estimate_json(value: &serde_json::Value) -> u64 {
    estimate_tokens(&value.to_string())
}

/// Bytes a preview keeps from the start and from the end of a text.
const PREVIEW_HEAD_BYTES: usize = 1024;
const PREVIEW_TAIL_BYTES: usize = 256;

/// A long text as a preview: its first KiB and its last 256 bytes, cut on character boundaries,
/// with how much was left out between them.
pub fn preview_text(text: &str) -> String {
    if text.len() <= PREVIEW_HEAD_BYTES + PREVIEW_TAIL_BYTES + 64 {
        return text.to_owned();
    }
    let mut head = PREVIEW_HEAD_BYTES;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - PREVIEW_TAIL_BYTES;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n… [{} bytes omitted] …\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

/// `text` cut in the middle so that its estimate is at most `tokens`.
pub fn clip_to_tokens(text: &str, tokens: u64) -> String {
    if estimate_tokens(text) <= tokens {
        return text.to_owned();
    }
    let mut chars = usize::try_from(tokens.saturating_mul(3)).unwrap_or(usize::MAX);
    loop {
        let (out, _) = truncate_middle(text, chars);
        let est = estimate_tokens(&out);
        if est <= tokens || chars < 64 {
            return out;
        }
        chars = (chars as u64 * tokens / est.max(1)).saturating_sub(16) as usize;
    }
}

/// What the model can take, in tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// The context window: prompt and answer together.
    pub window: u64,
    /// The room the answer needs (`maxOutputTokens`, `max_tokens`).
    pub answer: u64,
    /// The share of `window - answer` past which the loop compacts.
    pub threshold: f64,
    /// The answer's room as the model's settings name it (`None`: the default was taken).
    pub named_answer: Option<u64>,
    /// The window is a default, not the model's own: the loop compacts to it, but leaves a
    /// prompt it cannot fit to the server to refuse (whose answer names the real window).
    pub assumed: bool,
}

impl Budget {
    /// A budget for `window`, with `answer` tokens for the answer (a default when unknown).
    pub fn new(window: u64, answer: Option<u64>, threshold: f64) -> Budget {
        let named_answer = answer.filter(|a| *a > 0);
        let room = named_answer.unwrap_or_else(|| DEFAULT_ANSWER_TOKENS.min(window / 8));
        Budget {
            window,
            answer: room.min(window / 2),
            threshold: if threshold.is_finite() {
                threshold.clamp(0.05, 1.0)
            } else {
                DEFAULT_THRESHOLD
            },
            named_answer,
            assumed: false,
        }
    }

    /// The same budget, its window a default rather than the model's own.
    pub fn assumed(self) -> Budget {
        Budget {
            assumed: true,
            ..self
        }
    }

    /// The most tokens a prompt may have.
    pub fn usable(&self) -> u64 {
        self.window.saturating_sub(self.answer)
    }

    /// The prompt size past which the loop compacts.
    pub fn threshold_tokens(&self) -> u64 {
        (self.usable() as f64 * self.threshold) as u64
    }

    /// The room of one summary's answer.
    pub fn summary_tokens(&self) -> u64 {
        (self.usable() / 10).clamp(SUMMARY_MIN_TOKENS, SUMMARY_MAX_TOKENS)
    }
}

/// What a unit of the history is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitKind {
    /// Always kept verbatim, never summarized (a dataset's system message).
    Pinned,
    /// A summary an earlier compaction wrote: folded into the next one.
    Summary,
    /// A turn's input (a user's message, or several in a row).
    Input,
    /// One model answer and the results of its tool calls.
    Step,
}

/// One unit of the history, as the next prompt holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub kind: UnitKind,
    /// Estimated tokens.
    pub tokens: u64,
    /// Estimated tokens with its tool results shrunk to previews.
    pub shrunk: u64,
}

impl Unit {
    pub fn new(kind: UnitKind, tokens: u64) -> Unit {
        Unit {
            kind,
            tokens,
            shrunk: tokens,
        }
    }
}

/// The next model call as the loop sizes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Context {
    /// The model's budget; `None` while the window is unknown.
    pub budget: Option<Budget>,
    /// Estimated tokens of what every call carries outside the history (instructions, tools,
    /// a pinned memory index).
    pub fixed: u64,
    pub units: Vec<Unit>,
}

impl Context {
    /// The whole prompt's estimate.
    pub fn estimate(&self) -> u64 {
        self.fixed + self.units.iter().map(|u| u.tokens).sum::<u64>()
    }
}

/// Why a compaction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The next call would pass the threshold.
    Threshold,
    /// A call failed for context overflow.
    Overflow,
}

impl Trigger {
    /// The wire name (`CompactionFactsSchema.trigger`).
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Threshold => "threshold",
            Trigger::Overflow => "overflow",
        }
    }
}

/// The prompt's size across calls: the last measured prompt and the estimate it was measured
/// against, and the working window an overflow taught.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tracker {
    /// `(measured tokens, our estimate of that prompt)`.
    measured: Option<(u64, u64)>,
    /// The estimate of the prompt last sent (or about to be).
    sent: u64,
    /// The window an overflow said (or the failed prompt's size).
    learned_window: Option<u64>,
}

impl Tracker {
    /// How many real tokens one estimated token is worth, as last measured (at least 1: the
    /// estimate is never trusted to be too high).
    pub fn ratio(&self) -> f64 {
        match self.measured {
            Some((actual, est)) if est > 0 => (actual as f64 / est as f64).clamp(1.0, 8.0),
            _ => 1.0,
        }
    }

    /// The prompt's size for an estimate `estimate` of it: the last measured size plus what
    /// was added since (scaled by the measured ratio), or, when the history shrank, the scaled
    /// estimate.
    pub fn prompt(&self, estimate: u64) -> u64 {
        let r = self.ratio();
        match self.measured {
            Some((actual, est)) if estimate >= est => {
                actual + ((estimate - est) as f64 * r).ceil() as u64
            }
            _ => (estimate as f64 * r).ceil() as u64,
        }
    }

    /// A prompt of `estimate` is being sent.
    pub fn sending(&mut self, estimate: u64) {
        self.sent = estimate;
    }

    /// The answer to the prompt last sent reported `usage`.
    pub fn measured(&mut self, usage: Option<&Usage>) {
        if let Some(tokens) = usage.and_then(|u| u.input_tokens).filter(|t| *t > 0) {
            self.measured = Some((tokens, self.sent.max(1)));
        }
    }

    /// The prompt last sent overflowed: learn the window (and the prompt's size) the server
    /// said, or take the failed prompt's size as the window.
    pub fn overflowed(&mut self, failure: &ModelFailure) {
        let facts = overflow_facts(&failure.message);
        if let Some(tokens) = facts.prompt {
            self.measured = Some((tokens, self.sent.max(1)));
        }
        let window = facts.limit.unwrap_or_else(|| self.prompt(self.sent));
        self.learned_window = Some(self.learned_window.map_or(window, |w| w.min(window)));
    }

    /// The working budget: the model's, its window shrunk to what an overflow taught. `None`
    /// when no window is known.
    pub fn working(&self, model: Option<Budget>) -> Option<Budget> {
        match (model, self.learned_window) {
            (Some(b), Some(w)) if w < b.window || b.assumed => {
                Some(Budget::new(w, b.named_answer, b.threshold))
            }
            (Some(b), _) => Some(b),
            (None, Some(w)) => Some(Budget::new(w, None, DEFAULT_THRESHOLD)),
            (None, None) => None,
        }
    }
}

/// What an overflow's message says: the model's limit and the prompt's size, when it says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverflowFacts {
    pub limit: Option<u64>,
    pub prompt: Option<u64>,
}

/// Reads the numbers of the usual overflow messages (OpenAI, vLLM, Anthropic, the gates):
/// "maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens",
/// "prompt is too long: 210000 tokens > 200000 maximum", "context window of 4096 tokens".
pub fn overflow_facts(message: &str) -> OverflowFacts {
    /// What a pattern's numbers are: the limit, the prompt, or both (prompt then limit).
    #[derive(Clone, Copy)]
    enum Says {
        Limit,
        Prompt,
        PromptThenLimit,
    }
    static PATTERNS: OnceLock<Vec<(regex::Regex, Says)>> = OnceLock::new();
    let patterns = PATTERNS.get_or_init(|| {
        [
            (r"(?i)maximum context length (?:is|of) (\d+)", Says::Limit),
            (
                r"(?i)context (?:window|length|limit) (?:is|of) (\d+)",
                Says::Limit,
            ),
            (r"(?i)limit (?:is|of) (\d+) tokens", Says::Limit),
            (r"(?i)(\d+) tokens? > (\d+) maximum", Says::PromptThenLimit),
            (r"(?i)(\d+) in the messages", Says::Prompt),
            (r"(?i)resulted in (\d+) tokens", Says::Prompt),
            (r"(?i)requested (\d+) tokens", Says::Prompt),
            (r"(?i)prompt (?:has|is|contains) (\d+) tokens", Says::Prompt),
        ]
        .into_iter()
        .filter_map(|(p, says)| regex::Regex::new(p).ok().map(|re| (re, says)))
        .collect()
    });
    let mut facts = OverflowFacts::default();
    for (re, says) in patterns {
        let Some(c) = re.captures(message) else {
            continue;
        };
        let n = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<u64>().ok());
        match says {
            Says::Limit => facts.limit = facts.limit.or(n(1)),
            Says::Prompt => facts.prompt = facts.prompt.or(n(1)),
            Says::PromptThenLimit => {
                facts.prompt = facts.prompt.or(n(1));
                facts.limit = facts.limit.or(n(2));
            }
        }
    }
    facts
}

/// Which units a compaction summarizes and keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub summarized: Vec<usize>,
    pub kept: Vec<usize>,
    pub shrink: bool,
}

impl Plan {
    /// Whether the compaction would change nothing.
    pub fn is_empty(&self) -> bool {
        self.summarized.is_empty() && !self.shrink
    }
}

/// The plan for `ctx` under `budget`, estimates scaled by `ratio`: keep the pinned units, the
/// latest input and as many recent steps as fit what is left of half the usable window once
/// the summary has its room (at least the last step); summarize the rest; shrink the kept
/// steps' tool results when they alone are past their share.
pub fn plan(ctx: &Context, budget: &Budget, ratio: f64) -> Plan {
    let scale = |t: u64| (t as f64 * ratio).ceil() as u64;
    let units = &ctx.units;
    let last_input = units.iter().rposition(|u| u.kind == UnitKind::Input);
    let pinned: Vec<usize> = (0..units.len())
        .filter(|&i| units[i].kind == UnitKind::Pinned)
        .collect();
    let fixed = scale(ctx.fixed) + pinned.iter().map(|&i| scale(units[i].tokens)).sum::<u64>();
    let input = last_input.map_or(0, |i| scale(units[i].tokens));
    let target = (budget.usable() as f64 * TARGET_AFTER) as u64;
    let tail_room = target.saturating_sub(fixed + input + budget.summary_tokens());

    let first_tail = last_input.map_or(0, |i| i + 1);
    let mut steps = Vec::new();
    let mut tail = 0u64;
    for i in (first_tail..units.len()).rev() {
        if units[i].kind != UnitKind::Step {
            continue;
        }
        let t = scale(units[i].tokens);
        if !steps.is_empty() && tail + t > tail_room {
            break;
        }
        steps.push(i);
        tail += t;
    }
    steps.reverse();
    let first_kept_step = steps.first().copied().unwrap_or(units.len());

    let mut kept = pinned.clone();
    kept.extend(last_input);
    kept.extend(steps.iter().copied());
    let summarized: Vec<usize> = (0..units.len())
        .filter(|i| !kept.contains(i))
        .filter(|&i| i < first_kept_step || units[i].kind != UnitKind::Step)
        .collect();
    // Summarizing only an earlier summary gains nothing: it stays, first.
    let summarized = if summarized
        .iter()
        .all(|&i| units[i].kind == UnitKind::Summary)
    {
        let mut first = summarized;
        first.extend(kept);
        kept = first;
        Vec::new()
    } else {
        summarized
    };
    let shrink = tail > tail_room && steps.iter().any(|&i| units[i].shrunk < units[i].tokens);
    Plan {
        summarized,
        kept,
        shrink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn units(kinds: &[(UnitKind, u64)]) -> Vec<Unit> {
        kinds.iter().map(|&(k, t)| Unit::new(k, t)).collect()
    }

    #[test]
    fn budgets_keep_room_for_the_answer() {
        let b = Budget::new(10_000, Some(1000), 0.8);
        assert_eq!((b.usable(), b.threshold_tokens()), (9000, 7200));
        assert_eq!(b.summary_tokens(), 900);
        // No answer room named: an eighth of the window, at most the default.
        assert_eq!(Budget::new(8000, None, 0.8).answer, 1000);
        assert_eq!(Budget::new(1_000_000, None, 0.8).answer, 4096);
        // An answer room past half the window is held to half.
        assert_eq!(Budget::new(1000, Some(900), 0.8).answer, 500);
    }

    #[test]
    fn the_tracker_adds_an_estimate_to_the_last_measure() {
        let mut t = Tracker::default();
        assert_eq!(t.prompt(100), 100);
        t.sending(100);
        t.measured(Some(&Usage {
            input_tokens: Some(150),
            ..Usage::default()
        }));
        assert_eq!(t.ratio(), 1.5);
        // 150 measured, 20 estimated tokens added since, scaled by 1.5.
        assert_eq!(t.prompt(120), 180);
        // The history shrank (a compaction): the scaled estimate.
        assert_eq!(t.prompt(40), 60);
        // A model that counts fewer tokens than the estimate is never trusted below it.
        t.measured(Some(&Usage {
            input_tokens: Some(50),
            ..Usage::default()
        }));
        assert_eq!(t.ratio(), 1.0);
        assert_eq!(t.prompt(130), 80);
    }

    #[test]
    fn an_overflow_teaches_the_window() {
        let mut t = Tracker::default();
        t.sending(900);
        t.overflowed(&ModelFailure::new(
            "context_overflow",
            "This model's maximum context length is 1000 tokens. However, your messages resulted \
             in 1200 tokens.",
            false,
        ));
        let b = t.working(Some(Budget::new(4000, Some(100), 0.8))).unwrap();
        assert_eq!((b.window, b.answer), (1000, 100));
        // A default answer room is taken afresh for the window learned.
        let b = t.working(Some(Budget::new(100_000, None, 0.8))).unwrap();
        assert_eq!((b.window, b.answer), (1000, 125));
        // A window that was only assumed gives way to the one learned, even a larger one.
        let mut big = Tracker::default();
        big.sending(10);
        big.overflowed(&ModelFailure::new(
            "context_overflow",
            "maximum context length is 200000 tokens",
            false,
        ));
        let b = big
            .working(Some(Budget::new(128_000, None, 0.8).assumed()))
            .unwrap();
        assert_eq!((b.window, b.assumed), (200_000, false));
        assert_eq!(t.prompt(900), 1200);
        // Without numbers, the failed prompt's size is the window.
        let mut t = Tracker::default();
        t.sending(700);
        t.overflowed(&ModelFailure::new("context_overflow", "too long", false));
        assert_eq!(t.working(None).unwrap().window, 700);
    }

    #[test]
    fn overflow_messages_give_their_numbers() {
        assert_eq!(
            overflow_facts(
                "This model's maximum context length is 4096 tokens. However, you requested 5000 \
                 tokens (4000 in the messages, 1000 in the completion)."
            ),
            OverflowFacts {
                limit: Some(4096),
                prompt: Some(4000)
            }
        );
        assert_eq!(
            overflow_facts("prompt is too long: 210000 tokens > 200000 maximum"),
            OverflowFacts {
                limit: Some(200000),
                prompt: Some(210000)
            }
        );
        assert_eq!(overflow_facts("nope"), OverflowFacts::default());
    }

    #[test]
    fn a_plan_keeps_the_latest_input_and_recent_steps() {
        use UnitKind::*;
        let b = Budget::new(10_000, Some(1000), 0.8);
        // Half the usable window is 4500; 100 fixed, 200 input, 900 summary room: 3300 for steps.
        let ctx = Context {
            budget: Some(b),
            fixed: 100,
            units: units(&[
                (Pinned, 50),
                (Summary, 300),
                (Input, 100),
                (Step, 2000),
                (Input, 200),
                (Step, 2000),
                (Step, 1500),
                (Step, 1500),
            ]),
        };
        // Pinned 50 joins the fixed part: 3250 for steps, which holds the last two.
        assert_eq!(
            plan(&ctx, &b, 1.0),
            Plan {
                summarized: vec![1, 2, 3, 5],
                kept: vec![0, 4, 6, 7],
                shrink: false
            }
        );
        // A last step past the tail's room is kept and shrunk.
        let mut big = ctx.clone();
        big.units.truncate(6);
        big.units[5].shrunk = 300;
        big.units[5].tokens = 6000;
        assert_eq!(
            plan(&big, &b, 1.0),
            Plan {
                summarized: vec![1, 2, 3],
                kept: vec![0, 4, 5],
                shrink: true
            }
        );
        // Only an earlier summary before the kept part: nothing to summarize, and it stays.
        let small = Context {
            budget: Some(b),
            fixed: 0,
            units: units(&[(Summary, 300), (Input, 100), (Step, 100)]),
        };
        let p = plan(&small, &b, 1.0);
        assert!(p.is_empty());
        assert_eq!(p.kept, vec![0, 1, 2]);
    }

    #[test]
    fn clipping_holds_text_to_its_tokens() {
        let text = "word ".repeat(1000);
        let clipped = clip_to_tokens(&text, 100);
        assert!(estimate_tokens(&clipped) <= 100, "{}", clipped.len());
        assert!(clipped.contains("characters omitted"));
        assert_eq!(clip_to_tokens("short", 100), "short");
    }
}
