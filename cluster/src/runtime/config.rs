//! `WorkerConfig`: a deployed worker's settings, from its environment and command line.
//!
//! Every setting has a flag and an environment variable ([`SETTINGS`]); a flag wins over
//! the variable, the variable over the default. Secrets are best given by variable (a
//! command line shows in `ps`). Parsing is a plain function of the arguments and a lookup
//! of variables, so every rule is a unit test.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::connect::NatsConnect;
use crate::namespace::{check_inbox_prefix, check_worker_name, Namespace};
use crate::worker::WorkerOptions;

/// One setting of a deployed worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Setting {
    /// The command-line flag (`--capacity`).
    pub flag: &'static str,
    /// The environment variable (`SB_CAPACITY`).
    pub env: &'static str,
    /// What its value looks like (`N`); empty for a switch, which takes no value on the
    /// command line and `true`/`false` in its variable.
    pub value: &'static str,
    /// What it sets, and its default.
    pub help: &'static str,
}

const fn setting(
    flag: &'static str,
    env: &'static str,
    value: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        flag,
        env,
        value,
        help,
    }
}

/// Every setting of a deployed worker, in the order `--help` lists them.
pub const SETTINGS: &[Setting] = &[
    setting("--nats-url", "SB_NATS_URL", "URL[,URL…]", "the NATS servers, comma-separated (default nats://127.0.0.1:4222)"),
    setting("--nats-user", "SB_NATS_USER", "USER", "authenticate as this user, with the password"),
    setting("--nats-password", "SB_NATS_PASSWORD", "PASSWORD", "the user's password (prefer the variable)"),
    setting("--nats-token", "SB_NATS_TOKEN", "TOKEN", "authenticate with a token (prefer the variable)"),
    setting("--nats-nkey", "SB_NATS_NKEY", "SEED", "authenticate with an nkey seed (prefer the variable)"),
    setting("--nats-creds", "SB_NATS_CREDS", "FILE", "authenticate with a credentials file (JWT and nkey)"),
    setting("--tls-required", "SB_TLS_REQUIRED", "", "refuse a connection without TLS (default off; a tls:// URL turns it on)"),
    setting("--tls-ca", "SB_TLS_CA", "FILE", "trust the server certificates this PEM file signs"),
    setting("--tls-cert", "SB_TLS_CERT", "FILE", "present this client certificate (PEM; with --tls-key)"),
    setting("--tls-key", "SB_TLS_KEY", "FILE", "the client certificate's key (PEM)"),
    setting("--name", "SB_WORKER_NAME", "NAME", "the worker's name, unique in the cluster (default the host's name)"),
    setting("--capacity", "SB_CAPACITY", "N", "the most sessions it holds at once (default 100)"),
    setting("--namespace", "SB_NAMESPACE", "PREFIX", "the cluster's namespace: its subjects, streams and bucket (default sb)"),
    setting("--inbox-prefix", "SB_INBOX_PREFIX", "PREFIX", "the prefix of the connection's reply subjects (default _INBOX; one per tenant sharing an account)"),
    setting("--lease-secs", "SB_LEASE_SECS", "SECONDS", "how long a worker's lease lives unless renewed (default 10)"),
    setting("--drain-secs", "SB_DRAIN_SECS", "SECONDS", "on SIGTERM or SIGINT, how long sessions may settle before they are interrupted and handed over (default 30)"),
    setting("--idle-secs", "SB_IDLE_SECS", "SECONDS", "close a session that got no input this long; 0 never (default 600)"),
    setting("--no-provision", "SB_NO_PROVISION", "", "do not create the streams and bucket (an operator did; default: create what is missing)"),
    setting("--replicas", "SB_REPLICAS", "N", "replicas of the streams and bucket it creates: 3 on a three-server cluster (default 1)"),
    setting("--listen", "SB_LISTEN", "ADDR", "where /healthz, /readyz and /metrics answer; off for none (default 0.0.0.0:8080)"),
    setting("--arbiters", "SB_ARBITERS", "N", "the engine's threads (default one per core)"),
];

