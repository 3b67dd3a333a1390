//! Fuzz target for `Plan::new` / `Plan::fill`.
//!
//! The input bytes are decoded into `extend_seq_lens` and
//! `extend_logprob_start_lens` (two `i64` lists, usually of the same length),
//! biased towards the values that matter: short batches, `start == extend`,
//! `start == 0`, starts just past their extend, negatives, `i64::MIN`/`MAX`,
//! values around `MAX_TOKENS` and totals that overflow `i64`.
//!
//! Every outcome is checked, and any panic is a bug in the core:
//! * `Plan::new` accepts exactly the batches a small reference model accepts,
//!   and rejects the others with the same kind of error, about the same request;
//! * an error's `request()` is a valid request index and its message is not empty;
//! * an accepted plan passes `invariants::check_plan` (when it is small enough
//!   to fill quickly), and `fill` into a too-short buffer returns `Err`.
#![no_main]

use flatgather_core::{invariants, Field, Plan, PlanError, MAX_TOKENS};
use libfuzzer_sys::fuzz_target;

/// Plans with fewer tokens than this are filled and checked in full.
const FILL_LIMIT: usize = 1 << 20;

/// Reads the input front to back; past its end every read is 0.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    /// A list length: mostly 0..=64, sometimes up to a few thousand.
    fn len(&mut self) -> usize {
        let b = self.u8();
        if b < 195 {
            usize::from(b % 65)
        } else {
            64 + usize::from(self.u16() % 4032)
        }
    }

    /// A length value, biased towards valid extends but reaching every edge.
    fn value(&mut self) -> i64 {
        let sel = self.u8();
        let b = i64::from(self.u8());
        match sel % 20 {
            0..=6 => 1 + b % 16,
            7 => 0,
            8 => b,
            9 => i64::from(self.u16()),
            10 => -1 - b % 4,
            11 => i64::MIN + b % 4,
            12 => i64::MAX - b % 4,
            13 => MAX_TOKENS - b % 4,
            14 => MAX_TOKENS + b % 4,
            15 => MAX_TOKENS / (1 + b % 8) + i64::from(self.u8() as i8 % 4),
            16 => (1i64 << (b % 63)).wrapping_add(i64::from(self.u8() as i8 % 4)),
            17 => -b,
            _ => self.u64() as i64,
        }
    }

    /// A logprob start for a request whose extend is `extend`.
    fn start(&mut self, extend: i64) -> i64 {
        let sel = self.u8();
        match sel % 12 {
            0..=2 => extend,
            3 | 4 => 0,
            5 => extend.wrapping_sub(1 + i64::from(self.u8() % 4)),
            6 => extend.wrapping_add(1 + i64::from(self.u8() % 4)),
            7 => i64::from(self.u8() % 17),
            _ => self.value(),
        }
    }
}

/// The two lists, read from `data`.
fn decode(bytes: &mut Bytes<'_>) -> (Vec<i64>, Vec<i64>) {
    let n_extend = bytes.len();
    let n_start = match bytes.u8() {
        0..=229 => n_extend,
        230..=236 => n_extend + 1,
        237..=242 => n_extend.saturating_sub(1),
        _ => bytes.len(),
    };
    let mut extend = Vec::with_capacity(n_extend);
    let mut start = Vec::with_capacity(n_start);
    for i in 0..n_extend.max(n_start) {
        let e = bytes.value();
        if i < n_extend {
            extend.push(e);
        }
        if i < n_start {
            start.push(bytes.start(e));
        }
    }
    (extend, start)
}

/// What `Plan::new` must answer, written straight from the contract: the
/// batch's token count, or the error's kind, request and (for a negative
/// value) field. Requests are checked in order; within one, in the order the
/// variants of `PlanError` list them.
fn reference(
    extend: &[i64],
    start: &[i64],
) -> Result<i128, (&'static str, Option<usize>, Option<Field>)> {
    if extend.len() != start.len() {
        return Err(("length_mismatch", None, None));
    }
    if extend.is_empty() {
        return Err(("empty_batch", None, None));
    }
    let mut total = 0i128;
    for (i, (&e, &s)) in extend.iter().zip(start).enumerate() {
        if e < 0 {
            return Err(("negative", Some(i), Some(Field::ExtendSeqLens)));
        }
        if s < 0 {
            return Err(("negative", Some(i), Some(Field::ExtendLogprobStartLens)));
        }
        if e == 0 {
            return Err(("zero_extend", Some(i), None));
        }
        if s > e {
            return Err(("start_past_extend", Some(i), None));
        }
        total += i128::from(e);
        if total > i128::from(MAX_TOKENS) {
            return Err(("too_many_tokens", Some(i), None));
        }
    }
    Ok(total)
}

