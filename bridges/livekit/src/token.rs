//! [`BridgeToken`]: the shared secret a LiveKit worker presents in its hello.

use std::fmt;

/// The shared secret a worker must present. Never printed: `Debug` shows `<redacted>`, and
/// the bridge logs a refusal without it.
#[derive(Clone)]
pub struct BridgeToken(String);

impl BridgeToken {
    /// A token; refuses an empty one (an empty secret would let anyone in).
    pub fn new(token: impl Into<String>) -> Result<Self, EmptyToken> {
        let token = token.into();
        if token.is_empty() {
            return Err(EmptyToken);
        }
        Ok(Self(token))
    }

    /// Whether `presented` is this token. Compares every byte whatever the first
    /// difference, so the time taken does not tell how much of a guess was right.
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        let mut differ = u8::from(a.len() != b.len());
        for (i, byte) in a.iter().enumerate() {
            differ |= byte ^ b.get(i).copied().unwrap_or(!byte);
        }
        differ == 0
    }
}

impl fmt::Debug for BridgeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BridgeToken(<redacted>)")
    }
}

/// An empty token was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bridge token is empty; give a long random secret")]
pub struct EmptyToken;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_only_itself_and_is_never_printed() {
        let token = BridgeToken::new("correct horse").unwrap();
        assert!(token.matches("correct horse"));
        assert!(!token.matches("correct hors"));
        assert!(!token.matches("correct horse!"));
        assert!(!token.matches(""));
        assert!(!format!("{token:?}").contains("horse"));
        assert_eq!(BridgeToken::new("").unwrap_err(), EmptyToken);
    }
}