/// Why a worker's settings could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An argument that is not one of [`SETTINGS`].
    #[error("unknown argument {argument:?} (--help lists the settings)")]
    Unknown {
        /// The argument.
        argument: String,
    },
    /// A flag that takes a value came last.
    #[error("{flag} needs a value")]
    MissingValue {
        /// The flag.
        flag: &'static str,
    },
    /// A value that does not fit its setting.
    #[error("{setting}: {value:?} is not {expected}")]
    Invalid {
        /// The flag, or the variable when the value came from there.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// No name given and the host's name is not usable as one.
    #[error("no worker name: set --name or SB_WORKER_NAME (1-128 of A-Z, a-z, 0-9, '_', '-')")]
    NoName,
    /// Two settings that do not go together, or one that needs another.
    #[error("{0}")]
    Conflict(&'static str),
}

/// What the command line asked for.
#[derive(Clone, Debug)]
pub enum Command {
    /// Run a worker with these settings.
    Run(Box<WorkerConfig>),
    /// Print the settings (`--help`, `-h`).
    Help,
}

/// A deployed worker's settings: how it connects, how it runs, where it answers health
/// checks and scrapes, and how long a drain may take. Read with
/// [`WorkerConfig::from_env`]; a program may change any field before it runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// How it connects to NATS (servers, credentials, TLS, inbox prefix).
    pub connect: NatsConnect,
    /// How it runs sessions (name, capacity, namespace, lease, idle timeout, provisioning
    /// and its replicas).
    pub worker: WorkerOptions,
    /// Its name (also in `worker`), for its status and metrics.
    pub name: String,
    /// How long a drain lets sessions settle before it interrupts them.
    pub drain_deadline: Duration,
    /// Where `/healthz`, `/readyz` and `/metrics` answer (`None`: nowhere).
    pub listen: Option<SocketAddr>,
    /// The engine's threads (`None`: one per core).
    pub arbiters: Option<usize>,
}

impl WorkerConfig {
    /// Reads the process's command line (after the program's name) and environment.
    pub fn from_env() -> Result<Command, ConfigError> {
        Self::parse(std::env::args().skip(1), |name| std::env::var(name).ok())
    }

