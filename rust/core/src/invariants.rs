//! The properties every plan must have, stated independently of how
//! [`Plan::fill`](crate::Plan::fill) computes it. Unit tests, property tests
//! and the fuzz target all check plans through [`check`].

use crate::Plan;

/// Checks the index sets a plan wrote for `extend`/`start` (already accepted
/// by [`Plan::new`]) against the contract, request by request:
///
/// * request `i` keeps exactly the rows `[start_i, extend_i)` of its own rows,
///   in order, or only its last row when `start_i == extend_i`;
/// * `token_to_seq` is `i` on each of them (so it never decreases);
/// * `sample[i]` is the position of request `i`'s last kept row (so `sample`
///   strictly increases);
/// * `input_logprob` lists, in order, the positions of the kept rows of every
///   request with `start_i < extend_i`, and nothing else.
pub fn check(
    extend: &[i64],
    start: &[i64],
    gather: &[i64],
    sample: &[i64],
    input_logprob: &[i64],
    token_to_seq: &[i64],
) -> Result<(), String> {
    if sample.len() != extend.len() {
        return Err(format!(
            "sample has {} values for {} requests",
            sample.len(),
            extend.len()
        ));
    }
    if gather.len() != token_to_seq.len() {
        return Err(format!(
            "gather has {} values, token_to_seq {}",
            gather.len(),
            token_to_seq.len()
        ));
    }
    let (mut offset, mut pos, mut lp) = (0i64, 0usize, 0usize);
    for (i, (&e, &s)) in extend.iter().zip(start).enumerate() {
        let first = if s == e { e - 1 } else { s };
        let kept = (e - first) as usize;
        let rows = gather.get(pos..pos + kept).ok_or_else(|| {
            format!(
                "request {i}: gather ends at {} before its rows",
                gather.len()
            )
        })?;
        for (j, &row) in rows.iter().enumerate() {
            let want = offset + first + j as i64;
            if row != want {
                return Err(format!(
                    "request {i}: gather[{}] = {row}, want {want}",
                    pos + j
                ));
            }
        }
        if token_to_seq[pos..pos + kept].iter().any(|&t| t != i as i64) {
            return Err(format!("request {i}: token_to_seq is not {i} on its rows"));
        }
        let last = (pos + kept - 1) as i64;
        if sample[i] != last {
            return Err(format!("request {i}: sample = {}, want {last}", sample[i]));
        }
        if s < e {
            let got = input_logprob
                .get(lp..lp + kept)
                .ok_or_else(|| format!("request {i}: input_logprob too short"))?;
            for (j, &p) in got.iter().enumerate() {
                if p != (pos + j) as i64 {
                    return Err(format!(
                        "request {i}: input_logprob[{}] = {p}, want {}",
                        lp + j,
                        pos + j
                    ));
                }
            }
            lp += kept;
        }
        offset += e;
        pos += kept;
    }
    if pos != gather.len() {
        return Err(format!(
            "gather has {} values, the requests keep {pos}",
            gather.len()
        ));
    }
    if lp != input_logprob.len() {
        return Err(format!(
            "input_logprob has {} values, want {lp}",
            input_logprob.len()
        ));
    }
    Ok(())
}

/// Builds `plan`'s flat buffer and runs [`check`] on its parts.
pub fn check_plan(plan: &Plan, extend: &[i64], start: &[i64]) -> Result<(), String> {
    let layout = plan.layout(true);
    // A sentinel that no index can equal shows parts the fill skipped.
    let mut buf = vec![-1i64; layout.len()];
    plan.fill(&mut buf, true).map_err(|e| e.to_string())?;
    let (gather, rest) = buf.split_at(layout.gather);
    let (sample, rest) = rest.split_at(layout.sample);
    let (input_logprob, token_to_seq) = rest.split_at(layout.input_logprob);
    check(extend, start, gather, sample, input_logprob, token_to_seq)?;
    if plan.gather() != gather
        || plan.sample() != sample
        || plan.input_logprob() != input_logprob
        || plan.token_to_seq() != token_to_seq
    {
        return Err("the per-part accessors disagree with fill".into());
    }
    Ok(())
}