fn check_error(err: &PlanError, len: usize) {
    let msg = err.to_string();
    assert!(!msg.is_empty(), "{err:?}: empty message");
    assert!(!err.kind().is_empty(), "{err:?}: empty kind");
    if let Some(request) = err.request() {
        assert!(request < len, "{err:?}: request {request} out of 0..{len}");
        assert!(
            msg.contains(&format!("request {request}")),
            "{err:?}: message {msg:?} does not name request {request}"
        );
    }
}

/// `fill` into each too-short prefix of `buf` (all of `buf` must be short).
fn check_too_short(plan: &Plan, buf: &mut [i64], with_token_to_seq: bool) {
    let needed = plan.layout(with_token_to_seq).len();
    let got = buf.len();
    match plan.fill(buf, with_token_to_seq) {
        Err(err @ PlanError::BufferTooSmall { .. }) => {
            let want = PlanError::BufferTooSmall { needed, got };
            assert_eq!(err, want, "fill into {got} values");
            check_error(&err, plan.batch_size());
        }
        other => panic!("fill into {got} values (needs {needed}) gave {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let (extend, start) = decode(&mut bytes);
    let want = reference(&extend, &start);
    let plan = match Plan::new(&extend, &start) {
        Err(err) => {
            check_error(&err, extend.len());
            let field = match err {
                PlanError::Negative { field, .. } => Some(field),
                _ => None,
            };
            let got = (err.kind(), err.request(), field);
            assert_eq!(Err(got), want, "Plan::new({extend:?}, {start:?}) = {err:?}");
            return;
        }
        Ok(plan) => plan,
    };
    let total = match want {
        Ok(total) => total,
        Err(want) => panic!("Plan::new({extend:?}, {start:?}) accepted, want {want:?}"),
    };

    // Counts: cheap, so checked on every plan, however large.
    assert_eq!(plan.batch_size(), extend.len(), "batch_size");
    assert_eq!(plan.num_tokens() as i128, total, "num_tokens");
    assert!(
        plan.num_pruned() >= plan.batch_size(),
        "fewer kept rows than requests"
    );
    assert!(
        plan.num_pruned() <= plan.num_tokens(),
        "more kept rows than tokens"
    );
    assert!(
        plan.num_input_logprob() <= plan.num_pruned(),
        "more logprob rows than kept rows"
    );
    let rows = plan.num_tokens() as i64;
    assert_eq!(plan.check_rows(rows), Ok(()), "check_rows(num_tokens)");
    for bad in [rows + 1, rows - 1, -1, i64::MIN, i64::MAX] {
        match plan.check_rows(bad) {
            Err(err @ PlanError::RowMismatch { .. }) => check_error(&err, extend.len()),
            other => panic!("check_rows({bad}) with {rows} tokens gave {other:?}"),
        }
    }
    for with_token_to_seq in [false, true] {
        check_too_short(&plan, &mut [], with_token_to_seq);
    }
    if plan.num_tokens() >= FILL_LIMIT {
        return;
    }

    // Small enough to fill: the whole contract.
    if let Err(msg) = invariants::check_plan(&plan, &extend, &start) {
        panic!("check_plan({extend:?}, {start:?}): {msg}");
    }
    let full = plan.layout(true);
    let short = plan.layout(false);
    let mut buf = vec![-1i64; full.len() + 2];
    for with_token_to_seq in [false, true] {
        let needed = plan.layout(with_token_to_seq).len();
        check_too_short(&plan, &mut buf[..needed - 1], with_token_to_seq);
        let cut = usize::from(bytes.u16()) % needed;
        check_too_short(&plan, &mut buf[..cut], with_token_to_seq);
    }
    // A failed fill writes nothing; a fill without token_to_seq writes the
    // same first three parts and leaves the values past its layout alone.
    assert!(
        buf.iter().all(|&v| v == -1),
        "a failed fill wrote to the buffer"
    );
    plan.fill(&mut buf, false)
        .expect("fill without token_to_seq");
    assert!(
        buf[short.len()..].iter().all(|&v| v == -1),
        "fill wrote past its layout"
    );
    let mut with = vec![-1i64; full.len()];
    plan.fill(&mut with, true).expect("fill with token_to_seq");
    assert_eq!(
        buf[..short.len()],
        with[..short.len()],
        "the parts differ with token_to_seq"
    );
});