    /// Reads `args` (without the program's name) and the variables `env` finds. Used by
    /// [`from_env`](Self::from_env); a program with flags of its own takes them out of the
    /// arguments first and gives this the rest.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Command, ConfigError> {
        let mut given: Vec<(&'static Setting, String, &'static str)> = Vec::new();
        for setting in SETTINGS {
            if let Some(value) = env(setting.env) {
                given.push((setting, value, setting.env));
            }
        }
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Ok(Command::Help);
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
                None => (arg.clone(), None),
            };
            let setting = SETTINGS
                .iter()
                .find(|s| s.flag == flag)
                .ok_or(ConfigError::Unknown { argument: arg })?;
            let value = match (setting.value.is_empty(), inline) {
                (true, Some(value)) => value,
                (true, None) => "true".to_owned(),
                (false, Some(value)) => value,
                (false, None) => args
                    .next()
                    .ok_or(ConfigError::MissingValue { flag: setting.flag })?,
            };
            given.retain(|(s, ..)| s.flag != setting.flag);
            given.push((setting, value, setting.flag));
        }
        let value = |flag: &str| {
            given
                .iter()
                .find(|(s, ..)| s.flag == flag)
                .map(|(_, value, from)| (value.as_str(), *from))
        };
        Ok(Command::Run(Box::new(Self::build(&value, &env)?)))
    }

    fn build<'a>(
        value: &impl Fn(&str) -> Option<(&'a str, &'static str)>,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let url = value("--nats-url").map_or("nats://127.0.0.1:4222", |(v, _)| v);
        let mut connect = NatsConnect::new(url);
        let text = |flag: &str| value(flag).map(|(v, _)| v.to_owned());
        connect = match (
            text("--nats-user"),
            text("--nats-password"),
            text("--nats-token"),
            text("--nats-nkey"),
            text("--nats-creds"),
        ) {
            (None, None, None, None, None) => connect,
            (Some(user), Some(password), None, None, None) => {
                connect.user_and_password(user, password)
            }
            (Some(_), None, ..) | (None, Some(_), ..) => {
                return Err(ConfigError::Conflict(
                    "a NATS user needs a password and a password a user (--nats-user, SB_NATS_PASSWORD)",
                ))
            }
            (None, None, Some(token), None, None) => connect.token(token),
            (None, None, None, Some(seed), None) => connect.nkey(seed),
            (None, None, None, None, Some(file)) => connect.credentials_file(file),
            _ => {
                return Err(ConfigError::Conflict(
                    "give one way to authenticate: a user and password, a token, an nkey or a credentials file",
                ))
            }
        };
        if switch(value, "--tls-required")? {
            connect = connect.require_tls(true);
        }
        if let Some(ca) = text("--tls-ca") {
            connect = connect.root_certificates(PathBuf::from(ca));
        }
        match (text("--tls-cert"), text("--tls-key")) {
            (Some(cert), Some(key)) => {
                connect = connect.client_certificate(PathBuf::from(cert), PathBuf::from(key))
            }
            (None, None) => {}
            _ => {
                return Err(ConfigError::Conflict(
                    "a client certificate needs its key and a key its certificate (--tls-cert, --tls-key)",
                ))
            }
        }
        if let Some((prefix, from)) = value("--inbox-prefix") {
            check_inbox_prefix(prefix).map_err(|_| {
                invalid(
                    from,
                    prefix,
                    "dot-separated tokens of A-Z, a-z, 0-9, '_', '-'",
                )
            })?;
            connect = connect.inbox_prefix(prefix);
        }

        let name = match value("--name") {
            Some((name, from)) => {
                check_worker_name(name)
                    .map_err(|_| invalid(from, name, "1-128 of A-Z, a-z, 0-9, '_', '-'"))?;
                name.to_owned()
            }
            None => host_name(env).ok_or(ConfigError::NoName)?,
        };
        connect = connect.name(name.clone());

        let mut worker = WorkerOptions::new(name.clone());
        if let Some(capacity) = number(value, "--capacity", "a whole number of at least 1")? {
            if capacity == 0 {
                let (given, from) = value("--capacity").unwrap_or_default();
                return Err(invalid(from, given, "a whole number of at least 1"));
            }
            worker = worker.capacity(capacity);
        }
        if let Some((prefix, from)) = value("--namespace") {
            let namespace = Namespace::new(prefix).map_err(|_| {
                invalid(
                    from,
                    prefix,
                    "dot-separated tokens of A-Z, a-z, 0-9, '_', '-'",
                )
            })?;
            worker = worker.namespace(namespace);
        }
        if let Some(lease) = seconds(value, "--lease-secs")? {
            if lease < Duration::from_secs(1) {
                let (given, from) = value("--lease-secs").unwrap_or_default();
                return Err(invalid(from, given, "at least 1 second"));
            }
            worker = worker.lease(lease);
        }
        if let Some(idle) = seconds(value, "--idle-secs")? {
            worker = worker.idle_timeout((!idle.is_zero()).then_some(idle));
        }
        if switch(value, "--no-provision")? {
            worker = worker.provision(false);
        }
        if let Some(replicas) = number(value, "--replicas", "1 to 5")? {
            if !(1..=5).contains(&replicas) {
                let (given, from) = value("--replicas").unwrap_or_default();
                return Err(invalid(from, given, "1 to 5"));
            }
            worker = worker.replicas(replicas);
        }
        let drain_deadline = seconds(value, "--drain-secs")?.unwrap_or(Duration::from_secs(30));
        let listen =
            match value("--listen") {
                Some(("off", _)) => None,
                Some((addr, from)) => Some(addr.parse().map_err(|_| {
                    invalid(from, addr, "an address and port (0.0.0.0:8080) or off")
                })?),
                None => Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
            };
        let arbiters = number(value, "--arbiters", "a whole number of at least 1")?;
        if arbiters == Some(0) {
            let (given, from) = value("--arbiters").unwrap_or_default();
            return Err(invalid(from, given, "a whole number of at least 1"));
        }
        Ok(Self {
            connect,
            worker,
            name,
            drain_deadline,
            listen,
            arbiters,
        })
    }

    /// The settings, one a line, for `--help`.
    pub fn usage(program: &str) -> String {
        let mut out = format!(
            "{program}: a switchboard worker\n\nEvery setting is a flag or an environment variable (the flag wins):\n\n"
        );
        for s in SETTINGS {
            let flag = if s.value.is_empty() {
                s.flag.to_owned()
            } else {
                format!("{} {}", s.flag, s.value)
            };
            out.push_str(&format!("  {flag:<28} {:<18} {}\n", s.env, s.help));
        }
        out.push_str(
            "\nOn SIGTERM or SIGINT it drains: stops taking sessions, lets the live ones settle, \
             hands them to other workers and exits 0.\n",
        );
        out
    }
}

