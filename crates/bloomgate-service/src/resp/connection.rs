//! What clients send on connect and around their commands: `PING`,
//! `ECHO`, `HELLO`, `AUTH`, `CLIENT`, `SELECT 0`, `COMMAND`, `INFO`,
//! `QUIT`, `RESET`, worded as Redis words them; the command table
//! (names, arity, flags) `COMMAND` reports and [`super::commands`]
//! checks arity against; and a connection's [`Session`].

use super::reply::{Out, Proto};
use super::Registry;

/// Redis's words for a command it does not know.
pub(super) fn unknown_command(args: &[&[u8]]) -> String {
    let clip = |b: &[u8], most: usize| {
        let t = String::from_utf8_lossy(&b[..b.len().min(most)]).into_owned();
        t.replace(['\r', '\n'], " ")
    };
    // As Redis: each argument clipped to what is left of 128 bytes, and
    // no more arguments once 128 are said.
    let mut said = String::new();
    for a in &args[1..] {
        if said.len() >= 128 {
            break;
        }
        said.push_str(&format!("'{}' ", clip(a, 128 - said.len())));
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {said}",
        clip(args[0], 128)
    )
}

/// One connection's state.
#[derive(Debug)]
pub struct Session {
    /// Its `CLIENT ID`.
    pub id: u64,
    /// `AUTH` succeeded (or no token is set).
    pub authed: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<Vec<u8>>,
    /// Close after the replies are written (`QUIT`, an HTTP request).
    pub close: bool,
    /// Close without a reply (a cross-protocol request: nothing is
    /// written back).
    pub silent: bool,
    /// Wrong `AUTH`s so far (the connection closes at
    /// [`MAX_FAILED_AUTHS`]).
    pub failed_auths: u32,
    /// The client's address (the rate limit's key).
    pub peer: std::net::IpAddr,
}

/// Wrong passwords a connection may send before it is closed.
pub const MAX_FAILED_AUTHS: u32 = 3;

impl Session {
    /// A new connection's state.
    #[must_use]
    pub fn new(id: u64, token: bool, peer: std::net::IpAddr) -> Self {
        Self {
            id,
            authed: !token,
            name: None,
            close: false,
            silent: false,
            failed_auths: 0,
            peer,
        }
    }
}

/// A command's name, arity (as `COMMAND` reports it: negative is "at
/// least"), flags, and whether it writes.
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) arity: i64,
    flags: &'static [&'static str],
    first_key: i64,
}

pub(super) const SPECS: &[Spec] = &[
    Spec {
        name: "bf.exists",
        arity: 3,
        flags: &["readonly", "fast"],
        first_key: 1,
    },
    Spec {
        name: "bf.mexists",
        arity: -3,
        flags: &["readonly", "fast"],
        first_key: 1,
    },
    Spec {
        name: "bf.add",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        first_key: 1,
    },
    Spec {
        name: "bf.madd",
        arity: -3,
        flags: &["write", "denyoom"],
        first_key: 1,
    },
    Spec {
        name: "bf.insert",
        arity: -4,
        flags: &["write", "denyoom"],
        first_key: 1,
    },
    Spec {
        name: "bf.card",
        arity: 2,
        flags: &["readonly", "fast"],
        first_key: 1,
    },
    Spec {
        name: "bf.info",
        arity: -2,
        flags: &["readonly", "fast"],
        first_key: 1,
    },
    Spec {
        name: "bf.reserve",
        arity: -4,
        flags: &["write", "denyoom"],
        first_key: 1,
    },
    Spec {
        name: "bf.scandump",
        arity: 3,
        flags: &["readonly"],
        first_key: 1,
    },
    Spec {
        name: "bf.loadchunk",
        arity: 4,
        flags: &["write", "denyoom"],
        first_key: 1,
    },
    Spec {
        name: "ping",
        arity: -1,
        flags: &["fast", "stale"],
        first_key: 0,
    },
    Spec {
        name: "echo",
        arity: 2,
        flags: &["fast"],
        first_key: 0,
    },
    Spec {
        name: "hello",
        arity: -1,
        flags: &["noscript", "loading", "stale", "fast", "no_auth"],
        first_key: 0,
    },
    Spec {
        name: "auth",
        arity: -2,
        flags: &["noscript", "loading", "stale", "fast", "no_auth"],
        first_key: 0,
    },
    Spec {
        name: "client",
        arity: -2,
        flags: &["loading", "stale"],
        first_key: 0,
    },
    Spec {
        name: "select",
        arity: 2,
        flags: &["loading", "stale", "fast"],
        first_key: 0,
    },
    Spec {
        name: "command",
        arity: -1,
        flags: &["loading", "stale"],
        first_key: 0,
    },
    Spec {
        name: "info",
        arity: -1,
        flags: &["loading", "stale"],
        first_key: 0,
    },
    Spec {
        name: "quit",
        arity: -1,
        flags: &["loading", "stale", "fast", "no_auth"],
        first_key: 0,
    },
    Spec {
        name: "reset",
        arity: 1,
        flags: &["loading", "stale", "fast", "no_auth"],
        first_key: 0,
    },
];

