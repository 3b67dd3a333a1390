//! The input decoder both fuzz targets share: the fuzzer's bytes read as
//! list lengths, length values biased towards the edges that matter, and row
//! counts. Past the end of the input every read is 0, so any input decodes.

use flatgather_core::{MAX_PLAN_BYTES, MAX_TOKENS};

/// The most `int64` values a plan's buffers may hold.
pub const MAX_PLAN_VALUES: i64 = (MAX_PLAN_BYTES / 8) as i64;

/// How a target wants its length values skewed.
pub struct Skew {
    /// Two of the twenty value kinds give exactly 1 (a one-token request)
    /// instead of a short length.
    pub ones: bool,
    /// The size-bound kind gives about `MAX_PLAN_VALUES / (share + k)`,
    /// `k` in `0..4`: the share of the bound one request's values fill.
    pub share: i64,
}

/// Reads the input front to back.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    /// A list length: mostly 0..=64, sometimes up to a few thousand.
    pub fn len(&mut self) -> usize {
        let b = self.u8();
        if b < 195 {
            usize::from(b % 65)
        } else {
            64 + usize::from(self.u16() % 4032)
        }
    }

    /// A length value, biased towards valid lengths but reaching every edge:
    /// zero, negatives, `i64::MIN`/`MAX`, values around `MAX_TOKENS` and
    /// around the `MAX_PLAN_BYTES` bound, powers of two, anything.
    pub fn value(&mut self, skew: &Skew) -> i64 {
        let sel = self.u8();
        let b = i64::from(self.u8());
        match sel % 20 {
            0..=4 => 1 + b % 16,
            5 | 6 if skew.ones => 1,
            5 | 6 => 1 + b % 16,
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
            18 => MAX_PLAN_VALUES / (skew.share + b % 4) + i64::from(self.u8() as i8 % 8),
            _ => self.u64() as i64,
        }
    }

    /// A row count for a batch of `tokens` tokens: mostly near it.
    pub fn rows(&mut self, tokens: i64) -> i64 {
        let sel = self.u8();
        match sel % 4 {
            0 | 1 => tokens.wrapping_add(i64::from(self.u8() as i8)),
            2 => i64::from(self.u16()),
            _ => self.u64() as i64,
        }
    }
}