fn invalid(setting: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::Invalid {
        setting,
        value: value.to_owned(),
        expected,
    }
}

/// A switch: given without a value on the command line, or `true`/`false` (`1`/`0`) in its
/// variable.
fn switch<'a>(
    value: &impl Fn(&str) -> Option<(&'a str, &'static str)>,
    flag: &str,
) -> Result<bool, ConfigError> {
    match value(flag) {
        None => Ok(false),
        Some(("true" | "1" | "yes", _)) => Ok(true),
        Some(("false" | "0" | "no" | "", _)) => Ok(false),
        Some((other, from)) => Err(invalid(from, other, "true or false")),
    }
}

fn number<'a>(
    value: &impl Fn(&str) -> Option<(&'a str, &'static str)>,
    flag: &str,
    expected: &'static str,
) -> Result<Option<usize>, ConfigError> {
    value(flag)
        .map(|(given, from)| given.parse().map_err(|_| invalid(from, given, expected)))
        .transpose()
}

fn seconds<'a>(
    value: &impl Fn(&str) -> Option<(&'a str, &'static str)>,
    flag: &str,
) -> Result<Option<Duration>, ConfigError> {
    value(flag)
        .map(|(given, from)| {
            given
                .parse::<f64>()
                .ok()
                .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
                .ok_or_else(|| invalid(from, given, "a number of seconds"))
        })
        .transpose()
}