/// The version `HELLO` and `INFO` report: the Redis command level
/// answered (clients gate features on it), beside bloomgate's own.
pub const REDIS_VERSION: &str = "7.0.0";

/// The connection commands.
pub(super) fn answer(reg: &Registry, s: &mut Session, out: &mut Out, name: &str, args: &[&[u8]]) {
    match name {
        "ping" => match args.get(1) {
            Some(msg) if args.len() == 2 => out.bulk(msg),
            Some(_) => out.error("ERR wrong number of arguments for 'ping' command"),
            None => out.simple("PONG"),
        },
        "echo" => out.bulk(args[1]),
        "auth" => {
            if let Err(e) = auth(reg, s, &args[1..]) {
                return out.error(e);
            }
            out.ok();
        }
        "hello" => hello(reg, s, out, args),
        "client" => client(s, out, args),
        "select" => match args[1] {
            b"0" => out.ok(),
            _ => out.error("ERR DB index is out of range"),
        },
        "command" => command_reply(out, args),
        "info" => out.verbatim(&info_text(reg)),
        "quit" => {
            out.ok();
            s.close = true;
        }
        "reset" => {
            out.proto = Proto::Two;
            s.authed = reg.token.is_none();
            s.name = None;
            out.simple("RESET");
        }
        "bf.reserve" => out.error("ERR BF.RESERVE is not supported: bloomgate's filters are defined by its configuration ([[resources]]) and built from their tables"),
        "bf.scandump" | "bf.loadchunk" => out.error(&format!(
            "ERR {} is not supported: bloomgate's filter format is its own, and every instance builds or adopts its filter from the database",
            name.to_ascii_uppercase()
        )),
        _ => out.error(&unknown_command(args)),
    }
}

/// `AUTH [user] password`: the user is `default`, the password the admin
/// token.
fn auth(reg: &Registry, s: &mut Session, args: &[&[u8]]) -> Result<(), &'static str> {
    let (user, password) = match args {
        [p] => (None, *p),
        [u, p] => (Some(*u), *p),
        _ => return Err("ERR syntax error"),
    };
    let Some(token) = &reg.token else {
        // As Redis's passwordless default user: the legacy one-argument
        // form is an error, `default` with any password logs in.
        return match user {
            None => Err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"),
            Some(b"default") => Ok(()),
            Some(_) => Err("WRONGPASS invalid username-password pair or user is disabled."),
        };
    };
    use subtle::ConstantTimeEq;
    if user.is_none_or(|u| u == b"default") && bool::from(password.ct_eq(token.as_bytes())) {
        s.authed = true;
        return Ok(());
    }
    s.failed_auths += 1;
    if s.failed_auths == 1 {
        tracing::warn!(id = s.id, "RESP: AUTH with a wrong user or password");
    }
    // Guesses cost a connection each few tries.
    if s.failed_auths >= MAX_FAILED_AUTHS {
        s.close = true;
    }
    Err("WRONGPASS invalid username-password pair or user is disabled.")
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
fn hello(reg: &Registry, s: &mut Session, out: &mut Out, args: &[&[u8]]) {
    let mut proto = out.proto;
    if let Some(v) = args.get(1) {
        proto = match *v {
            b"2" => Proto::Two,
            b"3" => Proto::Three,
            _ if std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
                .is_none() =>
            {
                return out.error("ERR Protocol version is not an integer or out of range")
            }
            _ => return out.error("NOPROTO unsupported protocol version"),
        };
    }
    let mut i = 2;
    let mut name = None;
    while i < args.len() {
        let word = args[i].to_ascii_uppercase();
        match word.as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                if let Err(e) = auth(reg, s, &args[i + 1..i + 3]) {
                    return out.error(e);
                }
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                name = Some(args[i + 1].to_vec());
                i += 2;
            }
            _ => {
                return out.error(&format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[i][..args[i].len().min(64)])
                ))
            }
        }
    }
    if name.is_some() {
        s.name = name;
    }
    out.proto = proto;
    out.map(7);
    out.bulk(b"server");
    out.bulk(b"bloomgate");
    out.bulk(b"version");
    out.bulk(REDIS_VERSION.as_bytes());
    out.bulk(b"proto");
    out.int(if proto == Proto::Three { 3 } else { 2 });
    out.bulk(b"id");
    out.int(s.id as i64);
    out.bulk(b"mode");
    out.bulk(b"standalone");
    out.bulk(b"role");
    out.bulk(b"master");
    out.bulk(b"modules");
    out.array(0);
}

