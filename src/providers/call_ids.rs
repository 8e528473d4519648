//! Canonical call ids ↔ the ids a provider accepts.
//!
//! The chat context keeps canonical ids: the provider's own id made unique in the session
//! (`call_1~2`) and the derived ids of async tools (`call_1/update_3`, `call_1/finished`).
//! OpenAI refuses ids longer than 40 characters, and Anthropic-style servers allow only
//! `[a-zA-Z0-9_-]`. So an adapter writes every id as a *wire id* matching
//! `^[a-zA-Z0-9_-]{1,40}$`:
//!
//! - **Escaped form**, when it fits in 40 characters: `[a-zA-Z0-9_]` stand for themselves,
//!   `-` is the escape character: `-d` is `-`, `-s` is `/`, `-t` is `~`, and `-xHH` is one
//!   byte of any other character's UTF-8. `call_1~2/update_3` → `call_1-t2-supdate_3`.
//!   Readable, and reversible without a table ([`decode_call_id`]).
//! - **Hashed form**, when the escaped form is longer than 40 characters (a real OpenAI id
//!   `call_` + 24 characters with `~2/update_12` is 41) or empty: the first characters of
//!   the escaped form, then `-h` and 12 base-62 characters of a 128-bit FNV-1a hash of the
//!   canonical id. It is reversed by the [`CallIdMap`] of the request that wrote it.
//!
//! No escaped form contains `-h` (`h` is no escape code), so the two forms never meet. Two
//! hashed forms could only meet by a hash collision; [`CallIdMap`] checks every id it hands
//! out and gives a later colliding id a re-salted hash, so the ids of one request are
//! always distinct. The mapping is deterministic: the same id gets the same wire id in
//! every request (a re-salt depends only on the ids before it in the chat, which do not
//! change from one request to the next), so the request prefix stays byte-stable for the
//! provider's prompt cache.

use std::collections::HashMap;

/// The longest id OpenAI accepts, and so the longest wire id written here.
pub const WIRE_ID_MAX_LEN: usize = 40;

/// How many characters of the escaped form a hashed id keeps in front, for people reading
/// logs: `WIRE_ID_MAX_LEN` minus the `-h` marker and the hash.
const HASHED_HEAD_LEN: usize = WIRE_ID_MAX_LEN - 2 - HASH_LEN;

/// Base-62 digits of the hash: 62^12 ≈ 2^71, so an accidental collision within one
/// conversation is out of reach (and still checked by [`CallIdMap`]).
const HASH_LEN: usize = 12;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The wire id of `canonical` on its own: its escaped form when that fits, else its hashed
/// form. A request with many ids should use a [`CallIdMap`], which also guarantees that
/// hashed forms do not collide.
///
/// ```
/// use switchboard::providers::encode_call_id;
/// assert_eq!(encode_call_id("call_1~2/update_3"), "call_1-t2-supdate_3");
/// let long = encode_call_id("call_AbCdEfGhIjKlMnOpQrStUvWx~2/update_12");
/// assert!(long.len() <= 40 && long.contains("-h"));
/// ```
pub fn encode_call_id(canonical: &str) -> String {
    escaped(canonical)
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| hashed(canonical, 0))
}

/// The canonical id of an escaped wire id, or `None` when `wire` is not one (a hashed
/// form, or a string [`encode_call_id`] never writes). `decode_call_id(encode_call_id(id))`
/// is `Some(id)` whenever the escaped form was used.
///
/// ```
/// use switchboard::providers::decode_call_id;
/// assert_eq!(decode_call_id("call_1-t2-supdate_3").as_deref(), Some("call_1~2/update_3"));
/// assert_eq!(decode_call_id("call_1/x"), None);
/// ```
pub fn decode_call_id(wire: &str) -> Option<String> {
    let bytes = wire.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'-' {
            if !is_plain(b) {
                return None;
            }
            out.push(b);
            i += 1;
            continue;
        }
        match bytes.get(i + 1)? {
            b'd' => out.push(b'-'),
            b's' => out.push(b'/'),
            b't' => out.push(b'~'),
            b'x' => {
                let hex = wire.get(i + 2..i + 4)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            _ => return None,
        }
        i += 2;
    }
    let decoded = String::from_utf8(out).ok()?;
    // Only the one form `encode_call_id` writes decodes (not `-x2f` for `/`, nor uppercase
    // hex, nor an over-long string), so decoding is the exact inverse of encoding.
    (encode_call_id(&decoded) == wire).then_some(decoded)
}

/// The wire ids of one request, collision-checked, with the table to read them back.
///
/// Build one per request, in chat order: [`CallIdMap::wire`] for every call id the request
/// carries. Ids the model writes in its answer are new ids, returned to the engine as the
/// model wrote them; this table reads back the ids the adapter wrote.
///
/// ```
/// use switchboard::providers::CallIdMap;
/// let mut ids = CallIdMap::new();
/// let wire = ids.wire("call_1/update_1").to_owned();
/// assert_eq!(ids.canonical(&wire), Some("call_1/update_1"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallIdMap {
    to_wire: HashMap<String, String>,
    to_canonical: HashMap<String, String>,
}

