//! The attribute macros of [switchboard](https://docs.rs/switchboard), re-exported by it:
//! write `#[switchboard::test]`, not this crate's path.
//!
//! No dependencies: the macro only puts actix's own test attribute, reached through
//! `switchboard`, in front of the function, so a test crate needs neither `actix` nor
//! `actix-rt` among its dependencies.

use proc_macro::TokenStream;

/// What `#[switchboard::test]` expands to: actix's test attribute, told where the actix
/// `System` is, both through `switchboard`.
const ACTIX_TEST: &str =
    r#"#[::switchboard::__private::test(system = "::switchboard::__private::System")]"#;

/// Runs an `async fn` test inside an actix system on the test's thread: the runtime
/// `Engine::current()` starts sessions on. Paused tokio time (`tokio::time::pause()`)
/// reaches the session's actors there, and nothing crosses threads.
///
/// It takes no arguments. The test function needs no `actix` import:
///
/// ```ignore
/// use switchboard::prelude::*;
///
/// #[switchboard::test]
/// async fn greets() {
///     let engine = Engine::current().unwrap();
///     // … start a session on `engine`, run a turn, assert …
/// }
/// ```
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    let head = if args.is_empty() {
        ACTIX_TEST
    } else {
        r##"::core::compile_error!("#[switchboard::test] takes no arguments");"##
    };
    // Both strings are fixed, valid Rust: parsing them cannot fail. Should it anyway, the
    // function is left as written and the compiler points at it.
    let mut out: TokenStream = head.parse().unwrap_or_default();
    out.extend(item);
    out
}
