//! The HTTP gate's anchor in `scripts/gate_bench.py`: the least a Rust
//! reverse proxy on the crates the gate is built on can do. hyper's
//! HTTP/1 server, hyper-util's pooled client, and nothing else: no route,
//! no filter, no header rewriting, no smuggling scan, no idle timer. What
//! the gate costs beyond it is the gate's own; what it costs against
//! nginx is mostly this.
//!
//! Two shapes: by default one multi-threaded Tokio runtime (the
//! service's); with `THREADS=n`, `n` threads each running a
//! single-threaded runtime with its own accept loop on the one listening
//! socket and its own client pool, so a request and its upstream
//! connection are driven on one thread (nginx's worker model).
//!
//! `cargo run --release -p bloomgate-service --example bare_proxy -- 127.0.0.1:18108 http://127.0.0.1:18101`

use std::convert::Infallible;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18108".into());
    let upstream = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:18101".into());
    let listener = std::net::TcpListener::bind(&listen)?;
    listener.set_nonblocking(true)?;
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    if threads == 0 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return rt.block_on(serve(listener, upstream));
    }
    let mut handles = Vec::with_capacity(threads);
    for _ in 0..threads {
        let (listener, upstream) = (listener.try_clone()?, upstream.clone());
        handles.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(serve(listener, upstream))
                .map_err(|e| e.to_string())
        }));
    }
    for h in handles {
        h.join().map_err(|_| "a thread panicked")??;
    }
    Ok(())
}

/// Accepts on `listener` and forwards to `upstream`, on the runtime it
/// runs on (its client's connections too).
async fn serve(
    listener: std::net::TcpListener,
    upstream: String,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Another thread took it, or the system is short of sockets.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move {
                    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                    *req.uri_mut() = format!("{upstream}{target}").parse().unwrap();
                    let resp: Response<Incoming> = match client.request(req).await {
                        Ok(r) => r,
                        Err(_) => {
                            let mut r = Response::new(http_body_util::Empty::new());
                            *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                            return Ok::<_, Infallible>(r.map(http_body_util::Either::Left));
                        }
                    };
                    Ok(resp.map(http_body_util::Either::Right))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
