//! Words as the turn rules count and match them: lower case, split on anything that is
//! not a letter, a digit or an apostrophe (so "uh-huh" is "uh huh" and "Yeah, right." is
//! "yeah right").

/// The words of `text`, lower-cased, in order.
pub(crate) fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(str::to_lowercase)
}

/// How many words `text` has.
pub(crate) fn count(text: &str) -> usize {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count()
}

/// A set of phrases, each one or more words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Phrases {
    phrases: Vec<Vec<String>>,
}

impl Phrases {
    pub(crate) fn new<S: AsRef<str>>(phrases: impl IntoIterator<Item = S>) -> Self {
        let mut out: Vec<Vec<String>> = phrases
            .into_iter()
            .map(|p| words(p.as_ref()).collect::<Vec<_>>())
            .filter(|p| !p.is_empty())
            .collect();
        out.sort();
        out.dedup();
        Self { phrases: out }
    }

    pub(crate) fn len(&self) -> usize {
        self.phrases.len()
    }

    /// Whether `text` has words and is made only of these phrases, one after another.
    pub(crate) fn covers(&self, text: &str) -> bool {
        let said: Vec<String> = words(text).collect();
        if said.is_empty() {
            return false;
        }
        // covered[i]: the first i words are a sequence of phrases.
        let mut covered = vec![false; said.len() + 1];
        covered[0] = true;
        for at in 0..said.len() {
            if !covered[at] {
                continue;
            }
            for phrase in &self.phrases {
                let end = at + phrase.len();
                if end <= said.len() && said[at..end] == phrase[..] {
                    covered[end] = true;
                }
            }
        }
        covered[said.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_ignore_case_and_punctuation_and_split_hyphens() {
        assert_eq!(
            words("Uh-huh, RIGHT... I'm here!").collect::<Vec<_>>(),
            ["uh", "huh", "right", "i'm", "here"]
        );
        assert_eq!(count("  stop, wait  "), 2);
        assert_eq!(count("... !"), 0);
    }

    #[test]
    fn a_text_of_backchannel_phrases_only_is_covered() {
        let p = Phrases::new(["uh-huh", "yeah", "right", "i see", "mm-hmm"]);
        assert!(p.covers("Uh huh."));
        assert!(p.covers("yeah, yeah right"));
        assert!(p.covers("I see"));
        assert!(p.covers("mm-hmm uh-huh"));
        assert!(!p.covers("stop, wait"));
        assert!(!p.covers("yeah but wait"));
        assert!(!p.covers("I"), "half a phrase is not the phrase");
        assert!(!p.covers(""), "no words is no backchannel");
    }
}
