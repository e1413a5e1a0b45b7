//! `bloomgate`: the command line for the filter library and the SKU service.
#![forbid(unsafe_code)]

mod attack;
mod capture;
mod filters;
mod plot;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc, not glibc's malloc: on a Redis hit glibc's allocator took 15%
/// of the service's CPU (`perf` at dd9a6b2: `_int_malloc`, `_int_free`,
/// `malloc_consolidate`, as hyper's read buffers, the load and the Redis
/// client's buffers come and go on two threads); see BENCHMARKS.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "bloomgate",
    version,
    about = "A Bloom-filter shield against cache penetration"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the SKU service (SQLite and in-process cache by default).
    Serve {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Log lines as text (default) or as one JSON object per line.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Generate the deterministic SKU catalogue (ids 1..=COUNT) in SQL.
    Seed {
        /// Number of SKUs.
        #[arg(long, default_value_t = 200_000)]
        count: u64,
        /// Database URL (default: the configured one).
        #[arg(long)]
        database_url: Option<String>,
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show m, k, bytes and expected FPR for the classic and blocked layouts.
    Calc(filters::CalcArgs),
    /// Build a filter snapshot from keys (one per line) in a file or stdin.
    Build(filters::BuildArgs),
    /// Query a snapshot: prints `maybe` or `no` per key (keys from args or stdin).
    Query(filters::QueryArgs),
    /// Describe a snapshot.
    Info(filters::InfoArgs),
    /// Measure insert and query throughput and the actual FPR on this machine.
    Bench(filters::BenchArgs),
    /// Send random-id GETs to a running service and report what got through.
    Attack(Box<attack::AttackArgs>),
    /// Print, install or remove the change-capture triggers of the
    /// configured tables (`capture = "triggers"`).
    Capture(capture::CaptureArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { config, log_format } => serve(config, log_format),
        Command::Seed {
            count,
            database_url,
            config,
        } => seed(count, database_url, config),
        Command::Calc(a) => filters::calc(&a),
        Command::Build(a) => filters::build(&a),
        Command::Query(a) => filters::query(&a),
        Command::Info(a) => filters::info(&a),
        Command::Bench(a) => filters::bench(&a),
        Command::Attack(a) => runtime().and_then(|rt| rt.block_on(attack::attack(*a))),
        Command::Capture(a) => runtime().and_then(|rt| rt.block_on(capture::capture(a))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`bloomgate query … | head`) is not a failure.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("bloomgate: {}", said_once(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each said once: many errors
/// (ours and the drivers') already include their cause in their own
/// text, so a cause whose words are already there is not repeated.
fn said_once(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// How `serve` writes its log.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

fn serve(config: Option<PathBuf>, log_format: LogFormat) -> anyhow::Result<()> {
    init_logging(log_format);
    let config = bloomgate_service::Config::load(config.as_deref())?;
    runtime()?.block_on(async {
        // Installed before anything starts, so an early SIGTERM still
        // drains and exits 0.
        let shutdown = bloomgate_service::shutdown_signal();
        bloomgate_service::serve(config, shutdown).await
    })?;
    Ok(())
}

fn seed(count: u64, database_url: Option<String>, config: Option<PathBuf>) -> anyhow::Result<()> {
    if count == 0 || count > i64::MAX as u64 {
        anyhow::bail!("--count must be between 1 and {}", i64::MAX);
    }
    let mut config = bloomgate_service::Config::load(config.as_deref())?;
    if let Some(url) = database_url {
        config.database_url = url;
    }
    runtime()?.block_on(async {
        let store = bloomgate_service::sql::Database::connect(&config.database_url).await?;
        let bar = filters::progress_bar(count, "seeding");
        let started = std::time::Instant::now();
        let inserted = store.seed_range(1, count as i64, |n| bar.inc(n)).await?;
        bar.finish_and_clear();
        println!(
            "seeded {inserted} new SKUs (ids 1..={count}, {} already present) in {:.2}s",
            count - inserted.min(count),
            started.elapsed().as_secs_f64()
        );
        store.close().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect: {source}")]
    struct Outer {
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = anyhow::Error::new(Outer { source: io }).context("database_url");
        // anyhow's own chain says the io error twice.
        assert_eq!(
            format!("{e:#}"),
            "database_url: cannot connect: refused: refused"
        );
        assert_eq!(
            super::said_once(&e),
            "database_url: cannot connect: refused"
        );
        // A cause with words of its own is kept.
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::said_once(&plain), "outer: inner");
    }
}