/// The host's name as a worker name (`HOSTNAME`, as a container runtime sets it, or the
/// kernel's), its dots and other characters a subject token cannot hold turned into `-`.
fn host_name(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let raw = env("HOSTNAME").or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
    })?;
    let name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    check_worker_name(&name).ok().map(|()| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<WorkerConfig, ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        match WorkerConfig::parse(args.iter().map(|s| (*s).to_owned()), |name| {
            env.get(name).cloned()
        })? {
            Command::Run(config) => Ok(*config),
            Command::Help => panic!("help"),
        }
    }

    #[test]
    fn defaults_need_only_a_name() {
        let config = parse(&[], &[("SB_WORKER_NAME", "w1")]).unwrap();
        assert_eq!(config.name, "w1");
        assert_eq!(config.drain_deadline, Duration::from_secs(30));
        assert_eq!(config.listen, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(config.arbiters, None);
        assert_eq!(config.worker.capacity, 100);
        assert_eq!(config.worker.name, "w1");
    }

    #[test]
    fn a_flag_wins_over_its_variable() {
        let config = parse(
            &["--capacity", "7", "--name=w2", "--listen", "127.0.0.1:0"],
            &[
                ("SB_CAPACITY", "3"),
                ("SB_WORKER_NAME", "w1"),
                ("SB_DRAIN_SECS", "2.5"),
                ("SB_IDLE_SECS", "0"),
                ("SB_NAMESPACE", "acme.sb"),
            ],
        )
        .unwrap();
        assert_eq!(config.name, "w2");
        assert_eq!(config.drain_deadline, Duration::from_millis(2500));
        assert_eq!(config.listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.worker.capacity, 7);
        assert_eq!(config.worker.idle_timeout, None);
        assert_eq!(config.worker.namespace.prefix(), "acme.sb");
    }

    #[test]
    fn secrets_come_from_variables_and_are_never_shown() {
        let config = parse(
            &["--name", "w1", "--nats-user", "worker"],
            &[("SB_NATS_PASSWORD", "hunter2")],
        )
        .unwrap();
        let debug = format!("{config:?}");
        assert!(debug.contains("user \"worker\" with a password"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    #[test]
    fn bad_values_are_refused_naming_where_they_came_from() {
        let refused = |args: &[&str], env: &[(&str, &str)]| parse(args, env).unwrap_err();
        assert_eq!(
            refused(&["--name", "w1"], &[("SB_CAPACITY", "many")]),
            ConfigError::Invalid {
                setting: "SB_CAPACITY",
                value: "many".into(),
                expected: "a whole number of at least 1"
            }
        );
        assert!(matches!(
            refused(&["--name", "w1", "--capacity", "0"], &[]),
            ConfigError::Invalid {
                setting: "--capacity",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "a.b"], &[]),
            ConfigError::Invalid {
                setting: "--name",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--inbox-prefix", "_INBOX.>"], &[]),
            ConfigError::Invalid {
                setting: "--inbox-prefix",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--lease-secs", "0.5"], &[]),
            ConfigError::Invalid {
                setting: "--lease-secs",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--replicas", "7"], &[]),
            ConfigError::Invalid {
                setting: "--replicas",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--listen", "everywhere"], &[]),
            ConfigError::Invalid {
                setting: "--listen",
                ..
            }
        ));
        assert!(matches!(
            refused(&["--name", "w1"], &[("SB_TLS_REQUIRED", "maybe")]),
            ConfigError::Invalid {
                setting: "SB_TLS_REQUIRED",
                ..
            }
        ));
        assert_eq!(
            refused(&["--name", "w1", "--capacity"], &[]),
            ConfigError::MissingValue { flag: "--capacity" }
        );
        assert!(matches!(
            refused(&["--name", "w1", "--frobnicate"], &[]),
            ConfigError::Unknown { .. }
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--nats-user", "u"], &[]),
            ConfigError::Conflict(_)
        ));
        assert!(matches!(
            refused(
                &["--name", "w1", "--nats-token", "t"],
                &[("SB_NATS_NKEY", "S")]
            ),
            ConfigError::Conflict(_)
        ));
        assert!(matches!(
            refused(&["--name", "w1", "--tls-cert", "c.pem"], &[]),
            ConfigError::Conflict(_)
        ));
    }

    #[test]
    fn the_host_name_is_the_default_name_made_a_token() {
        let config = parse(&[], &[("HOSTNAME", "worker-5f6d.prod.local")]).unwrap();
        assert_eq!(config.name, "worker-5f6d-prod-local");
    }

    #[test]
    fn help_is_a_command_and_lists_every_setting() {
        assert!(matches!(
            WorkerConfig::parse(["--help".to_owned()], |_| None),
            Ok(Command::Help)
        ));
        let usage = WorkerConfig::usage("worker");
        for s in SETTINGS {
            assert!(
                usage.contains(s.flag) && usage.contains(s.env),
                "{}",
                s.flag
            );
        }
    }

    /// The deploying page's table is this list, row for row.
    #[test]
    fn the_page_lists_every_setting_as_the_code_reads_it() {
        let page = include_str!("../../docs/deploying.md");
        for s in SETTINGS {
            let flag = if s.value.is_empty() {
                s.flag.to_owned()
            } else {
                format!("{} {}", s.flag, s.value)
            };
            let row = format!("| `{flag}` | `{}` | {} |", s.env, s.help);
            assert!(
                page.lines().any(|line| line == row),
                "the page lacks the row\n{row}"
            );
        }
        let rows = page.lines().filter(|l| l.starts_with("| `--")).count();
        assert_eq!(
            rows,
            SETTINGS.len(),
            "the page has settings the code does not read"
        );
    }

    #[test]
    fn switches_read_true_and_false() {
        let on = parse(&["--name", "w1", "--no-provision"], &[]).unwrap();
        assert!(!on.worker.provision);
        let off = parse(&["--name", "w1"], &[("SB_NO_PROVISION", "false")]).unwrap();
        assert!(off.worker.provision);
        let r3 = parse(&["--name", "w1"], &[("SB_REPLICAS", "3")]).unwrap();
        assert_eq!(r3.worker.replicas, 3);
        let listen_off = parse(&["--name", "w1", "--listen", "off"], &[]).unwrap();
        assert_eq!(listen_off.listen, None);
    }
}
