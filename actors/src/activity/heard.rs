//! Where a playout report cuts what the agent said. The host's heard text only finds the
//! cut in the speech's own text; it never becomes the message (a host that reported
//! "Your refund is approved" for "Please hold" would otherwise put words in the agent's
//! mouth, and the next request would carry them).
//!
//! The rules, each a unit test below:
//! - No heard text (`None`): the output cannot tell; the text stays, marked interrupted.
//! - Heard text with no words: nothing was heard; the message goes.
//! - Heard text that is a prefix of what was said (what a character-aligned output
//!   sends): the cut is right after it.
//! - Otherwise the two are matched word by word, ignoring case and punctuation, each
//!   heard word against the next few said words ([`WINDOW`]): a heard word that matches
//!   none is one the TTS made up while reading something else aloud (`$5` is read
//!   "five dollars", `3:30` "three thirty"), and is skipped. The cut is after the last
//!   said word matched; heard words left over after it stand for the said words right
//!   after it that a TTS reads in other words (those with a digit or a symbol), one each.
//! - Heard text of which no word matches: the cut is unknown, as with no heard text.

/// How many said words ahead a heard word may match: a TTS reads a said word as other
/// words or drops it, so a few may be skipped; a match farther ahead would more likely
/// be a common word said later.
const WINDOW: usize = 4;

/// Where a report cuts a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Unknown: the text stays, marked interrupted.
    Unknown,
    /// Nothing was heard: the message goes.
    Nothing,
    /// The first this many bytes of the text were heard.
    Upto(usize),
}

/// Where `heard` cuts `said` (see the module docs).
pub(crate) fn cut(said: &str, heard: Option<&str>) -> Cut {
    let Some(heard) = heard else {
        return Cut::Unknown;
    };
    let heard = heard.trim_end();
    if heard.trim_start().is_empty() {
        return Cut::Nothing;
    }
    if said.starts_with(heard) {
        return Cut::Upto(heard.len());
    }
    let said_words: Vec<Word<'_>> = words(said).collect();
    let mut next = 0;
    let mut last = None;
    let mut left_over = 0;
    for heard_word in heard.split_whitespace().map(key).filter(|k| !k.is_empty()) {
        let ahead = said_words.get(next..).unwrap_or_default();
        match ahead.iter().take(WINDOW).position(|w| w.key == heard_word) {
            Some(at) => {
                last = Some(next + at);
                next += at + 1;
                left_over = 0;
            }
            None => left_over += 1,
        }
    }
    let Some(mut last) = last else {
        return Cut::Unknown;
    };
    while left_over > 0 && said_words.get(last + 1).is_some_and(|w| w.read_otherwise) {
        last += 1;
        left_over -= 1;
    }
    Cut::Upto(said_words[last].end)
}

/// A said word: where it ends in the text, its key, and whether a TTS reads it in other
/// words.
struct Word<'a> {
    end: usize,
    key: std::borrow::Cow<'a, str>,
    read_otherwise: bool,
}

fn words(text: &str) -> impl Iterator<Item = Word<'_>> {
    let start = text.as_ptr() as usize;
    text.split_whitespace().map(move |word| Word {
        // `word` is a slice of `text`: its offset is the distance between the two.
        end: word.as_ptr() as usize - start + word.len(),
        key: key(word),
        read_otherwise: word
            .chars()
            .any(|c| c.is_numeric() || "$€£¥%&@#+=°§".contains(c)),
    })
}

/// A word as compared: lower case, letters and digits only.
fn key(word: &str) -> std::borrow::Cow<'_, str> {
    if word
        .chars()
        .all(|c| c.is_alphanumeric() && !c.is_uppercase())
    {
        return std::borrow::Cow::Borrowed(word);
    }
    std::borrow::Cow::Owned(
        word.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept<'a>(said: &'a str, heard: &str) -> Option<&'a str> {
        match cut(said, Some(heard)) {
            Cut::Upto(end) => Some(&said[..end]),
            Cut::Nothing => Some(""),
            Cut::Unknown => None,
        }
    }

    #[test]
    fn no_heard_text_leaves_the_cut_unknown_and_an_empty_one_means_nothing_was_heard() {
        assert_eq!(cut("Hello there.", None), Cut::Unknown);
        assert_eq!(cut("Hello there.", Some("")), Cut::Nothing);
        assert_eq!(cut("Hello there.", Some("  \n")), Cut::Nothing);
    }

    #[test]
    fn a_prefix_of_what_was_said_is_the_cut_as_it_is() {
        assert_eq!(
            kept("Hello there, friend.", "Hello there"),
            Some("Hello there")
        );
        assert_eq!(kept("Hello there, friend.", "Hello th"), Some("Hello th"));
        assert_eq!(
            kept("Hello there, friend.", "Hello there "),
            Some("Hello there")
        );
    }

    #[test]
    fn words_match_whatever_their_case_and_punctuation() {
        assert_eq!(
            kept("Please hold, while I check.", "please hold while"),
            Some("Please hold, while")
        );
        assert_eq!(
            kept("It's done. Anything else?", "its done anything"),
            Some("It's done. Anything")
        );
    }

    #[test]
    fn a_tts_reading_of_numbers_and_symbols_finds_the_cut_in_the_original_words() {
        let said = "Your refund of $5 is approved today.";
        assert_eq!(
            kept(said, "Your refund of five dollars is"),
            Some("Your refund of $5 is")
        );
        // Cut inside the reading of "$5": the words read out stand for it.
        assert_eq!(
            kept(said, "Your refund of five dollars"),
            Some("Your refund of $5")
        );
        assert_eq!(
            kept(
                "Dr. Smith sees you at 3:30 p.m. on Monday.",
                "doctor smith sees you at three thirty"
            ),
            Some("Dr. Smith sees you at 3:30")
        );
    }

    #[test]
    fn words_left_over_never_stand_for_ordinary_words() {
        assert_eq!(
            kept("Please hold while I check.", "Please hold on a"),
            Some("Please hold")
        );
    }

    #[test]
    fn heard_text_that_matches_nothing_said_leaves_the_cut_unknown() {
        assert_eq!(
            cut(
                "Please hold while I check.",
                Some("Your refund of 5,000 dollars is approved.")
            ),
            Cut::Unknown
        );
    }

    #[test]
    fn a_match_far_ahead_is_not_taken() {
        // "approved" is said, but eleven words in: not what the first heard word names.
        assert_eq!(
            cut(
                "Please hold while I check. Your refund of 5,000 dollars is approved.",
                Some("approved")
            ),
            Cut::Unknown
        );
    }

    #[test]
    fn heard_words_beyond_what_was_said_keep_it_whole_and_add_nothing() {
        assert_eq!(
            kept("Sure, one moment.", "sure one moment please and thank you"),
            Some("Sure, one moment.")
        );
    }

    #[test]
    fn repeated_words_are_matched_in_order() {
        assert_eq!(kept("no no no, yes", "No no"), Some("no no"));
        assert_eq!(kept("No, no, no. Yes.", "no no"), Some("No, no,"));
    }
}
