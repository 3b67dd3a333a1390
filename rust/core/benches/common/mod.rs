//! The batches both benches time: deterministic, serving-like mixes.

/// A small deterministic generator (xorshift64*), so every run benches the same batches.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: i64) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as i64 % n
    }
}

#[derive(Clone, Copy)]
pub enum Mix {
    /// Chat turns: 16..256 new tokens, logprobs over all of them.
    Chat,
    /// Long prompts: 1k..8k tokens, logprobs from a random start.
    LongPrompt,
    /// Serving mix: chat turns, long prompts, a quarter chunked-prefill
    /// chunks with start == extend (no input logprob, one row kept), and one
    /// request in eight a single token.
    Mixed,
}

pub const MIXES: [Mix; 3] = [Mix::Chat, Mix::LongPrompt, Mix::Mixed];
pub const BATCHES: [usize; 6] = [1, 8, 64, 256, 1024, 4096];

impl Mix {
    pub fn name(self) -> &'static str {
        match self {
            Mix::Chat => "chat",
            Mix::LongPrompt => "long_prompt",
            Mix::Mixed => "mixed",
        }
    }

    /// One request: (extend, logprob start).
    fn request(self, rng: &mut Rng) -> (i64, i64) {
        match self {
            Mix::Chat => (16 + rng.below(241), 0),
            Mix::LongPrompt => {
                let e = 1024 + rng.below(7 * 1024 + 1);
                (e, rng.below(e))
            }
            Mix::Mixed => match rng.below(8) {
                0 | 1 => {
                    let e = 512 + rng.below(1537);
                    (e, e)
                }
                2 | 3 => {
                    let e = 1024 + rng.below(3 * 1024 + 1);
                    (e, rng.below(e))
                }
                4 => (1, 0),
                _ => (16 + rng.below(241), 0),
            },
        }
    }
}

const MAX_BATCH_TOKENS: i64 = 256 * 1024;

/// `batch` requests of `mix` as (extend_seq_lens, extend_logprob_start_lens),
/// each shrunk in proportion so the batch stays within 256k tokens, as a
/// token budget would.
pub fn batch(mix: Mix, batch: usize) -> (Vec<i64>, Vec<i64>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ batch as u64);
    let raw: Vec<(i64, i64)> = (0..batch).map(|_| mix.request(&mut rng)).collect();
    let total: i64 = raw.iter().map(|r| r.0).sum();
    let scale = (MAX_BATCH_TOKENS as f64 / total as f64).min(1.0);
    raw.into_iter()
        .map(|(e, s)| {
            let e2 = ((e as f64 * scale) as i64).max(1);
            // Keep the request's kind: start == extend stays so, else scale.
            let s2 = if s == e {
                e2
            } else {
                ((s as f64 * scale) as i64).min(e2 - 1)
            };
            (e2, s2)
        })
        .unzip()
}
