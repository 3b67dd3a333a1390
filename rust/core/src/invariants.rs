//! The properties every plan must have, stated independently of how
//! [`PrunePlan::fill`](crate::PrunePlan::fill) and
//! [`RotationPlan::fill`](crate::RotationPlan::fill) compute them. Unit tests, property tests
//! and the fuzz target all check plans through [`check`].

use crate::{Entry, PrunePlan, RotationPlan, SpecLogprobsPlan, TokenIdsPlan, Walk};

/// Checks the index sets a plan wrote for `extend`/`start` (already accepted
/// by [`PrunePlan::new`]) against the contract, request by request:
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
pub fn check_plan(plan: &PrunePlan, extend: &[i64], start: &[i64]) -> Result<(), String> {
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

/// Checks a rotation's index sets for `lens` (already accepted by
/// [`RotationPlan::new`]), with `n = sum(lens)` rows and the tails after them:
///
/// * `ids`: row `j` of request `i` reads the next row of the same request,
///   and the request's last row reads the tail `n + i`;
/// * `embeds`: the same rows, except that each request's last row (which
///   SGLang leaves unwritten) reads some row of its own request.
pub fn check_rotation(lens: &[i64], ids: &[i64], embeds: &[i64]) -> Result<(), String> {
    let n: i64 = lens.iter().sum();
    if ids.len() as i64 != n || embeds.len() as i64 != n {
        return Err(format!(
            "{} ids and {} embeds for {n} rows",
            ids.len(),
            embeds.len()
        ));
    }
    let mut offset = 0i64;
    for (i, &len) in lens.iter().enumerate() {
        let last = offset + len - 1;
        for r in offset..last {
            let (got_id, got_embed) = (ids[r as usize], embeds[r as usize]);
            if got_id != r + 1 || got_embed != r + 1 {
                return Err(format!(
                    "request {i}, row {r}: ids {got_id}, embeds {got_embed}, want {}",
                    r + 1
                ));
            }
        }
        if ids[last as usize] != n + i as i64 {
            return Err(format!(
                "request {i}: last row reads {}, want its tail {}",
                ids[last as usize],
                n + i as i64
            ));
        }
        if !(offset..=last).contains(&embeds[last as usize]) {
            return Err(format!(
                "request {i}: last embeds row reads {}, outside the request",
                embeds[last as usize]
            ));
        }
        offset += len;
    }
    Ok(())
}

/// Builds `plan`'s buffer (ids and embeds) and runs [`check_rotation`].
pub fn check_rotation_plan(plan: &RotationPlan, lens: &[i64]) -> Result<(), String> {
    let n = plan.num_tokens();
    let mut buf = vec![-1i64; plan.buffer_len(true)];
    plan.fill(&mut buf, true).map_err(|e| e.to_string())?;
    let (ids, embeds) = buf.split_at(n);
    check_rotation(lens, ids, embeds)?;
    let mut ids_only = vec![-1i64; plan.buffer_len(false) + 1];
    plan.fill(&mut ids_only, false).map_err(|e| e.to_string())?;
    if ids_only[..n] != *ids || ids_only[n] != -1 {
        return Err("fill without embeds wrote other ids, or past its part".into());
    }
    if plan.ids() != ids || plan.embeds() != embeds {
        return Err("the per-part accessors disagree with fill".into());
    }
    Ok(())
}

/// One output entry as the release builds it, row by row: `None` for an
/// entry appended empty (not positive pruned length), else whether it
/// extends the previous entry and its rows, each a list of `(row, id)`.
pub type ModelEntry = Option<(bool, Vec<Vec<(i64, i64)>>)>;

/// The release's token-ids walk, row by row as SGLang 0.5.10 to 0.5.20 write
/// it, independent of [`TokenIdsPlan`]'s per-request arithmetic: the entries
/// and the returned split. `None` where a [`Walk::whole`] plan must refuse.
pub fn token_ids_model(
    pruned_lens: &[i64],
    token_ids: &[Option<&[i64]>],
    walk: Walk,
) -> Option<(Vec<ModelEntry>, i64)> {
    let mut out = Vec::new();
    if walk.skip_empty && walk.rows == 0 {
        return Some((out, 0));
    }
    let (mut pt, mut next_split, mut split) = (0i64, 0i64, walk.split);
    for (n, (&len, &ids)) in pruned_lens.iter().zip(token_ids).enumerate() {
        let mut len = len;
        if n == 0 {
            len -= split;
        } else {
            split = 0;
        }
        if len <= 0 {
            out.push(None);
            continue;
        }
        if walk.whole && (ids.is_none() || pt + len > walk.rows) {
            return None;
        }
        let mut rows = Vec::new();
        for j in 0..len {
            if pt + j >= walk.rows {
                next_split = split + j;
                break;
            }
            if let Some(ids) = ids {
                rows.push(ids.iter().map(|&id| (pt + j, id)).collect());
            }
        }
        if !(walk.skip_empty && rows.is_empty()) {
            out.push(Some((split > 0, rows)));
        }
        pt += len;
    }
    Some((out, next_split))
}

/// Checks `plan` against [`token_ids_model`]: the same entries, and the
/// `(row, id)` pairs [`TokenIdsPlan::fill`] writes nest into them in order.
pub fn check_token_ids(
    plan: &TokenIdsPlan,
    pruned_lens: &[i64],
    token_ids: &[Option<&[i64]>],
    walk: Walk,
) -> Result<(), String> {
    let (model, split) =
        token_ids_model(pruned_lens, token_ids, walk).ok_or("the model refuses this walk")?;
    if plan.next_split() != split {
        return Err(format!("next_split {}, want {split}", plan.next_split()));
    }
    let (rows, cols) = (plan.rows(), plan.cols());
    let n = plan.num_values();
    let vocab = plan.vocab();
    let mut buf = vec![-1i64; plan.buffer_len(true) + 1];
    plan.fill(&mut buf, true).map_err(|e| e.to_string())?;
    if buf[2 * n] != -1 || buf[n..2 * n] != rows[..] {
        return Err("fill wrote other rows, or past its buffer".into());
    }
    for (i, (&row, &id)) in rows.iter().zip(&cols).enumerate() {
        if buf[i] != row * vocab + id.rem_euclid(vocab) {
            return Err(format!(
                "value {i}: flat index {}, row {row}, id {id}",
                buf[i]
            ));
        }
    }
    let mut flat_only = vec![-1i64; plan.buffer_len(false) + 1];
    plan.fill(&mut flat_only, false)
        .map_err(|e| e.to_string())?;
    if flat_only[..n] != buf[..n] || flat_only[n] != -1 {
        return Err("fill without rows wrote other values, or past its part".into());
    }
    let pairs: Vec<(i64, i64)> = rows.into_iter().zip(cols).collect();
    if pairs.len() != n {
        return Err("a number of values other than num_values".into());
    }
    if plan.nest(n + 1).is_ok() || n.checked_sub(1).is_some_and(|m| plan.nest(m).is_ok()) {
        return Err("nest takes a number of values other than num_values".into());
    }
    // The rows, cut as the binding cuts the gathered values, must tile them
    // in order and carry, beside each row, the list of ids it was read at.
    let mut got: Vec<ModelEntry> = Vec::new();
    let mut at = 0;
    for entry in plan.nest(n).map_err(|e| e.to_string())? {
        let mut nested = Vec::new();
        for range in entry.row_values() {
            if range.start != at {
                return Err(format!("a row at {range:?}, want it from {at}"));
            }
            at = range.end;
            let values = pairs.get(range).ok_or("a row past the values")?;
            let asked = entry.ids_of().and_then(|r| token_ids[r]);
            if !values
                .iter()
                .map(|&(_, id)| id)
                .eq(asked.into_iter().flatten().copied())
            {
                return Err(format!("{entry:?}: a row read other ids than {asked:?}"));
            }
            nested.push(values.to_vec());
        }
        if entry.ids_of().is_some() == nested.is_empty() {
            return Err(format!(
                "{entry:?}: ids_of without rows, or rows without it"
            ));
        }
        got.push(match entry {
            Entry::Empty => None,
            Entry::Rows { .. } => Some((entry.extends(), nested)),
        });
    }
    if at != n {
        return Err(format!("the rows end at {at} of {n} values"));
    }
    if got != model {
        return Err(format!("entries {got:?}, want {model:?}"));
    }
    Ok(())
}

/// The release's `get_top_logprobs` on a decode step, row by row: row `i`
/// reads `values[i][:k_i]` of the `[rows, max_k]` top-k tensor. The flat
/// positions each row reads.
pub fn top_k_model(top_logprobs_nums: &[i64]) -> Vec<Vec<usize>> {
    let max_k = top_logprobs_nums.iter().copied().max().unwrap_or(0) as usize;
    let mut out = Vec::new();
    for (i, &k) in top_logprobs_nums.iter().enumerate() {
        let mut row = Vec::new();
        for j in 0..k as usize {
            row.push(i * max_k + j);
        }
        out.push(row);
    }
    out
}

/// The release's `get_token_ids_logprobs` on a decode step, row by row:
/// row `i` reads `logprobs[i, ids_i]` (negative ids from the end of the
/// row), as flat indices into the row-major logprobs; None for a row
/// without ids.
pub fn token_ids_decode_model(token_ids: &[Option<&[i64]>], vocab: i64) -> Vec<Option<Vec<i64>>> {
    let mut out = Vec::new();
    for (i, ids) in token_ids.iter().enumerate() {
        out.push(ids.map(|ids| {
            ids.iter()
                .map(|&id| i as i64 * vocab + id.rem_euclid(vocab))
                .collect()
        }));
    }
    out
}

/// Cuts `0..total` by `sizes`, keeping every `step`-th piece from the first.
fn pieces(sizes: &[i64], step: usize) -> Result<Vec<std::ops::Range<usize>>, String> {
    let mut at = 0usize;
    let mut out = Vec::new();
    for (n, &size) in sizes.iter().enumerate() {
        let size = usize::try_from(size).map_err(|_| format!("split size {size} < 0"))?;
        if n % step == 0 {
            out.push(at..at + size);
        }
        at += size;
    }
    Ok(out)
}

/// The rows [`SpecLogprobsPlan::rows_of`] cuts from the plan's values,
/// after checking that it refuses any other number of values.
fn cut_rows(plan: &SpecLogprobsPlan) -> Result<Vec<std::ops::Range<usize>>, String> {
    let n = plan.num_values();
    if plan.rows_of(n + 1).is_ok() || n.checked_sub(1).is_some_and(|m| plan.rows_of(m).is_ok()) {
        return Err("rows_of takes a number of values other than num_values".into());
    }
    let rows: Vec<_> = plan.rows_of(n).map_err(|e| e.to_string())?.collect();
    if rows.iter().any(|r| r.end > n) || rows.len() != plan.num_rows() {
        return Err(format!("rows {rows:?} of {n} values"));
    }
    Ok(rows)
}

/// Checks a top-k plan against [`top_k_model`]: every row's span, and the
/// pieces its split sizes cut, are the positions the release's row reads,
/// and the sizes cover the `[rows, max_k]` tensor exactly.
pub fn check_top_k(plan: &SpecLogprobsPlan, top_logprobs_nums: &[i64]) -> Result<(), String> {
    let model = top_k_model(top_logprobs_nums);
    let width = plan.width().ok_or("a top-k plan without a width")?;
    if plan.num_values() != model.len() * width || plan.buffer_len() != 0 {
        return Err(format!(
            "{} values for {} rows",
            plan.num_values(),
            model.len()
        ));
    }
    let sizes = plan.split_sizes();
    if sizes.iter().sum::<i64>() != plan.num_values() as i64 {
        return Err("the split sizes do not cover the top-k tensor".into());
    }
    let cut = pieces(&sizes, 2)?;
    let spans = cut_rows(plan)?;
    for (i, want) in model.iter().enumerate() {
        let want = want.first().map_or(0..0, |&f| f..f + want.len());
        if spans.get(i) != Some(&want) && !(want.is_empty() && spans[i].is_empty()) {
            return Err(format!("row {i}: span {:?}, want {want:?}", spans.get(i)));
        }
        if cut.get(i).map(|r| r.len()) != Some(want.len()) || (!want.is_empty() && cut[i] != want) {
            return Err(format!("row {i}: piece {:?}, want {want:?}", cut.get(i)));
        }
    }
    let uniform = top_logprobs_nums.iter().all(|&k| k as usize == width);
    if plan.uniform() != uniform || cut.len() != model.len() {
        return Err("uniform, or the number of pieces, is wrong".into());
    }
    Ok(())
}

/// Checks a token-ids plan against [`token_ids_decode_model`]: the split
/// sizes cut the gathered values into the rows in order, the indices
/// [`SpecLogprobsPlan::fill`] writes are the release's, row by row, and the
/// rows without ids are named.
pub fn check_decode_token_ids(
    plan: &SpecLogprobsPlan,
    token_ids: &[Option<&[i64]>],
    vocab: i64,
) -> Result<(), String> {
    let model = token_ids_decode_model(token_ids, vocab);
    let mut buf = vec![-1i64; plan.buffer_len() + 1];
    plan.fill(&mut buf).map_err(|e| e.to_string())?;
    if buf[plan.buffer_len()] != -1 || plan.num_values() != plan.buffer_len() {
        return Err("fill wrote past its buffer".into());
    }
    let cut = pieces(&plan.split_sizes(), 1)?;
    if cut.len() != model.len() || cut.last().map_or(0, |r| r.end) != plan.num_values() {
        return Err("the split sizes do not cut the values into the rows".into());
    }
    if cut_rows(plan)? != cut {
        return Err("rows_of cuts other rows than the split sizes".into());
    }
    let mut none = Vec::new();
    for (i, (want, range)) in model.iter().zip(&cut).enumerate() {
        let got = &buf[range.clone()];
        match want {
            None => {
                none.push(i);
                if !got.is_empty() {
                    return Err(format!("row {i} has no ids but gets values"));
                }
            }
            Some(want) if got != &want[..] => {
                return Err(format!("row {i}: indices {got:?}, want {want:?}"));
            }
            Some(_) => {}
        }
        if plan.spans()[i] != (range.start, range.len()) {
            return Err(format!(
                "row {i}: span {:?}, want {range:?}",
                plan.spans()[i]
            ));
        }
    }
    if plan.none_rows() != &none[..] {
        return Err(format!(
            "rows without ids {:?}, want {none:?}",
            plan.none_rows()
        ));
    }
    Ok(())
}