impl CallIdMap {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The wire id of `canonical`: the same on every call, and distinct from every other
    /// id of this table.
    pub fn wire(&mut self, canonical: &str) -> &str {
        if !self.to_wire.contains_key(canonical) {
            let wire = self.fresh_wire(canonical);
            self.to_canonical.insert(wire.clone(), canonical.to_owned());
            self.to_wire.insert(canonical.to_owned(), wire);
        }
        self.to_wire.get(canonical).map_or("", String::as_str)
    }

    /// The canonical id behind a wire id this table handed out.
    pub fn canonical(&self, wire: &str) -> Option<&str> {
        self.to_canonical.get(wire).map(String::as_str)
    }

    /// How many ids the table holds.
    pub fn len(&self) -> usize {
        self.to_wire.len()
    }

    /// Whether the table holds no id.
    pub fn is_empty(&self) -> bool {
        self.to_wire.is_empty()
    }

    fn fresh_wire(&self, canonical: &str) -> String {
        if let Some(escaped) = escaped(canonical).filter(|e| !e.is_empty()) {
            // Escaped forms are injective and never look hashed: no check needed.
            return escaped;
        }
        (0u64..)
            .map(|salt| hashed(canonical, salt))
            .find(|wire| !self.to_canonical.contains_key(wire))
            .unwrap_or_default()
    }
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Appends the escaped form of `c` to `out`.
fn escape_char(c: char, out: &mut String) {
    match c {
        c if c.is_ascii() && is_plain(c as u8) => out.push(c),
        '-' => out.push_str("-d"),
        '/' => out.push_str("-s"),
        '~' => out.push_str("-t"),
        c => {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str("-x");
                out.push(hex_digit(b >> 4));
                out.push(hex_digit(b & 0xf));
            }
        }
    }
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(nibble & 0xf)])
}

/// The escaped form, or `None` when it is longer than [`WIRE_ID_MAX_LEN`].
fn escaped(canonical: &str) -> Option<String> {
    let mut out = String::with_capacity(canonical.len() + 4);
    for c in canonical.chars() {
        escape_char(c, &mut out);
        if out.len() > WIRE_ID_MAX_LEN {
            return None;
        }
    }
    Some(out)
}

/// `{head}-h{hash}`: the head is the escaped form's start, cut between escapes.
fn hashed(canonical: &str, salt: u64) -> String {
    let mut head = String::with_capacity(WIRE_ID_MAX_LEN);
    let mut piece = String::with_capacity(12);
    for c in canonical.chars() {
        piece.clear();
        escape_char(c, &mut piece);
        if head.len() + piece.len() > HASHED_HEAD_LEN {
            break;
        }
        head.push_str(&piece);
    }
    let mut hash = fnv1a_128(canonical.as_bytes());
    if salt > 0 {
        // 0xff never occurs in UTF-8, so `id + 0xff + salt` cannot equal another id.
        hash = fnv1a_128_continue(hash, &[0xff]);
        hash = fnv1a_128_continue(hash, salt.to_string().as_bytes());
    }
    head.push_str("-h");
    for _ in 0..HASH_LEN {
        head.push(char::from(BASE62[(hash % 62) as usize]));
        hash /= 62;
    }
    head
}

const FNV_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a, 128 bits: stable across Rust versions and processes (unlike `DefaultHasher`),
/// which a mapping that must give the same id in every request needs.
fn fnv1a_128(bytes: &[u8]) -> u128 {
    fnv1a_128_continue(FNV_OFFSET, bytes)
}

