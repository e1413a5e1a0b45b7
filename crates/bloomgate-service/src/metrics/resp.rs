//! The Redis-protocol listener's series: commands, errors and latency by
//! resource and command, connections open and accepted, and connections
//! closed for a protocol error. Rendered only once the listener started.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

use super::latency::{write_series, LatencyHistogram};
use super::Counter;

/// The command label of each series; the last two are every other
/// command (`connection`: PING, HELLO, AUTH, … ; `other`: unknown).
pub const COMMANDS: [&str; 9] = [
    "bf.exists",
    "bf.mexists",
    "bf.add",
    "bf.madd",
    "bf.insert",
    "bf.card",
    "bf.info",
    "connection",
    "other",
];

/// The resource label of a command that names none.
pub const NO_RESOURCE: &str = "(none)";

#[derive(Debug, Default)]
struct Series {
    commands: OnceLock<Box<Counter>>,
    errors: OnceLock<Box<Counter>>,
    seconds: OnceLock<Box<LatencyHistogram>>,
}

/// The listener's counters.
#[derive(Debug, Default)]
pub struct RespMetrics {
    /// Resource names by slot; the slot past the last is [`NO_RESOURCE`].
    names: OnceLock<Box<[Box<str>]>>,
    series: OnceLock<Box<[Series]>>,
    open: AtomicI64,
    accepted: Counter,
    protocol_errors: Counter,
}

impl RespMetrics {
    /// Names the resource slots (once: the listener's start).
    pub fn init(&self, names: &[String]) {
        let names: Box<[Box<str>]> = names.iter().map(|n| n.as_str().into()).collect();
        let n = (names.len() + 1) * COMMANDS.len();
        let _ = self.series.set((0..n).map(|_| Series::default()).collect());
        let _ = self.names.set(names);
    }

    /// The slot of commands that name no resource.
    #[must_use]
    pub fn no_resource(&self) -> usize {
        self.names.get().map_or(0, |n| n.len())
    }

    /// Counts one command of resource slot `slot` (see
    /// [`RespMetrics::no_resource`]) and [`COMMANDS`] index `command`;
    /// `latency` for the BF commands, `error` when it answered an error.
    pub fn record(
        &self,
        slot: usize,
        command: usize,
        latency: Option<std::time::Duration>,
        error: bool,
    ) {
        let Some(s) = self
            .series
            .get()
            .and_then(|s| s.get(slot * COMMANDS.len() + command))
        else {
            return;
        };
        s.commands.get_or_init(Box::default).incr();
        if error {
            s.errors.get_or_init(Box::default).incr();
        }
        if let Some(l) = latency {
            s.seconds.get_or_init(Box::default).record(l);
        }
    }

    /// A connection opened.
    pub fn opened(&self) {
        self.accepted.incr();
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed.
    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection closed for a malformed frame or a limit.
    pub fn protocol_error(&self) {
        self.protocol_errors.incr();
    }

    /// Connections open now.
    #[must_use]
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    /// The families in the text format (nothing before the listener
    /// started).
    pub fn render(&self, out: &mut String) {
        let (Some(names), Some(series)) = (self.names.get(), self.series.get()) else {
            return;
        };
        let label = |i: usize| -> (&str, &str) {
            let slot = i / COMMANDS.len();
            let name = names.get(slot).map_or(NO_RESOURCE, |n| &**n);
            (name, COMMANDS[i % COMMANDS.len()])
        };
        for (family, help, pick) in [
            (
                "bloomgate_resp_commands_total",
                "RESP commands answered, by resource and command.",
                (|s: &Series| s.commands.get().map(|c| c.get())) as fn(&Series) -> Option<u64>,
            ),
            (
                "bloomgate_resp_errors_total",
                "RESP commands answered with an error, by resource and command.",
                |s: &Series| s.errors.get().map(|c| c.get()),
            ),
        ] {
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
            for (i, s) in series.iter().enumerate() {
                if let Some(n) = pick(s) {
                    let (r, c) = label(i);
                    let _ = writeln!(out, "{family}{{resource=\"{r}\",command=\"{c}\"}} {n}");
                }
            }
            out.push('\n');
        }
        let family = "bloomgate_resp_command_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {family} Latency of the RESP BF commands, by resource and command.\n# TYPE {family} histogram"
        );
        for (i, s) in series.iter().enumerate() {
            if let Some(h) = s.seconds.get() {
                let (r, c) = label(i);
                write_series(
                    out,
                    family,
                    &[("resource", r), ("command", c)],
                    &h.snapshot(),
                );
            }
        }
        out.push('\n');
        for (family, kind, help, value) in [
            (
                "bloomgate_resp_connections",
                "gauge",
                "RESP connections open.",
                self.open().max(0).unsigned_abs(),
            ),
            (
                "bloomgate_resp_connections_total",
                "counter",
                "RESP connections accepted.",
                self.accepted.get(),
            ),
            (
                "bloomgate_resp_protocol_errors_total",
                "counter",
                "RESP connections closed for a malformed frame or a limit.",
                self.protocol_errors.get(),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {family} {help}\n# TYPE {family} {kind}\n{family} {value}\n"
            );
        }
    }
}