/// `CLIENT SETNAME|GETNAME|SETINFO|ID`.
fn client(s: &mut Session, out: &mut Out, args: &[&[u8]]) {
    let sub = args[1].to_ascii_uppercase();
    match (sub.as_slice(), args.len()) {
        (b"SETNAME", 3) => {
            if args[2].iter().any(|&b| b <= b' ' || b > b'~') {
                return out.error(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            s.name = (!args[2].is_empty()).then(|| args[2].to_vec());
            out.ok();
        }
        (b"GETNAME", 2) => match &s.name {
            Some(n) => out.bulk(n),
            None => out.null(),
        },
        (b"SETINFO", 4) => out.ok(),
        (b"ID", 2) => out.int(s.id as i64),
        _ => out.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[1][..args[1].len().min(64)])
        )),
    }
}

/// `COMMAND` entries: `[name, arity, flags, first key, last key, step,
/// categories, tips, key specs, subcommands]`, as Redis 7 answers.
fn command_entries(out: &mut Out, names: Option<&[&[u8]]>) {
    let specs: Vec<Option<&Spec>> = match names {
        None => SPECS.iter().map(Some).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                SPECS
                    .iter()
                    .find(|s| s.name.as_bytes().eq_ignore_ascii_case(n))
            })
            .collect(),
    };
    out.array(specs.len());
    for spec in specs {
        let Some(spec) = spec else {
            out.null();
            continue;
        };
        out.array(10);
        out.bulk(spec.name.as_bytes());
        out.int(spec.arity);
        out.set(spec.flags.len());
        for f in spec.flags {
            out.simple(f);
        }
        out.int(spec.first_key);
        out.int(spec.first_key);
        out.int(spec.first_key);
        out.set(0);
        out.array(0);
        out.array(0);
        out.array(0);
    }
}

/// How many commands `COMMAND COUNT` reports.
fn command_count() -> usize {
    SPECS.len()
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name…`, `COMMAND DOCS`
/// (empty: clients fall back to their own hints), `COMMAND LIST`.
fn command_reply(out: &mut Out, args: &[&[u8]]) {
    let Some(sub) = args.get(1) else {
        return command_entries(out, None);
    };
    match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" => out.int(command_count() as i64),
        b"INFO" => command_entries(out, Some(&args[2..])),
        b"DOCS" => out.map(0),
        _ => out.error(&format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&sub[..sub.len().min(64)])
        )),
    }
}

/// `INFO`'s text: the server, the clients, and each filter.
fn info_text(reg: &Registry) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = write!(
        t,
        "# Server\r\nredis_version:{}\r\nbloomgate_version:{}\r\nredis_mode:standalone\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n\r\n# Clients\r\nconnected_clients:{}\r\n\r\n# Keyspace\r\n\r\n# Bloomgate\r\n",
        REDIS_VERSION,
        env!("CARGO_PKG_VERSION"),
        reg.port,
        reg.started.elapsed().as_secs(),
        reg.metrics.resp.open(),
    );
    for target in &reg.targets {
        let (ready, items) = match &target.filter {
            super::Filter::Skus(r) => (r.shield().is_ready(), r.shield().stats().added),
            super::Filter::Table(r) => (r.shield().is_ready(), r.shield().stats().added),
        };
        let _ = write!(
            t,
            "filter_{}:ready={},items={items}\r\n",
            target.name(),
            u8::from(ready)
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_commands_are_worded_as_redis_words_them() {
        assert_eq!(
            unknown_command(&[b"FOO", b"a", b"b\r\n"]),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b  ' "
        );
        // At most 128 bytes of arguments, however many there are.
        let long = [b'x'; 100];
        let many: Vec<&[u8]> = std::iter::once(&b"FOO"[..])
            .chain(std::iter::repeat_n(&long[..], 4096))
            .collect();
        let m = unknown_command(&many);
        let said = m.split_once("beginning with: ").unwrap().1;
        assert!(said.len() <= 128 + 4, "{} bytes", said.len());
    }
}