fn fnv1a_128_continue(mut hash: u128, bytes: &[u8]) -> u128 {
    for &b in bytes {
        hash ^= u128::from(b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn valid(wire: &str) -> bool {
        (1..=WIRE_ID_MAX_LEN).contains(&wire.len())
            && wire
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    #[test]
    fn provider_ids_and_derived_ids_are_escaped_readably() {
        assert_eq!(encode_call_id("call_1"), "call_1");
        assert_eq!(encode_call_id("call_1/update_1"), "call_1-supdate_1");
        assert_eq!(encode_call_id("call_1/finished"), "call_1-sfinished");
        assert_eq!(encode_call_id("call_1~2"), "call_1-t2");
        assert_eq!(
            encode_call_id("chatcmpl-tool-9f"),
            "chatcmpl-dtool-d9f",
            "vLLM's ids hold the escape character"
        );
        assert_eq!(encode_call_id("a.b:c"), "a-x2eb-x3ac");
        assert_eq!(encode_call_id("é"), "-xc3-xa9");
    }

    #[test]
    fn escaped_ids_decode_back() {
        for id in [
            "call_1",
            "call_1~2/update_3",
            "x-y",
            "a.b",
            "é/ü",
            "-d",
            "-h1",
        ] {
            let wire = encode_call_id(id);
            assert!(valid(&wire), "{wire}");
            assert_eq!(decode_call_id(&wire).as_deref(), Some(id), "{wire}");
        }
    }

    #[test]
    fn only_the_written_form_decodes() {
        assert_eq!(decode_call_id("a-x2fb"), None, "`/` is written -s");
        assert_eq!(decode_call_id("a-xC3-xA9"), None, "hex is lowercase");
        assert_eq!(decode_call_id("a-"), None);
        assert_eq!(decode_call_id("a-q"), None);
        assert_eq!(decode_call_id("a-x"), None);
        assert_eq!(decode_call_id("a-xff"), None, "not UTF-8");
        assert_eq!(decode_call_id("a/b"), None);
        assert_eq!(decode_call_id(""), None);
        assert_eq!(decode_call_id(&encode_call_id(&"x".repeat(41))), None);
    }

    #[test]
    fn ids_that_already_look_escaped_or_hashed_stay_distinct() {
        let ids = [
            "a/b",
            "a-sb",
            "a-dsb",
            "a~b",
            "a-tb",
            "a--b",
            "a-b",
            "a-hb",
            "a.b",
            "a-x2eb",
            "call_1-supdate_1",
            "call_1/update_1",
        ];
        let wires: HashSet<String> = ids.iter().map(|id| encode_call_id(id)).collect();
        assert_eq!(wires.len(), ids.len(), "{wires:?}");
        for id in ids {
            assert_eq!(decode_call_id(&encode_call_id(id)).as_deref(), Some(id));
        }
    }

    #[test]
    fn an_id_that_looks_hashed_never_equals_a_hashed_form() {
        let long = "call_AbCdEfGhIjKlMnOpQrStUvWx~2/update_12";
        let wire = encode_call_id(long);
        // The hashed wire id taken as a canonical id has its `-` escaped, so it is not
        // written as itself; a short look-alike is escaped and reads back.
        assert_ne!(encode_call_id(&wire), wire);
        let look_alike = "call_1-h0123456789AB";
        assert_eq!(encode_call_id(look_alike), "call_1-dh0123456789AB");
        assert_eq!(
            decode_call_id("call_1-dh0123456789AB").as_deref(),
            Some(look_alike)
        );
        assert_eq!(decode_call_id(&wire), None, "a hashed form needs its table");
    }

    #[test]
    fn long_ids_are_hashed_within_40_characters_and_keep_a_readable_head() {
        let long = "call_AbCdEfGhIjKlMnOpQrStUvWx~2/update_12";
        assert_eq!(long.len(), 41, "a real OpenAI id with a suffix");
        let wire = encode_call_id(long);
        assert!(valid(&wire), "{wire}");
        assert!(wire.starts_with("call_AbCdEfGhIjKlMnOpQrS"), "{wire}");
        assert_eq!(wire, encode_call_id(long), "deterministic");
        let very_long = "x/".repeat(5_000);
        assert!(valid(&encode_call_id(&very_long)));
        assert!(
            valid(&encode_call_id("")),
            "even an empty id gets a wire id"
        );
        assert!(valid(&encode_call_id(&"é".repeat(30))));
    }

    #[test]
    fn long_ids_differing_only_in_escaped_characters_or_the_tail_differ() {
        let base = "call_AbCdEfGhIjKlMnOpQrStUvWx";
        let ids = [
            format!("{base}~2/update_12"),
            format!("{base}~2/update_13"),
            format!("{base}/2~update_12"),
            format!("{base}-2/update_12"),
            format!("{base}~2/finished"),
            format!("{base}~12/finished"),
        ];
        let mut map = CallIdMap::new();
        let wires: HashSet<String> = ids.iter().map(|id| map.wire(id).to_owned()).collect();
        assert_eq!(wires.len(), ids.len());
        for id in &ids {
            let wire = map.wire(id).to_owned();
            assert!(valid(&wire));
            assert_eq!(map.canonical(&wire), Some(id.as_str()));
        }
    }

    #[test]
    fn many_ids_of_one_conversation_never_collide() {
        let mut map = CallIdMap::new();
        let mut seen = HashSet::new();
        for call in 0..300 {
            let id = format!("call_{call:0>24}");
            for suffix in ["", "~2", "/finished", "~2/finished"] {
                let base = format!("{id}{suffix}");
                let wire = map.wire(&base).to_owned();
                assert!(valid(&wire));
                assert!(seen.insert(wire), "collision at {base}");
            }
            for n in 1..5 {
                let derived = format!("{id}~3/update_{n}");
                let wire = map.wire(&derived).to_owned();
                assert!(seen.insert(wire), "collision at {derived}");
            }
        }
        assert_eq!(map.len(), seen.len());
    }

    #[test]
    fn a_hash_collision_is_resolved_by_a_salt() {
        // Force a collision: pretend the first hashed form is taken by another id.
        let long = "y".repeat(50);
        let mut map = CallIdMap::new();
        let taken = hashed(&long, 0);
        map.to_canonical
            .insert(taken.clone(), "someone else".into());
        let wire = map.wire(&long).to_owned();
        assert_ne!(wire, taken);
        assert!(valid(&wire));
        assert_eq!(map.canonical(&wire), Some(long.as_str()));
        assert_eq!(map.wire(&long), wire, "stable once handed out");
    }
}
